"""``gateway.toml`` → frozen dataclasses, checked before anything starts.

Every bad value is a :class:`ConfigurationError` that names the file and the key (unknown keys
too, with the closest known key when there is one). Secrets are never in the file: a key ending
in ``_env`` names the environment variable that holds them, and :meth:`GatewayConfig.secret`
reads it (``api_key_env = ""``: the model server needs no key). A token written into the file
itself is refused without repeating it. Relative file paths (``db``, ``system_prompt_file``,
``schema_file``) are relative to the config file.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from oncewire.core.errors import ConfigurationError
from oncewire.gateway.ratelimit import TELEGRAM_DEFAULTS
from oncewire.replies.service import HISTORY_LIMIT

__all__ = [
    "GatewayConfig",
    "LeasesConfig",
    "ModelConfig",
    "PlatformConfig",
    "StoreConfig",
    "ToolConfig",
    "TurnsConfig",
    "WebhooksConfig",
    "load_config",
    "parse_config",
]

BUSY_MODES = ("interrupt", "queue", "steer", "reject")
BUSY_MODES_NOT_YET = ("steer", "reject")  # named by the design, refused until they exist
PLATFORM_KINDS = ("telegram", "discord", "webhook")
INBOUND_MODES = ("polling", "webhook")
SIDE_EFFECTS = ("read_only", "workspace_write", "external", "unknown")
RESUME_NOTE = (
    "Note: your previous turn was interrupted by a restart before it finished. "
    "Answer the last message."
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SINK = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*\Z")
# Keys that would hold a secret itself; the file must name an environment variable instead.
_LITERAL_SECRETS = {
    "api_key": "api_key_env",
    "token": "token_env",
    "secret": "secret_env",
    "password": "an environment variable",
}


@dataclass(frozen=True)
class StoreConfig:
    db: str  # a SQLite file path (resolved) or a postgresql:// URL


@dataclass(frozen=True)
class ModelConfig:
    base_url: str
    api_key_env: str | None
    model: str
    connect_timeout_seconds: float
    read_timeout_seconds: float
    max_retries: int
    system_prompt_file: Path | None


@dataclass(frozen=True)
class TurnsConfig:
    busy_mode: str  # one of BUSY_MODES
    max_concurrent: int
    max_steps: int
    max_starts: int  # then the message is quarantined
    resume_note: str
    # The chat history the model sees before the message: at most this many earlier messages
    # of the session (with their answers), the oldest left out first past history_chars.
    history_messages: int = 20
    history_chars: int = 24_000


@dataclass(frozen=True)
class LeasesConfig:
    """How long a gateway process holds what it serves without renewing it. Each lease is
    renewed every third of its length; another process takes it over once it ran out."""

    bot_seconds: float = 30.0  # a bot's lease (polling and serving it)
    turn_seconds: float = 60.0  # a running turn's lease


@dataclass(frozen=True)
class PlatformConfig:
    name: str
    kind: str  # one of PLATFORM_KINDS
    streaming: bool
    token_env: str | None = None  # telegram, discord
    api_base: str | None = None  # telegram, discord
    inbound: str | None = None  # telegram: polling | webhook
    # telegram: the environment variable holding the webhook's secret token (webhook mode)
    webhook_secret_env: str | None = None
    edit_interval_seconds: float = 1.0
    # How long a reply's wire operation waits for the platform's answer before it is a timeout
    # (maybe delivered: an edit is replayed, a send resent marked).
    read_timeout_seconds: float = 10.0
    allowed_users: tuple[int, ...] = ()
    send_url: str | None = None  # webhook
    secret_env: str | None = None  # webhook
    # telegram: the local rate limiter (oncewire.gateway.ratelimit), per bot and per chat
    rate_per_second: float = TELEGRAM_DEFAULTS.rate_per_second
    burst: int = TELEGRAM_DEFAULTS.burst
    chat_rate_per_second: float = TELEGRAM_DEFAULTS.chat_rate_per_second
    chat_burst: int = TELEGRAM_DEFAULTS.chat_burst


@dataclass(frozen=True)
class ToolConfig:
    name: str
    sink: str  # module:callable
    schema_file: Path | None
    side_effect: str  # one of SIDE_EFFECTS
    timeout_seconds: float  # one attempt of the tool's sink
    max_attempts: int = 3  # attempts that may have run the sink, then the call is dead


@dataclass(frozen=True)
class WebhooksConfig:
    host: str
    port: int


@dataclass(frozen=True)
class GatewayConfig:
    path: Path
    store: StoreConfig
    model: ModelConfig
    turns: TurnsConfig
    platforms: tuple[PlatformConfig, ...]
    tools: tuple[ToolConfig, ...]
    webhooks: WebhooksConfig
    leases: LeasesConfig = LeasesConfig()

    def secret(self, env_name: str, environ: Mapping[str, str] | None = None) -> str:
        """The value of the environment variable ``env_name`` (named by a ``*_env`` key)."""
        value = (os.environ if environ is None else environ).get(env_name)
        if not value:
            raise ConfigurationError(
                f"{self.path}: the environment variable {env_name} is not set", key=env_name
            )
        return value


def load_config(path: str | Path) -> GatewayConfig:
    """Read and check a ``gateway.toml``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return parse_config(text, path)


