"""``oncewire gateway check``: is everything the gateway needs there, before it starts?

Each check is one :class:`CheckResult` (name, status, detail) and asks the real thing once,
without changing it:

=====================  ======================================================================
``config``             the file parses (:func:`~oncewire.gateway.config.load_config`)
``env NAME``           each secret's environment variable is set (its value is never shown)
``store``              the store opens with ``create=False``; a SQLite file that is not there
                       yet is not created: the check says it would be, if its directory is
                       writable
``model``              ``GET {base_url}/models`` answers and lists the configured model
``platform NAME``      Telegram: ``getMe`` names the bot; a refused token (unauthorized) and
                       an unreachable Bot API are told apart. A webhook platform: something
                       accepts a TCP connection at ``send_url``'s host and port (the URL itself
                       is not called: a POST would be a message). Discord: ``GET
                       /users/@me`` names the bot, told apart the same way
=====================  ======================================================================

Every network check is bounded by the ``[model]`` table's ``connect_timeout`` and
``read_timeout`` (at most :data:`MAX_READ_SECONDS` for a check: a start-up check that hangs
for two minutes helps nobody).
"""

from __future__ import annotations

import enum
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from oncewire.core.errors import ConfigurationError, OncewireError
from oncewire.gateway.config import GatewayConfig, PlatformConfig, load_config

if TYPE_CHECKING:
    from oncewire.gateway.http import Timeouts

__all__ = [
    "MAX_READ_SECONDS",
    "CheckResult",
    "CheckStatus",
    "check_config",
    "check_gateway",
    "config_error",
]

MAX_READ_SECONDS = 10.0


class CheckStatus(enum.Enum):
    OK = "ok"  # the thing is there and answered as expected
    FAILED = "failed"  # the gateway would not work as configured; the detail says why
    NOT_CHECKED = "not checked"  # no honest cheap check exists (yet); the detail says which


@dataclass(frozen=True)
class CheckResult:
    """One check: ``detail`` says what was found, never a secret's value."""

    name: str
    status: CheckStatus
    detail: str
    # Why it failed, as a word a program can match: not_set, unreachable, unauthorized,
    # unavailable, not_listed, refused, unusable, no_extra, invalid.
    problem: str | None = None

    @property
    def failed(self) -> bool:
        return self.status is CheckStatus.FAILED

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "detail": self.detail,
            "problem": self.problem,
        }


def check_config(
    path: str | Path, environ: Mapping[str, str] | None = None
) -> tuple[GatewayConfig, list[CheckResult]]:
    """Load ``path`` and run every check on it; a config that does not load raises
    :class:`ConfigurationError` (the caller reports it as a usage error)."""
    config = load_config(path)
    return config, check_gateway(config, environ)


def check_gateway(
    config: GatewayConfig, environ: Mapping[str, str] | None = None
) -> list[CheckResult]:
    """Every check for a loaded config, in the order a reader fixes them."""
    env = os.environ if environ is None else environ
    tools = f", {len(config.tools)} tool(s)" if config.tools else ""
    results = [
        CheckResult(
            "config",
            CheckStatus.OK,
            f"{config.path}: {len(config.platforms)} platform(s){tools}",
        )
    ]
    results += _secrets(config, env)
    results.append(_store(config))
    try:
        import oncewire.gateway.http  # noqa: F401 - only to learn whether the extra is there
    except ImportError as exc:
        missing = CheckStatus.FAILED
        results.append(CheckResult("model", missing, str(exc), "no_extra"))
        results += [
            CheckResult(f"platform {p.name}", missing, str(exc), "no_extra")
            for p in config.platforms
        ]
        return results
    results.append(_model(config, env))
    results += [_platform(config, platform, env) for platform in config.platforms]
    return results


