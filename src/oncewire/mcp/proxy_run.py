"""Running ``oncewire mcp proxy``: the client on this process's stdio, the server a child on its
stdio (the SDK's ``stdio_client``) or a streamable HTTP endpoint (``streamable_http_client``),
until either side ends.

Toward an HTTP server each message carries the headers the SDK's own client session would give
it (the SDK's transport takes them from the message's metadata): ``MCP-Protocol-Version`` with
the version ``initialize`` negotiated, or, for a 2026 request (its ``_meta`` stamped with the
protocol version), that version and its ``Mcp-Method`` and ``Mcp-Name`` routing headers.

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
from urllib.parse import urlsplit

from oncewire.core.extras import refusal

try:
    import anyio
except ImportError as exc:  # anyio comes with the mcp extra
    raise refusal("mcp", "oncewire mcp proxy", exc) from exc

from oncewire.core import crash
from oncewire.ledger import Ledger

__all__ = [
    "http_headers",
    "run_listen",
    "run_stdio",
    "serve_stdio",
    "serve_stdio_to_http",
    "server_env",
]


def server_env() -> dict[str, str]:
    """This process's environment without the proxy's armed crash points."""
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
    params = StdioServerParameters(command=command, args=list(args), env=server_env())
    try:
        async with stdio_client(params, errlog=sys.stderr) as (read, write):

            async def to_server(message: dict[str, Any]) -> None:
                parsed = mcp_types.jsonrpc_message_adapter.validate_python(message)
                await write.send(SessionMessage(parsed))

            await proxy.run(channel.lines(), channel.send, read, to_server)
    finally:
        channel.close()


def http_headers(message: dict[str, Any], negotiated: str | None) -> dict[str, str] | None:
    """The HTTP headers of ``message`` toward a streamable HTTP server (see the module)."""
    from mcp.shared.inbound import (
        MCP_METHOD_HEADER,
        MCP_NAME_HEADER,
        MCP_PROTOCOL_VERSION_HEADER,
        NAME_BEARING_METHODS,
        encode_header_value,
    )
    from mcp_types import PROTOCOL_VERSION_META_KEY

    method = message.get("method")
    if method == "initialize":
        return None
    params = message.get("params")
    params = params if isinstance(params, dict) else {}
    meta = params.get("_meta")
    stamped = meta.get(PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None
    if isinstance(stamped, str) and isinstance(method, str):
        headers = {MCP_PROTOCOL_VERSION_HEADER: stamped, MCP_METHOD_HEADER: method}
        name_key = NAME_BEARING_METHODS.get(method)
        name = params.get(name_key) if name_key is not None else None
        if isinstance(name, str):
            headers[MCP_NAME_HEADER] = encode_header_value(name)
        return headers
    return {MCP_PROTOCOL_VERSION_HEADER: negotiated} if negotiated else None


async def serve_stdio_to_http(
    ledger: Ledger,
    url: str,
    *,
    name: str | None = None,
    redeliver: Sequence[str] = (),
    call_timeout: float | None = None,
) -> None:
    """Serve one client on stdin/stdout, relayed to the streamable HTTP server at ``url``."""
    try:
        import mcp_types
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared.message import ClientMessageMetadata, SessionMessage
    except ImportError as exc:
        raise refusal("mcp", "oncewire mcp proxy", exc) from exc

    from oncewire.mcp.proxy import Proxy
    from oncewire.mcp.proxy_wire import StdioChannel

    channel = StdioChannel()
    proxy = Proxy(
        ledger,
        name=name,
        fallback_name=urlsplit(url).hostname or "server",
        redeliver=redeliver,
        call_timeout=call_timeout,
    )
    try:
        async with streamable_http_client(url) as streams:
            read, write = streams[0], streams[1]

            async def to_server(message: dict[str, Any]) -> None:
                parsed = mcp_types.jsonrpc_message_adapter.validate_python(message)
                headers = http_headers(message, proxy.server.protocol_version)
                metadata = None if headers is None else ClientMessageMetadata(headers=headers)
                await write.send(SessionMessage(parsed, metadata=metadata))

            await proxy.run(channel.lines(), channel.send, read, to_server)
    finally:
        channel.close()


def run_stdio(
    ledger: Ledger,
    command: str | None,
    args: Sequence[str],
    *,
    upstream: str | None = None,
    **options: Any,
) -> None:
    """:func:`serve_stdio` (or, with ``upstream``, :func:`serve_stdio_to_http`) on a new event
    loop (asyncio), until either side ends."""
    if upstream is not None:
        anyio.run(lambda: serve_stdio_to_http(ledger, upstream, **options), backend="asyncio")
        return
    assert command is not None
    anyio.run(lambda: serve_stdio(ledger, command, args, **options), backend="asyncio")


def run_listen(ledger: Ledger, host: str, port: int, **options: Any) -> None:
    """:func:`oncewire.mcp.proxy_listen.serve_http` on a new event loop (asyncio)."""
    from oncewire.mcp.proxy_listen import serve_http

    anyio.run(lambda: serve_http(ledger, host, port, **options), backend="asyncio")
