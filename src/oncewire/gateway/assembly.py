"""The gateway's assembly: the parts of one process, made from its configuration.

Each function here makes one part :class:`~oncewire.gateway.runner.Runner` wires together: the
credentials read from the environment (a secret that is not set, or a token that is not one,
stops the start before the store opens), the system prompt, the webhook server, the platform
adapters, the tools' dispatcher, the turn worker, the admitter, the bot lease names and each
platform's listener. Nothing here starts a thread or holds state between calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oncewire.core.errors import ConfigurationError
from oncewire.dispatch import Dispatcher
from oncewire.gateway.admission import WEBHOOK_BOT, Admitted, Admitter, telegram_bot_id
from oncewire.gateway.config import GatewayConfig, PlatformConfig
from oncewire.gateway.http import Timeouts
from oncewire.gateway.leases import bot_lease_name, token_digest
from oncewire.gateway.listeners import DiscordListener, Listener, TelegramListener
from oncewire.gateway.model_results import ModelClient
from oncewire.gateway.platforms.discord import DiscordBot
from oncewire.gateway.platforms.telegram import TelegramBot
from oncewire.gateway.platforms.telegram_updates import TelegramInbound
from oncewire.gateway.platforms.webhook import WebhookInbound, WebhookPlatform
from oncewire.gateway.ratelimit import RateLimiter, RateLimits
from oncewire.gateway.tools import ToolRegistry
from oncewire.gateway.turn import TurnSettings, TurnWorker
from oncewire.ledger import Ledger
from oncewire.replies import ReplyEngine

if TYPE_CHECKING:  # the server needs the gateway extra's starlette and uvicorn
    from oncewire.gateway.webhooks import WebhookServer

__all__ = [
    "Adapter",
    "Credentials",
    "lease_names",
    "make_adapters",
    "make_admitter",
    "make_dispatcher",
    "make_listener",
    "make_turn_worker",
    "make_webhook_server",
    "read_system_prompt",
]

Adapter = TelegramBot | WebhookPlatform | DiscordBot


@dataclass(frozen=True)
class Credentials:
    """The secrets the platforms need, read from the environment once, at the start."""

    tokens: dict[str, str]  # Telegram or Discord platform -> its bot token
    bots: dict[str, str]  # Telegram platform -> its bot id (the token's first part)
    hook_secrets: dict[str, str]  # webhook platform with a secret_env -> its secret

    @classmethod
    def read(cls, config: GatewayConfig) -> Credentials:
        """Read every platform's secret; a token that is not a bot token is refused here."""
        telegram = [p for p in config.platforms if p.kind == "telegram"]
        discord = [p for p in config.platforms if p.kind == "discord"]
        hooks = [p for p in config.platforms if p.kind == "webhook"]
        tokens = {p.name: config.secret(p.token_env or "") for p in (*telegram, *discord)}
        hook_secrets = {p.name: config.secret(p.secret_env) for p in hooks if p.secret_env}
        try:
            bots = {p.name: telegram_bot_id(tokens[p.name]) for p in telegram}
        except ValueError as exc:
            raise ConfigurationError(f"{config.path}: a token_env variable: {exc}") from exc
        return cls(tokens, bots, hook_secrets)


def read_system_prompt(config: GatewayConfig) -> str | None:
    """The text of ``[model] system_prompt_file``, or None without one."""
    path = config.model.system_prompt_file
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(
            f"{config.path}: system_prompt_file: cannot read {path}: {exc.strerror or exc}"
        ) from exc


def make_webhook_server(
    config: GatewayConfig,
    admit: Callable[[PlatformConfig, TelegramInbound | WebhookInbound], Admitted],
    *,
    grace_seconds: float,
) -> WebhookServer | None:
    """The inbound webhook server, when a platform takes its messages by webhook."""
    pushed = [
        p
        for p in config.platforms
        if p.kind == "webhook" or (p.kind == "telegram" and p.inbound == "webhook")
    ]
    if not pushed:
        return None
    from oncewire.gateway.webhooks import WebhookServer

    # The server's own drain (requests being admitted) fits in the process's grace period.
    return WebhookServer(config, admit, drain_seconds=math.ceil(grace_seconds))