def _secrets(config: GatewayConfig, env: Mapping[str, str]) -> list[CheckResult]:
    users: dict[str, list[str]] = {}
    if config.model.api_key_env is not None:
        users.setdefault(config.model.api_key_env, []).append("[model] api_key_env")
    for platform in config.platforms:
        for key in ("token_env", "secret_env", "webhook_secret_env"):
            name = getattr(platform, key)
            if name is not None:
                users.setdefault(name, []).append(f"platform {platform.name} {key}")
    return [
        CheckResult(f"env {name}", CheckStatus.OK, f"set (for {', '.join(where)})")
        if env.get(name)
        else CheckResult(
            f"env {name}",
            CheckStatus.FAILED,
            f"not set (needed by {', '.join(where)})",
            "not_set",
        )
        for name, where in users.items()
    ]


def _store(config: GatewayConfig) -> CheckResult:
    db = config.store.db
    if "://" not in db and not Path(db).exists():
        # A check creates nothing: say what `gateway run` would do with this path.
        directory = Path(db).parent
        if not directory.is_dir():
            return CheckResult(
                "store",
                CheckStatus.FAILED,
                f"no store at {db}, and no directory {directory}",
                "unusable",
            )
        if not os.access(directory, os.W_OK | os.X_OK):
            return CheckResult(
                "store",
                CheckStatus.FAILED,
                f"no store at {db}, and {directory} is not writable to create it",
                "unusable",
            )
        return CheckResult(
            "store", CheckStatus.OK, f"no store at {db} yet: the gateway will create it"
        )
    from oncewire.ledger import Ledger

    try:
        ledger = Ledger(db, create=False, open_timeout_seconds=config.model.connect_timeout_seconds)
    except OncewireError as exc:
        return CheckResult("store", CheckStatus.FAILED, f"{exc} [{exc.code}]", "unusable")
    try:
        version = ledger.store.schema_version()
        backend = "PostgreSQL" if ledger.store.dialect == "postgresql" else "SQLite"
        where = _without_password(db) if "://" in db else db
        return CheckResult(
            "store", CheckStatus.OK, f"{backend} store at {where}, schema version {version}"
        )
    finally:
        ledger.close()


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def _timeouts(config: GatewayConfig) -> Timeouts:
    from oncewire.gateway.http import Timeouts

    return Timeouts(
        connect_seconds=config.model.connect_timeout_seconds,
        read_seconds=min(config.model.read_timeout_seconds, MAX_READ_SECONDS),
        write_seconds=MAX_READ_SECONDS,
        pool_seconds=config.model.connect_timeout_seconds,
    )


def _model(config: GatewayConfig, env: Mapping[str, str]) -> CheckResult:
    from oncewire.gateway.model import ModelFailure, ModelNotSent, ModelRejected, OpenAIChatClient

    model = config.model
    if model.api_key_env is not None and not env.get(model.api_key_env):
        return CheckResult(
            "model", CheckStatus.FAILED, f"not asked: {model.api_key_env} is not set", "not_set"
        )
    client = OpenAIChatClient(
        model.base_url,
        model.model,
        api_key_env=model.api_key_env,
        timeouts=_timeouts(config),
        environ=env,
    )
    try:
        listed = client.list_models()
    except ModelFailure as exc:
        problem = (
            "unreachable"
            if isinstance(exc, ModelNotSent)
            else "refused"
            if isinstance(exc, ModelRejected)
            else "unavailable"  # 5xx, 429, or no complete answer
        )
        return CheckResult(
            "model", CheckStatus.FAILED, f"{model.base_url}: {exc} [{exc.code}]", problem
        )
    finally:
        client.close()
    if model.model in listed:
        return CheckResult(
            "model",
            CheckStatus.OK,
            f"{model.base_url} lists {model.model} ({len(listed)} model(s))",
        )
    shown = ", ".join(listed[:5]) + (f" and {len(listed) - 5} more" if len(listed) > 5 else "")
    return CheckResult(
        "model",
        CheckStatus.FAILED,
        f"{model.base_url} does not list {model.model}; it lists: {shown or 'nothing'}",
        "not_listed",
    )


def _platform(
    config: GatewayConfig, platform: PlatformConfig, env: Mapping[str, str]
) -> CheckResult:
    name = f"platform {platform.name}"
    if platform.kind == "telegram":
        return _telegram(config, platform, env, name)
    if platform.kind == "webhook":
        return _webhook(config, platform, name)
    if platform.kind == "discord":
        return _discord(config, platform, env, name)
    return CheckResult(
        name, CheckStatus.NOT_CHECKED, f"{platform.kind}: oncewire has no adapter for it yet"
    )


