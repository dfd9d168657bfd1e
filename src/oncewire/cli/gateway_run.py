"""``oncewire gateway run`` (the service) and ``oncewire gateway status`` (what the store says)."""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
from types import FrameType

import click

from oncewire.cli import logformat
from oncewire.cli.common import configure_logging, db_option, emit, json_option, table
from oncewire.core.errors import ConfigurationError
from oncewire.gateway.config import load_config
from oncewire.gateway.status import session_status
from oncewire.ledger import Ledger

__all__ = ["run", "status"]

EXIT_BAD_CONFIG = 2


@click.command("run")
@click.option(
    "--config",
    "config_path",
    envvar="ONCEWIRE_GATEWAY_CONFIG",
    show_envvar=True,
    required=True,
    metavar="PATH",
    help="The gateway.toml.",
)
@click.option(
    "--grace-seconds",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="On SIGTERM or SIGINT, how long running turns may take to finish and deliver.",
)
@logformat.log_format_option
def run(config_path: str, grace_seconds: float) -> None:
    """Run the gateway: receive messages, answer them with the model, deliver the replies.

    \b
    Boots from the store alone: replies committed before a crash are delivered, turns a dead
    process left are resumed, messages waiting for their turn are answered; then each
    Telegram bot with inbound = "polling" is long-polled (an update is confirmed to Telegram
    only once its admission committed), the webhook server is started on [webhooks] bind when
    a platform pushes its messages (Telegram inbound = "webhook", kind = "webhook"; a POST is
    answered 2xx only once admitted), and "ready" is printed on stdout ("ready port=N" with
    the webhook server, N the port it listens on). One turn runs per
    chat session at a time, up to [turns] max_concurrent at once. One INFO line per turn
    start, commit and delivery goes to stderr.

    SIGTERM or SIGINT drains: the webhook server and polling stop, running turns get
    --grace-seconds to finish (a turn still running then is left to the next start, which
    resumes it), exit 0. Exit 2 when the config does not load or a secret's environment
    variable is not set.

    \b
    Example:
      export OPENAI_API_KEY=... TELEGRAM_BOT_TOKEN=...
      oncewire gateway run --config gateway.toml
    """
    from oncewire.gateway.runner import Runner  # needs the gateway extra; --help does not

    configure_logging(logging.INFO)
    try:
        config = load_config(config_path)
        runner = Runner(config, grace_seconds=grace_seconds, out=sys.stdout)
    except ConfigurationError as exc:
        click.echo(f"error: {exc} [{exc.code}]", err=True)
        raise click.exceptions.Exit(EXIT_BAD_CONFIG) from exc

    def drain(signum: int, frame: FrameType | None) -> None:
        runner.stop()

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)
    if logformat.current() != "json":  # the dump is plain text: not inside a JSON-lines stderr
        # SIGUSR1 writes every thread's stack to stderr: where a gateway that does not stop is
        # stuck.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        code = runner.run()
    except ConfigurationError as exc:
        click.echo(f"error: {exc} [{exc.code}]", err=True)
        raise click.exceptions.Exit(EXIT_BAD_CONFIG) from exc
    raise click.exceptions.Exit(code)


COLUMNS = (
    "platform",
    "bot",
    "chat",
    "thread",
    "active_turn",
    "received",
    "answering",
    "answered_not_delivered",
    "scheduled",
    "dead",
    "quarantined",
)


@click.command("status")
@db_option
@json_option
def status(db: str, as_json: bool) -> None:
    """Per chat session: the active turn and the messages not yet delivered.

    \b
    Read from the store, safe while the gateway runs: active_turn (its run id), received
    (waiting for their turn), answering (turn started, answer not committed),
    answered_not_delivered (committed, still being delivered: not yet visible in full),
    scheduled (of those, waiting for a retry time in the future), dead (delivery given up for
    good: the platform refused it, e.g. "chat not found", or it ran out of attempts; never
    tried again) and quarantined. Sessions with nothing pending are left out; an empty list
    means every message was answered and delivered.

    \b
    Example:
      oncewire gateway status --db gateway.db --json
    """
    with Ledger(db, create=False) as ledger:
        sessions = session_status(ledger)
    rows = [s.as_dict() for s in sessions]
    if as_json:
        emit({"sessions": rows})
        return
    if not rows:
        click.echo("nothing pending: every message is answered and delivered")
        return
    table(COLUMNS, [[row[c] for c in COLUMNS] for row in rows])
