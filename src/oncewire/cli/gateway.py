"""``oncewire gateway``: the chat gateway's commands (``check`` so far)."""

from __future__ import annotations

import click

from oncewire.cli.common import emit, json_option
from oncewire.core.errors import ConfigurationError
from oncewire.gateway.check import CheckResult, check_config, config_error

__all__ = ["group"]

EXIT_FAILED = 1
EXIT_BAD_CONFIG = 2  # as for any other usage error


@click.group("gateway")
def group() -> None:
    """The chat gateway: check its configuration and what it connects to."""


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
    not called); Discord is not checked yet. Network checks use [model] connect_timeout and
    read_timeout (at most 10s).

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


def _print(results: list[CheckResult]) -> None:
    width = max(len(r.name) for r in results)
    for r in results:
        click.echo(f"{r.status.value:<11}  {r.name:<{width}}  {r.detail}")