def _discord(
    config: GatewayConfig, platform: PlatformConfig, env: Mapping[str, str], name: str
) -> CheckResult:
    from oncewire.gateway.platforms.discord import DiscordBot, DiscordError, DiscordUnauthorized

    assert platform.token_env is not None and platform.api_base is not None
    token = env.get(platform.token_env)
    if not token:
        return CheckResult(
            name, CheckStatus.FAILED, f"not asked: {platform.token_env} is not set", "not_set"
        )
    try:
        bot = DiscordBot(token, api_base=platform.api_base, timeouts=_timeouts(config))
    except ValueError:
        # Never repeat the value: it is the token, however mistyped.
        return CheckResult(
            name, CheckStatus.FAILED, f"{platform.token_env} does not hold a bot token", "invalid"
        )
    try:
        me = bot.get_me()
    except DiscordUnauthorized as exc:
        return CheckResult(
            name,
            CheckStatus.FAILED,
            f"unauthorized: Discord refused the token in {platform.token_env} ({exc})",
            "unauthorized",
        )
    except DiscordError as exc:
        return CheckResult(
            name,
            CheckStatus.FAILED,
            f"unreachable: {platform.api_base}: {exc} [{exc.code}]",
            "unreachable",
        )
    finally:
        bot.close()
    return CheckResult(name, CheckStatus.OK, f"discord bot {me.username} (id {me.id})")


def _telegram(
    config: GatewayConfig, platform: PlatformConfig, env: Mapping[str, str], name: str
) -> CheckResult:
    from oncewire.gateway.platforms.telegram import (
        BotUnauthorized,
        TelegramBot,
        TelegramError,
    )

    assert platform.token_env is not None and platform.api_base is not None
    token = env.get(platform.token_env)
    if not token:
        return CheckResult(
            name, CheckStatus.FAILED, f"not asked: {platform.token_env} is not set", "not_set"
        )
    try:
        bot = TelegramBot(token, api_base=platform.api_base, timeouts=_timeouts(config))
    except ValueError:
        # Never repeat the value: it is the token, however mistyped.
        return CheckResult(
            name,
            CheckStatus.FAILED,
            f"{platform.token_env} does not hold a bot token (it has spaces or '/')",
            "invalid",
        )
    try:
        me = bot.get_me()
    except BotUnauthorized as exc:
        return CheckResult(
            name,
            CheckStatus.FAILED,
            f"unauthorized: the Bot API refused the token in {platform.token_env} ({exc})",
            "unauthorized",
        )
    except TelegramError as exc:
        # Not reached, or it failed (5xx, 429): either way the bot cannot work right now.
        return CheckResult(
            name,
            CheckStatus.FAILED,
            f"unreachable: {platform.api_base}: {exc} [{exc.code}]",
            "unreachable",
        )
    finally:
        bot.close()
    return CheckResult(name, CheckStatus.OK, f"telegram bot @{me.username} (id {me.id})")


def _webhook(config: GatewayConfig, platform: PlatformConfig, name: str) -> CheckResult:
    assert platform.send_url is not None
    url = urlsplit(platform.send_url)
    host = url.hostname or ""
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        return CheckResult(
            name, CheckStatus.FAILED, f"{platform.send_url}: not a valid port", "invalid"
        )
    try:
        with socket.create_connection((host, port), timeout=config.model.connect_timeout_seconds):
            pass
    except OSError as exc:
        return CheckResult(
            name,
            CheckStatus.FAILED,
            f"unreachable: nothing accepts a connection at {host}:{port} "
            f"({exc.strerror or type(exc).__name__})",
            "unreachable",
        )
    return CheckResult(
        name,
        CheckStatus.OK,
        f"something listens at {host}:{port} (send_url itself is not called: a POST would "
        "be a message)",
    )


def config_error(exc: ConfigurationError) -> CheckResult:
    """The one result a config that does not load gives."""
    return CheckResult("config", CheckStatus.FAILED, f"{exc} [{exc.code}]", "invalid")
