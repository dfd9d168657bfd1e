"""A tool server written with the official SDK (MCPServer over stdio), started by the proxy as
its child in the tests. Every call of a tool appends one JSON line to ``$UPSTREAM_LOG`` (the
tool, its arguments, the key and the redelivery flag the proxy sent), so a test counts the
calls the server really got. ``UPSTREAM_DEDUP=1`` makes it declare that it deduplicates
(``capabilities.experimental["io.oncewire/deduplicates"]``), as ``oncewire.mcp.once`` does;
``UPSTREAM_NAME`` is its serverInfo.name (default ``pay``). ``--http PORT`` serves streamable
HTTP on 127.0.0.1:PORT/mcp instead of stdio.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp_types import ToolAnnotations
from pydantic import BaseModel

server = MCPServer(os.environ.get("UPSTREAM_NAME", "pay"))


def _log(tool: str, arguments: dict[str, Any], ctx: Context) -> None:
    meta = dict(ctx.request_context.meta or {})
    line = {
        "tool": tool,
        "arguments": arguments,
        "key": meta.get("io.oncewire/idempotency-key"),
        "redelivery": meta.get("io.oncewire/redelivery"),
        "pid": os.getpid(),
    }
    with open(os.environ["UPSTREAM_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(line) + "\n")
        log.flush()
        os.fsync(log.fileno())


@server.tool()
def charge(amount: int, ctx: Context, note: str = "") -> str:
    """Charge an amount (a side effect: one line in the log per call)."""
    _log("charge", {"amount": amount, "note": note}, ctx)
    return f"charged {amount}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup(q: str, ctx: Context) -> str:
    """Look something up (read-only)."""
    _log("lookup", {"q": q}, ctx)
    return f"found {q}"


@server.tool()
def slow(seconds: float, ctx: Context) -> str:
    """Log, then take ``seconds`` to answer."""
    _log("slow", {"seconds": seconds}, ctx)
    time.sleep(seconds)
    return "slow done"


@server.tool()
async def steps(count: int, ctx: Context) -> str:
    """Report progress and log a message at each of ``count`` steps."""
    _log("steps", {"count": count}, ctx)
    for step in range(1, count + 1):
        await ctx.report_progress(step, count, f"step {step}")
        await ctx.info(f"step {step} of {count}")
    return f"{count} steps"


class Confirmation(BaseModel):
    ok: bool


@server.tool()
async def confirm(action: str, ctx: Context) -> str:
    """Ask the client to confirm ``action`` (a request of the server's to the client, in the
    middle of the call), log its answer, and say it."""
    asked = await ctx.elicit(f"Confirm {action}?", Confirmation)
    accepted = asked.action == "accept" and getattr(asked, "data", None) is not None
    ok = accepted and bool(asked.data.ok)  # type: ignore[union-attr]
    _log("confirm", {"action": action, "ok": ok}, ctx)
    return f"{'confirmed' if ok else 'not confirmed'} {action}"


@server.tool()
def exit_now(ctx: Context) -> str:
    """Log, then exit without answering (the server dies with the call in flight)."""
    _log("exit_now", {}, ctx)
    os._exit(3)


@server.tool()
def refuse(ctx: Context) -> str:
    """Raise: the SDK answers an error result."""
    _log("refuse", {}, ctx)
    raise ToolError("refused on purpose")


@server.resource("res://greeting")
def greeting() -> str:
    return "hello from the server"


@server.prompt()
def greet(name: str) -> str:
    return f"Greet {name} warmly."


@server.prompt()
async def unhurried(seconds: str) -> str:
    """A request the proxy relays (not a tool call) that stays in flight for a while."""
    await anyio.sleep(float(seconds))
    return "taken my time"


async def main() -> None:
    lowlevel = server._lowlevel_server
    experimental = None
    if os.environ.get("UPSTREAM_DEDUP") == "1":
        experimental = {"io.oncewire/deduplicates": {"version": 1}}
    options = lowlevel.create_initialization_options(experimental_capabilities=experimental)
    async with stdio_server() as (read, write):
        await lowlevel.run(read, write, options)


if __name__ == "__main__":
    print("upstream server starting", file=sys.stderr)
    if sys.argv[1:2] == ["--http"]:  # a streamable HTTP server on 127.0.0.1:PORT/mcp
        anyio.run(lambda: server.run_streamable_http_async(port=int(sys.argv[2])))
    else:
        anyio.run(main)
