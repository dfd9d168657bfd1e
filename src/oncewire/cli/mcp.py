"""``oncewire mcp``: the durable MCP proxy (the ``mcp`` extra).

The SDK is imported only inside the command: without the ``mcp`` extra it answers with the one
line that names it (``MissingExtra``), and ``--help`` still works.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import click

from oncewire.cli.common import configure_logging, db_option
from oncewire.core.errors import ConfigurationError
from oncewire.core.extras import require

if TYPE_CHECKING:
    from oncewire.ledger import Ledger

__all__ = ["group"]


@click.group("mcp")
def group() -> None:
    """The Model Context Protocol (the mcp extra): proxy."""


PROXY_HELP = """Stand between an MCP client and a server so that every tools/call runs once.

\b
A client's config replaces
    "command": "CMD", "args": [ARGS...]
with
    "command": "oncewire", "args": ["mcp", "proxy", "--db", "URL", "--", "CMD", ARGS...]

The client speaks to this process on stdin/stdout (or on streamable HTTP with --listen
HOST:PORT); the server is CMD, started as a child on
stdio, or the streamable HTTP endpoint --upstream URL. Everything passes through unchanged
(the handshake, capabilities, tools/list, resources, prompts, notifications, progress),
except a tools/call of a tool not annotated readOnlyHint: it becomes an effect in the store
(kind mcp.<server>.<tool>, payload {tool, arguments}) before anything is forwarded, and the
client is answered from the store.

\b
Its key: params._meta["io.oncewire/idempotency-key"], else params.idempotencyKey, else
<proxy session>:<request id>. A repeat of a key that is done is answered with the stored
result without calling the server; the same key with other arguments is a JSON-RPC error
(-32602), nothing forwarded. The forwarded call carries the key and
_meta["io.oncewire/redelivery"].

\b
A call whose outcome is unknown (the proxy died after forwarding it, the server exited or
timed out with it in flight) is answered with an error result that says "outcome unknown",
never run again, unless it is redeliverable: a tool named by --redeliver, or any tool of a
server that declares capabilities.experimental["io.oncewire/deduplicates"] (oncewire.mcp.once):
that call is redelivered with the flag set.

stdout is the MCP channel; logs go to stderr. `oncewire effects list --db URL` shows the calls;
--otel makes OpenTelemetry spans of them. docs/mcp.md has the whole story.
"""


def _instrument(ledger: Ledger) -> None:
    """Spans and metrics through OpenTelemetry's global providers, said when none is set."""
    from opentelemetry import trace

    import oncewire.otel

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        logging.getLogger("oncewire.mcp.proxy").warning(
            "--otel: no OpenTelemetry tracer provider is configured in this process, so the "
            "spans go nowhere (run the proxy under opentelemetry-instrument, for one)"
        )
    oncewire.otel.instrument(ledgers=[ledger])


def _address(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6); ``PORT`` or ``:PORT`` alone is loopback."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(
            f"--listen takes HOST:PORT (127.0.0.1:8808) or a PORT alone, not {listen!r}"
        )
    return host, int(port)


@group.command(
    "proxy",
    help=PROXY_HELP,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@db_option
@click.option(
    "--name",
    metavar="NAME",
    help="The server's name in effect kinds (mcp.NAME.TOOL); default: the serverInfo.name it "
    "gives in its initialize result.",
)
@click.option(
    "--redeliver",
    "redeliver",
    multiple=True,
    metavar="TOOL",
    help="Redeliver a call of TOOL whose outcome is unknown, flagged, instead of answering "
    "'outcome unknown' (for a tool that deduplicates by the key). Repeatable.",
)
@click.option(
    "--upstream",
    metavar="URL",
    help="The server is the streamable HTTP endpoint at URL (http://host:port/mcp) instead of "
    "a child process (then give no CMD).",
)
@click.option(
    "--listen",
    metavar="HOST:PORT",
    help="Serve clients on streamable HTTP at http://HOST:PORT/mcp instead of stdio (each "
    "session gets a server of its own). No authentication: a PORT alone binds 127.0.0.1 "
    "(loopback only); put what authenticates in front of any other address.",
)
@click.option(
    "--timeout",
    "call_timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="How long a forwarded call may take; after it, its outcome is unknown (recorded as "
    "a timeout) and the server is told it is cancelled. Default: no limit.",
)
@click.option(
    "--otel/--no-otel",
    default=False,
    envvar="ONCEWIRE_OTEL",
    show_envvar=True,
    help="OpenTelemetry spans and metrics for the calls' effects (the otel extra): "
    "oncewire.otel.instrument() with OpenTelemetry's global providers, which are configured "
    "as for any Python program (e.g. the proxy run under opentelemetry-instrument).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
    help="Logging on stderr.",
)
@click.argument("command", nargs=-1, metavar="-- CMD [ARGS]...")
def proxy(
    db: str,
    name: str | None,
    redeliver: tuple[str, ...],
    upstream: str | None,
    listen: str | None,
    call_timeout: float | None,
    otel: bool,
    log_level: str,
    command: tuple[str, ...],
) -> None:
    require("mcp", "oncewire mcp proxy")
    if otel:
        require("otel", "oncewire mcp proxy --otel")
    if bool(upstream) == bool(command):
        raise click.UsageError("give the server as -- CMD [ARGS]... or as --upstream URL (one)")
    if upstream is not None and not upstream.startswith(("http://", "https://")):
        raise ConfigurationError(f"--upstream takes an http:// or https:// URL, not {upstream!r}")
    if call_timeout is not None and not call_timeout > 0:
        raise ConfigurationError("--timeout must be a positive number of seconds")
    if name is not None and (not name or "." in name):
        raise ConfigurationError("--name must be a non-empty name without dots")
    configure_logging(getattr(logging, log_level.upper()))
    from oncewire.ledger import Ledger
    from oncewire.mcp.proxy_run import run_stdio

    address = None if listen is None else _address(listen)
    with Ledger(db) as ledger:
        if otel:
            _instrument(ledger)
        if address is not None:
            from oncewire.mcp.proxy_run import run_listen

            run_listen(
                ledger,
                *address,
                command=command[0] if command else None,
                args=command[1:],
                upstream=upstream,
                name=name,
                redeliver=redeliver,
                call_timeout=call_timeout,
            )
            return
        run_stdio(
            ledger,
            command[0] if command else None,
            command[1:],
            upstream=upstream,
            name=name,
            redeliver=redeliver,
            call_timeout=call_timeout,
        )
