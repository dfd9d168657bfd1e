"""``oncewire ui``: the local web dashboard (needs the ``ui`` extra)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from oncewire.cli.common import db_option
from oncewire.core.extras import require
from oncewire.runs.keys import KEY_ENV
from oncewire.ui import period

__all__ = ["command"]


@click.command("ui")
@db_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="Port to listen on (0: any free port, printed at start).",
)
@click.option(
    "--token",
    envvar="ONCEWIRE_UI_TOKEN",
    show_envvar=True,
    metavar="SECRET",
    help="Require this token on every request (required beyond loopback; 16+ characters). "
    "A browser opens the address once with ?token=SECRET.",
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Offer retry and cancel on an effect's page (each behind a CSRF token). "
    "Read-only without it.",
)
@click.option(
    "--evidence",
    "evidence",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A lab evidence file to show on the lab page (repeatable; others can be opened there).",
)
@click.option(
    "--key-env",
    default=KEY_ENV,
    show_default=True,
    metavar="NAME",
    help="Environment variable holding the run chain's HMAC key (unset: no key).",
)
@click.option(
    "--refresh-seconds",
    "refresh",
    default=f"{period.DEFAULT_SECONDS:g}",
    show_default=True,
    metavar="SECONDS",
    help=f"How often each page fetches its data again, in seconds "
    f"({period.MIN_SECONDS:g} to {period.MAX_SECONDS:g}; decimals allowed).",
)
def command(
    db: str,
    host: str,
    port: int,
    token: str | None,
    allow_actions: bool,
    evidence: tuple[Path, ...],
    key_env: str,
    refresh: str,
) -> None:
    """Serve a dashboard of the store: effects, receipts, chats, runs and lab evidence.

    Pages refresh their data in place every --refresh-seconds (two by default). Read-only
    unless --allow-actions is given. Listening on anything but loopback requires --token.
    Prints one JSON line with the address once listening; Ctrl-C stops it.
    """
    refresh_seconds = period.parse(refresh)  # a bad value is refused before anything starts
    require("ui", "oncewire ui")
    from oncewire.ui.server import serve

    key = os.environ.get(key_env)
    serve(
        db,
        host=host,
        port=port,
        token=token or None,
        allow_actions=allow_actions,
        runs_key=key.encode() if key else None,
        evidence=list(evidence),
        refresh_seconds=refresh_seconds,
    )
