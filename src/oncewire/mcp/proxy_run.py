"""Running ``oncewire mcp proxy``: the client on this process's stdio, the server a child on its
stdio (the SDK's ``stdio_client``), until either side ends.

The server's child inherits this process's environment (the SDK's ``stdio_client`` would pass
only a few safe variables; a drop-in proxy must not change what its server sees), without the
crash points armed for the proxy (``ONCEWIRE_CRASH``, ``ONCEWIRE_CRASH_TOKEN``): arm a
server's in its own command (``env ONCEWIRE_CRASH=... server``). Its stderr is the proxy's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from oncewire.core.extras import refusal

try:
    import anyio
except ImportError as exc:  # anyio comes with the mcp extra
    raise refusal("mcp", "oncewire mcp proxy", exc) from exc

from oncewire.core import crash
from oncewire.ledger import Ledger

__all__ = ["run_stdio", "serve_stdio"]


def _server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop(crash.ENV_POINTS, None)
    env.pop(crash.ENV_TOKEN, None)
    return env


async def serve_stdio(
    ledger: Ledger,
    command: str,
    args: Sequence[str],
    *,
    name: str | None = None,
    redeliver: Sequence[str] = (),
    call_timeout: float | None = None,
) -> None:
    """Serve one client on stdin/stdout, relayed to ``command args`` (see the module)."""
    try:
        import mcp_types
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.shared.message import SessionMessage
    except ImportError as exc:
        raise refusal("mcp", "oncewire mcp proxy", exc) from exc

    from oncewire.mcp.proxy import Proxy
    from oncewire.mcp.proxy_wire import StdioChannel

    channel = StdioChannel()
    proxy = Proxy(
        ledger,
        name=name,
        fallback_name=os.path.basename(command) or "server",
        redeliver=redeliver,
        call_timeout=call_timeout,
    )
    params = StdioServerParameters(command=command, args=list(args), env=_server_env())
    try:
        async with stdio_client(params, errlog=sys.stderr) as (read, write):

            async def to_server(message: dict[str, Any]) -> None:
                parsed = mcp_types.jsonrpc_message_adapter.validate_python(message)
                await write.send(SessionMessage(parsed))

            await proxy.run(channel.lines(), channel.send, read, to_server)
    finally:
        channel.close()


def run_stdio(ledger: Ledger, command: str, args: Sequence[str], **options: Any) -> None:
    """:func:`serve_stdio` on a new event loop (asyncio), until either side ends."""
    anyio.run(lambda: serve_stdio(ledger, command, args, **options), backend="asyncio")