def make_adapters(
    config: GatewayConfig, credentials: Credentials, into: dict[str, Adapter]
) -> None:
    """Make each platform's adapter into ``into`` (Telegram, then Discord, then webhook
    platforms): the ones made before one that fails are there for the caller to close."""
    for p in config.platforms:
        if p.kind == "telegram":
            assert p.api_base is not None
            into[p.name] = TelegramBot(
                credentials.tokens[p.name],
                api_base=p.api_base,
                limiter=RateLimiter(RateLimits.of(p)),
                timeouts=Timeouts(read_seconds=p.read_timeout_seconds),
            )
    for p in config.platforms:
        if p.kind == "discord":
            assert p.api_base is not None
            into[p.name] = DiscordBot(
                credentials.tokens[p.name],
                api_base=p.api_base,
                timeouts=Timeouts(read_seconds=p.read_timeout_seconds),
            )
    for p in config.platforms:
        if p.kind == "webhook":
            assert p.send_url is not None
            into[p.name] = WebhookPlatform(
                p.send_url,
                secret=credentials.hook_secrets.get(p.name),
                timeouts=Timeouts(read_seconds=p.read_timeout_seconds),
            )


def make_dispatcher(
    config: GatewayConfig,
    ledger: Ledger,
    tools: ToolRegistry,
    *,
    owner: str,
    grace_seconds: float,
) -> Dispatcher | None:
    """The dispatcher that runs the tools' effects, or None without ``[[tools]]``."""
    if not tools:
        return None
    return Dispatcher(
        ledger,
        tools.sinks(),
        attempt_timeouts=tools.attempt_timeouts(),
        concurrency=config.turns.max_concurrent,
        owner=owner,
        grace_seconds=grace_seconds,
    )


def make_turn_worker(
    config: GatewayConfig,
    ledger: Ledger,
    engine: ReplyEngine,
    model: ModelClient,
    *,
    prompt: str | None,
    owner: str,
    tools: ToolRegistry,
    dispatcher: Dispatcher | None,
) -> TurnWorker:
    """The worker that runs one turn, with the settings of ``[model]`` and ``[turns]``."""
    kinds = ("telegram", "webhook", "discord")
    return TurnWorker(
        ledger,
        engine,
        model,
        {p.name: p for kind in kinds for p in config.platforms if p.kind == kind},
        TurnSettings(
            max_retries=config.model.max_retries,
            max_starts=config.turns.max_starts,
            resume_note=config.turns.resume_note,
            system_prompt=prompt,
            history_messages=config.turns.history_messages,
            history_chars=config.turns.history_chars,
            max_steps=config.turns.max_steps,
            lease_seconds=config.leases.turn_seconds,
        ),
        owner=owner,
        tools=tools,
        wake_tools=None if dispatcher is None else dispatcher.wake,
    )


def make_admitter(
    config: GatewayConfig,
    ledger: Ledger,
    credentials: Credentials,
    *,
    on_new: Callable[[int], None],
) -> Admitter:
    """The admitter every listener and the webhook server admit their messages through."""
    return Admitter(ledger, on_new=on_new, busy_mode=config.turns.busy_mode, bots=credentials.bots)


def lease_names(config: GatewayConfig, credentials: Credentials) -> dict[str, str]:
    """Each platform's bot lease name: one bot, one lease, whatever the platform is called."""
    return {
        p.name: bot_lease_name(
            p.name,
            credentials.bots[p.name]
            if p.kind == "telegram"
            else WEBHOOK_BOT
            if p.kind == "webhook"
            else token_digest(credentials.tokens[p.name]),
        )
        for p in config.platforms
    }


def make_listener(
    platform: PlatformConfig,
    *,
    credentials: Credentials,
    admitter: Admitter,
    ledger: Ledger,
    poll_timeout_seconds: int,
) -> Listener | None:
    """A new listener for ``platform``, or None when its messages are pushed to us."""
    if platform.kind == "telegram" and platform.inbound == "polling":
        return TelegramListener(
            platform,
            credentials.tokens[platform.name],
            credentials.bots[platform.name],
            admitter,
            poll_timeout_seconds=poll_timeout_seconds,
        )
    if platform.kind == "discord":
        return DiscordListener(platform, credentials.tokens[platform.name], admitter, ledger)
    return None
