"""``oncewire gateway``: the chat gateway's commands (``check`` and ``webhook`` so far)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import click

from oncewire.cli import gateway_demo, gateway_run
from oncewire.cli.common import emit, json_option
from oncewire.core.errors import ConfigurationError
from oncewire.gateway.check import CheckResult, check_config, config_error
from oncewire.gateway.config import GatewayConfig, PlatformConfig, load_config

if TYPE_CHECKING:
    # Needs the gateway extra: the commands that talk to Telegram import it when they run, so
    # that the others (and --help) work without it.
    from oncewire.gateway.platforms.telegram import TelegramBot

__all__ = ["group"]

EXIT_FAILED = 1
EXIT_BAD_CONFIG = 2  # as for any other usage error


@click.group("gateway")
def group() -> None:
    """The chat gateway: check its configuration and what it connects to, and switch a
    Telegram bot to webhook mode."""


group.add_command(gateway_run.run)
group.add_command(gateway_run.status)
group.add_command(gateway_demo.demo)

config_option = click.option(
    "--config",
    "config_path",
    envvar="ONCEWIRE_GATEWAY_CONFIG",
    show_envvar=True,
    required=True,
    metavar="PATH",
    help="The gateway.toml.",
)
platform_option = click.option(
    "--platform",
    "platform_name",
    metavar="NAME",
    help="The [[platforms]] name; needed when the config has more than one to choose from.",
)


@group.command("check")
@click.option(
    "--config",
    "config_path",
    envvar="ONCEWIRE_GATEWAY_CONFIG",
    show_envvar=True,
    required=True,
    metavar="PATH",
    help="The gateway.toml to check.",
)
@json_option
def check(config_path: str, as_json: bool) -> None:
    """Check a gateway.toml and everything it names, without changing anything.

    \b
    One line per check: the config parses; each secret's environment variable is set (its
    value is never printed); the store opens (a missing SQLite file is not created: the check
    says it would be); the model server answers GET /models and lists the model; each
    Telegram bot's token is accepted (getMe) or refused (unauthorized) or the Bot API is
    unreachable; something listens at each webhook platform's send_url (the URL itself is
    not called); each Discord bot's token is accepted (GET /users/@me) or refused, or Discord
    is unreachable. Network checks use [model] connect_timeout and read_timeout (at most
    10s).

    Exit 0 when every check passes, 1 when one fails, 2 when the config does not load.

    \b
    Example:
      export OPENAI_API_KEY=... TELEGRAM_BOT_TOKEN=...
      oncewire gateway check --config gateway.toml
      oncewire gateway check --config gateway.toml --json
    """
    try:
        _, results = check_config(config_path)
    except ConfigurationError as exc:
        if as_json:
            emit({"config": config_path, "ok": False, "checks": [config_error(exc).as_json()]})
        else:
            click.echo(f"error: {exc} [{exc.code}]", err=True)
        raise click.exceptions.Exit(EXIT_BAD_CONFIG) from exc
    failed = any(r.failed for r in results)
    if as_json:
        emit({"config": config_path, "ok": not failed, "checks": [r.as_json() for r in results]})
    else:
        _print(results)
    if failed:
        raise click.exceptions.Exit(EXIT_FAILED)


@group.group("webhook")
def webhook() -> None:
    """Set or delete a Telegram bot's webhook (Telegram then POSTs its updates to the gateway's
    webhook server instead of answering long polls)."""


@webhook.command("set")
@config_option
@platform_option
@click.option(
    "--url",
    metavar="URL",
    help="The public base URL Telegram reaches the webhook server at (https://host[:port], "
    "the path is added). Default: http:// and [webhooks] bind, which only a local Bot API "
    "can reach.",
)
def webhook_set(config_path: str, platform_name: str | None, url: str | None) -> None:
    """Have Telegram deliver a bot's updates to the gateway's webhook server.

    \b
    Calls setWebhook with the URL of the platform's route (its path ends in a suffix derived
    from the webhook secret) and the secret from webhook_secret_env, which Telegram sends in
    X-Telegram-Bot-Api-Secret-Token with every update. The platform must say
    inbound = "webhook"; while the webhook is set, long polling is refused (409).

    Exit 0 when Telegram accepted the webhook, 1 when the Bot API refused or could not be
    reached, 2 for a config or option problem.

    \b
    Example:
      export TELEGRAM_BOT_TOKEN=... TELEGRAM_WEBHOOK_SECRET=...
      oncewire gateway webhook set --config gateway.toml --url https://bot.example.org
    """
    from oncewire.gateway.platforms.telegram_updates import ALLOWED_UPDATES
    from oncewire.gateway.webhooks import telegram_webhook_path

    config = _load(config_path)
    platform = _telegram_platform(config, platform_name, webhook_mode=True)
    assert platform.token_env is not None and platform.webhook_secret_env is not None
    token = _secret(config, platform.token_env)
    secret = _secret(config, platform.webhook_secret_env)
    if url is None:
        host = config.webhooks.host
        url = f"http://{f'[{host}]' if ':' in host else host}:{config.webhooks.port}"
    full = url.rstrip("/") + telegram_webhook_path(platform.name, secret)
    try:
        _bot_call(
            platform,
            token,
            lambda bot: bot.set_webhook(full, secret, allowed_updates=ALLOWED_UPDATES),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(f"webhook set: Telegram now POSTs {platform.name}'s updates to {full}")


@webhook.command("delete")
@config_option
@platform_option
def webhook_delete(config_path: str, platform_name: str | None) -> None:
    """Stop Telegram's webhook delivery for a bot, so that it can be long-polled again.

    Updates not yet delivered stay with Telegram and are served to the next poll. Deleting a
    webhook that is not set changes nothing. Exit codes as for "webhook set".

    \b
    Example:
      oncewire gateway webhook delete --config gateway.toml --platform tg
    """
    from oncewire.gateway.platforms.telegram import TelegramBot  # noqa: F401 - the extra, first

    config = _load(config_path)
    platform = _telegram_platform(config, platform_name, webhook_mode=False)
    assert platform.token_env is not None
    token = _secret(config, platform.token_env)
    _bot_call(platform, token, lambda bot: bot.delete_webhook())
    click.echo(f"webhook deleted: {platform.name} can be long-polled")


def _load(config_path: str) -> GatewayConfig:
    try:
        return load_config(config_path)
    except ConfigurationError as exc:
        _config_error(exc)


def _secret(config: GatewayConfig, env_name: str) -> str:
    try:
        return config.secret(env_name)
    except ConfigurationError as exc:
        _config_error(exc)


def _config_error(exc: ConfigurationError) -> NoReturn:
    click.echo(f"error: {exc} [{exc.code}]", err=True)
    raise click.exceptions.Exit(EXIT_BAD_CONFIG) from exc


def _telegram_platform(
    config: GatewayConfig, name: str | None, *, webhook_mode: bool
) -> PlatformConfig:
    telegram = [p for p in config.platforms if p.kind == "telegram"]
    if name is not None:
        named = [p for p in telegram if p.name == name]
        if not named:
            known = ", ".join(p.name for p in telegram) or "none"
            raise click.UsageError(f"no Telegram platform named {name!r} (Telegram: {known})")
        if webhook_mode and named[0].inbound != "webhook":
            raise click.UsageError(
                f'platform {name} has inbound = "{named[0].inbound}"; set inbound = "webhook" '
                "first, or its poller would be refused while the webhook is set"
            )
        return named[0]
    choices = [p for p in telegram if p.inbound == "webhook"] if webhook_mode else telegram
    if len(choices) == 1:
        return choices[0]
    which = 'with inbound = "webhook"' if webhook_mode else ""
    if not choices:
        raise click.UsageError(f"{config.path} has no Telegram platform {which}".rstrip())
    names = ", ".join(p.name for p in choices)
    raise click.UsageError(f"name one with --platform ({names})")


def _bot_call(platform: PlatformConfig, token: str, call: Callable[[TelegramBot], None]) -> None:
    from oncewire.gateway.platforms.telegram import TelegramBot, TelegramError

    assert platform.api_base is not None
    try:
        bot = TelegramBot(token, api_base=platform.api_base)
    except ValueError as exc:
        raise click.UsageError(f"{platform.token_env} does not hold a bot token: {exc}") from exc
    try:
        call(bot)
    except TelegramError as exc:
        click.echo(f"error: {platform.name}: {exc} [{exc.code}]", err=True)
        raise click.exceptions.Exit(EXIT_FAILED) from exc
    finally:
        bot.close()


def _print(results: list[CheckResult]) -> None:
    width = max(len(r.name) for r in results)
    for r in results:
        click.echo(f"{r.status.value:<11}  {r.name:<{width}}  {r.detail}")