def parse_config(text: str, path: str | Path) -> GatewayConfig:
    """Check a config's text; ``path`` names it in errors and anchors its relative paths."""
    path = Path(path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{path}: not valid TOML: {exc}", file=str(path)) from exc
    top = _Table(raw, path, "")
    top.only("store", "model", "turns", "platforms", "tools", "webhooks", "leases")
    store = top.table("store")
    model = top.table("model")
    turns = top.table("turns")
    webhooks = top.table("webhooks")
    leases = top.table("leases")
    platforms = tuple(_platform(t) for t in top.tables("platforms"))
    tools = tuple(_tool(t) for t in top.tables("tools"))
    if not platforms:
        raise top.error("platforms", "at least one [[platforms]] is needed")
    for kind, items in (("platforms", platforms), ("tools", tools)):
        names = [item.name for item in items]
        for name in {n for n in names if names.count(n) > 1}:
            raise top.error(kind, f"the name {name!r} is used twice")
    store.only("db")
    model.only(
        "base_url",
        "api_key_env",
        "model",
        "connect_timeout",
        "read_timeout",
        "max_retries",
        "system_prompt_file",
    )
    turns.only(
        "busy_mode",
        "max_concurrent",
        "max_steps",
        "max_starts",
        "resume_note",
        "history_messages",
        "history_chars",
    )
    webhooks.only("bind")
    leases.only("bot_lease_seconds", "turn_lease_seconds")
    host, port = _bind(webhooks)
    return GatewayConfig(
        path=path,
        store=StoreConfig(db=_db(store)),
        model=ModelConfig(
            base_url=model.url("base_url", "https://api.openai.com/v1"),
            api_key_env=model.env("api_key_env", "OPENAI_API_KEY", empty_means_none=True),
            model=model.text("model", "gpt-4.1-mini"),
            connect_timeout_seconds=model.seconds("connect_timeout", 5.0),
            read_timeout_seconds=model.seconds("read_timeout", 120.0),
            max_retries=model.integer("max_retries", 2, minimum=0),
            system_prompt_file=model.file("system_prompt_file"),
        ),
        turns=TurnsConfig(
            busy_mode=_busy_mode(turns),
            max_concurrent=turns.integer("max_concurrent", 8, minimum=1),
            max_steps=turns.integer("max_steps", 16, minimum=1),
            max_starts=turns.integer("max_starts", 3, minimum=1),
            resume_note=turns.text("resume_note", RESUME_NOTE),
            history_messages=_history_messages(turns),
            history_chars=turns.integer("history_chars", 24_000, minimum=0),
        ),
        platforms=platforms,
        tools=tools,
        webhooks=WebhooksConfig(host, port),
        leases=LeasesConfig(
            bot_seconds=leases.seconds("bot_lease_seconds", 30.0),
            turn_seconds=leases.seconds("turn_lease_seconds", 60.0),
        ),
    )


_CHAT_KEYS = (
    "name",
    "kind",
    "token_env",
    "api_base",
    "streaming",
    "edit_interval_seconds",
    "read_timeout_seconds",
    "allowed_users",
)

# Telegram's local rate limiter: tokens per second and bucket sizes, per bot and per chat.
_RATE_KEYS = ("rate_per_second", "burst", "chat_rate_per_second", "chat_burst")


def _platform(t: _Table) -> PlatformConfig:
    name = t.text("name")
    kind = t.choice("kind", PLATFORM_KINDS)
    if kind == "telegram":
        t.only(*_CHAT_KEYS, *_RATE_KEYS, "inbound", "webhook_secret_env")
        inbound = t.choice("inbound", INBOUND_MODES, "polling")
        return PlatformConfig(
            name=name,
            kind=kind,
            token_env=t.env("token_env", "TELEGRAM_BOT_TOKEN"),
            api_base=t.url("api_base", "https://api.telegram.org"),
            inbound=inbound,
            # Webhook mode is never unauthenticated: without the key, a default variable.
            webhook_secret_env=t.env(
                "webhook_secret_env",
                "TELEGRAM_WEBHOOK_SECRET" if inbound == "webhook" else None,
            ),
            streaming=t.boolean("streaming", True),
            edit_interval_seconds=t.seconds("edit_interval_seconds", 1.0),
            read_timeout_seconds=t.seconds("read_timeout_seconds", 10.0),
            allowed_users=t.user_ids("allowed_users"),
            rate_per_second=t.rate("rate_per_second", TELEGRAM_DEFAULTS.rate_per_second),
            burst=t.integer("burst", TELEGRAM_DEFAULTS.burst, minimum=1),
            chat_rate_per_second=t.rate(
                "chat_rate_per_second", TELEGRAM_DEFAULTS.chat_rate_per_second
            ),
            chat_burst=t.integer("chat_burst", TELEGRAM_DEFAULTS.chat_burst, minimum=1),
        )
    if kind == "discord":
        t.only(*_CHAT_KEYS)
        return PlatformConfig(
            name=name,
            kind=kind,
            token_env=t.env("token_env", "DISCORD_BOT_TOKEN"),
            api_base=t.url("api_base", "https://discord.com/api/v10"),
            streaming=t.boolean("streaming", True),
            edit_interval_seconds=t.seconds("edit_interval_seconds", 1.0),
            read_timeout_seconds=t.seconds("read_timeout_seconds", 10.0),
            allowed_users=t.user_ids("allowed_users"),
        )
    t.only("name", "kind", "send_url", "secret_env", "streaming", "read_timeout_seconds")
    if t.boolean("streaming", False):
        raise t.error("streaming", "a webhook platform cannot edit messages, so cannot stream")
    return PlatformConfig(
        name=name,
        kind=kind,
        streaming=False,
        send_url=t.url("send_url"),
        secret_env=t.env("secret_env", None),
        read_timeout_seconds=t.seconds("read_timeout_seconds", 10.0),
    )


def _tool(t: _Table) -> ToolConfig:
    t.only("name", "sink", "schema_file", "side_effect", "timeout_seconds", "max_attempts")
    sink = t.text("sink")
    if not _SINK.match(sink):
        raise t.error(
            "sink", f"must be module:callable (like myapp.tools:create_ticket), got {sink!r}"
        )
    return ToolConfig(
        name=t.text("name"),
        sink=sink,
        schema_file=t.file("schema_file"),
        side_effect=t.choice("side_effect", SIDE_EFFECTS, "unknown"),
        timeout_seconds=t.seconds("timeout_seconds", 30.0),
        max_attempts=t.integer("max_attempts", 3, minimum=1),
    )


def _history_messages(turns: _Table) -> int:
    """``[turns] history_messages``: 0 (the message alone) to HISTORY_LIMIT."""
    count = turns.integer("history_messages", 20, minimum=0)
    if count > HISTORY_LIMIT:
        raise turns.error("history_messages", f"{count} is more than {HISTORY_LIMIT}")
    return count


def _busy_mode(turns: _Table) -> str:
    """``[turns] busy_mode``: interrupt (the default) or queue; steer and reject are refused
    with a clear word rather than run as something else."""
    mode = turns.choice("busy_mode", BUSY_MODES, "interrupt")
    if mode in BUSY_MODES_NOT_YET:
        raise turns.error(
            "busy_mode", f"{mode!r} is not supported yet (supported: interrupt, queue)"
        )
    return mode


def _db(store: _Table) -> str:
    db = store.text("db", "gateway.db")
    if "://" in db:
        if not db.startswith(("postgresql://", "postgres://")):
            raise store.error(
                "db", f"must be a SQLite file path or a postgresql:// URL, got {db!r}"
            )
        return db
    return str(store.relative(db))


def _bind(webhooks: _Table) -> tuple[str, int]:
    bind = webhooks.text("bind", "127.0.0.1:8443")
    host, _, port = bind.rpartition(":")
    # Port 0 asks for any free port: `gateway run` prints the one bound on its ready line.
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise webhooks.error("bind", f"must be HOST:PORT with a port 0-65535, got {bind!r}")
    return host.strip("[]"), int(port)


T = TypeVar("T")
_MISSING: Any = object()


class _Table:
    """One TOML table with its place in the file, for error messages."""

    def __init__(self, raw: Mapping[str, Any], path: Path, where: str) -> None:
        self.raw = raw
        self.path = path
        self.where = where

    def error(self, key: str, problem: str) -> ConfigurationError:
        name = f"{self.where} {key}" if self.where else key
        return ConfigurationError(f"{self.path}: {name}: {problem}", file=str(self.path), key=key)

    def only(self, *known: str) -> None:
        for key in self.raw:
            if key in known:
                continue
            if key in _LITERAL_SECRETS:
                raise self.error(
                    key,
                    "secrets are never written in the config file; put it in an environment "
                    f"variable and name that variable with {_LITERAL_SECRETS[key]}",
                )
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
            raise self.error(key, f"unknown key{hint}")

    def table(self, key: str) -> _Table:
        value = self.raw.get(key, {})
        if not isinstance(value, dict):
            raise self.error(key, f"must be a table [{key}]")
        return _Table(value, self.path, f"[{key}]")

    def tables(self, key: str) -> list[_Table]:
        value = self.raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.error(key, f"must be an array of tables [[{key}]]")
        return [_Table(v, self.path, f"[[{key}]] #{i + 1}") for i, v in enumerate(value)]

    def _get(self, key: str, default: T, check: Callable[[Any], bool], wanted: str) -> Any:
        value = self.raw.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise self.error(key, "is required")
            return default
        if not check(value):
            raise self.error(key, f"must be {wanted}, got {value!r}")
        return value

    def text(self, key: str, default: Any = _MISSING) -> str:
        value: str = self._get(
            key, default, lambda v: isinstance(v, str) and v != "", "a non-empty string"
        )
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value: bool = self._get(key, default, lambda v: isinstance(v, bool), "true or false")
        return value

    def integer(self, key: str, default: int, *, minimum: int) -> int:
        value: int = self._get(
            key,
            default,
            lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum,
            f"an integer >= {minimum}",
        )
        return value

    def seconds(self, key: str, default: float) -> float:
        value = self._get(
            key,
            default,
            lambda v: (
                isinstance(v, int | float)
                and not isinstance(v, bool)
                and math.isfinite(v)
                and v > 0
            ),
            "a number of seconds > 0",
        )
        return float(value)

    def rate(self, key: str, default: float) -> float:
        value = self._get(
            key,
            default,
            lambda v: (
                isinstance(v, int | float)
                and not isinstance(v, bool)
                and math.isfinite(v)
                and v > 0
            ),
            "a number per second > 0",
        )
        return float(value)

    def choice(self, key: str, choices: tuple[str, ...], default: Any = _MISSING) -> str:
        value: str = self._get(key, default, lambda v: v in choices, f"one of {', '.join(choices)}")
        return value

    def url(self, key: str, default: Any = _MISSING) -> str:
        value: str = self._get(
            key,
            default,
            lambda v: isinstance(v, str) and v.startswith(("http://", "https://")),
            "an http:// or https:// URL",
        )
        return value

    def env(self, key: str, default: str | None, *, empty_means_none: bool = False) -> str | None:
        value = self.raw.get(key, _MISSING)
        if value is _MISSING:
            return default
        if value == "" and empty_means_none:
            return None  # a local model server that needs no key
        if not isinstance(value, str) or not _ENV_NAME.match(value):
            # Never echo the value: it may be the very secret that belongs in the environment.
            raise self.error(
                key,
                "must name an environment variable (letters, digits, _), not hold the secret "
                "itself; put the secret in that variable",
            )
        return value

    def file(self, key: str) -> Path | None:
        value = self._get(key, None, lambda v: isinstance(v, str) and v != "", "a file path")
        return None if value is None else self.relative(value)

    def relative(self, value: str) -> Path:
        return self.path.parent / value

    def user_ids(self, key: str) -> tuple[int, ...]:
        """User ids as integers, or as strings of digits (Discord's snowflakes are written as
        strings, being too large for JSON's numbers)."""
        value = self._get(
            key,
            [],
            lambda v: (
                isinstance(v, list)
                and all(
                    (isinstance(i, int) and not isinstance(i, bool))
                    or (isinstance(i, str) and i.isascii() and i.isdigit())
                    for i in v
                )
            ),
            "a list of numeric user ids (integers, or strings of digits)",
        )
        return tuple(int(i) for i in value)
