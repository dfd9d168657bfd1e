"""``oncewire mcp proxy --listen HOST:PORT``: the client's side on streamable HTTP.

Each MCP session a client opens (an ``initialize`` POST without ``Mcp-Session-Id``) gets a
session of the SDK's ``StreamableHTTPServerTransport``, a :class:`~oncewire.mcp.proxy.Proxy`
of its own and a server of its own: the child process ``CMD ARGS`` (a stdio server serves one
client), or a connection of its own to ``--upstream URL``. The session ends with the client's
``DELETE`` (or when the proxy stops), and its server with it. Every session's calls are effects
in the one store, so a retry in a new session with the same key is answered once.

The proxy binds ``127.0.0.1`` unless told otherwise, with the SDK's DNS rebinding protection on
for a loopback address. Messages toward the client carry no request relation: the transport
answers each request on its own POST, and the server's notifications and requests (progress,
logging, sampling) go on the session's GET stream, which the SDK's client opens.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from oncewire.core.extras import refusal
from oncewire.ledger import Ledger

try:
    import anyio
    import mcp_types
    import uvicorn
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
    from mcp.server.transport_security import TransportSecuritySettings
    from mcp.shared.message import ClientMessageMetadata, SessionMessage
except ImportError as exc:
    raise refusal("mcp", "oncewire mcp proxy --listen", exc) from exc

from oncewire.mcp.proxy import Proxy
from oncewire.mcp.proxy_run import http_headers, server_env

__all__ = ["serve_http"]

log = logging.getLogger("oncewire.mcp.proxy")

PATH = "/mcp"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _security(host: str, port: int) -> TransportSecuritySettings | None:
    if host not in LOOPBACK:
        return None
    hosts = [f"{name}:{port}" for name in ("127.0.0.1", "localhost", "[::1]")]
    return TransportSecuritySettings(
        allowed_hosts=hosts, allowed_origins=[f"http://{h}" for h in hosts]
    )


async def _respond(send: Any, status: int, text: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8")],
        }
    )
    await send({"type": "http.response.body", "body": text.encode()})


async def serve_http(
    ledger: Ledger,
    host: str,
    port: int,
    *,
    command: str | None,
    args: Sequence[str] = (),
    upstream: str | None = None,
    name: str | None = None,
    redeliver: Sequence[str] = (),
    call_timeout: float | None = None,
) -> None:
    """Serve MCP clients on ``http://host:port/mcp`` until stopped (SIGINT, SIGTERM)."""
    sessions: dict[str, StreamableHTTPServerTransport] = {}
    security = _security(host, port)

    def upstream_streams() -> AbstractAsyncContextManager[tuple[Any, Any, Proxy]]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[tuple[Any, Any, Proxy]]:
            fallback = (command or "").rsplit("/", 1)[-1] or "server"
            proxy = Proxy(
                ledger,
                name=name,
                fallback_name=fallback,
                redeliver=redeliver,
                call_timeout=call_timeout,
            )
            if upstream is not None:
                async with streamable_http_client(upstream) as streams:
                    read, write = streams[0], streams[1]

                    async def to_http(message: dict[str, Any]) -> None:
                        parsed = mcp_types.jsonrpc_message_adapter.validate_python(message)
                        headers = http_headers(message, proxy.server.protocol_version)
                        meta = None if headers is None else ClientMessageMetadata(headers=headers)
                        await write.send(SessionMessage(parsed, metadata=meta))

                    yield read, to_http, proxy
                return
            assert command is not None
            params = StdioServerParameters(command=command, args=list(args), env=server_env())
            async with stdio_client(params) as (read, write):

                async def to_child(message: dict[str, Any]) -> None:
                    parsed = mcp_types.jsonrpc_message_adapter.validate_python(message)
                    await write.send(SessionMessage(parsed))

                yield read, to_child, proxy

        return opened()

    async def run_session(
        session_id: str, transport: StreamableHTTPServerTransport, started: anyio.Event
    ) -> None:
        try:
            async with transport.connect() as (client_read, client_write):
                started.set()

                async def messages() -> AsyncIterator[dict[str, Any]]:
                    async for item in client_read:
                        if isinstance(item, Exception):
                            log.warning("a client message the transport could not read: %s", item)
                            continue
                        yield item.message.model_dump(
                            by_alias=True, exclude_unset=True, mode="json"
                        )

                async def to_client(message: dict[str, Any]) -> None:
                    parsed = mcp_types.jsonrpc_message_adapter.validate_python(message)
                    await client_write.send(SessionMessage(parsed))

                async with upstream_streams() as (server_read, to_server, proxy):
                    await proxy.run(messages(), to_client, server_read, to_server)
        except Exception:
            log.exception("the MCP session %s ended on an error", session_id)
        finally:
            started.set()
            sessions.pop(session_id, None)

    async with anyio.create_task_group() as tg:

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            if scope["path"].rstrip("/") != PATH:
                await _respond(send, 404, f"not found: MCP is served at {PATH}")
                return
            wanted = dict(scope["headers"]).get(MCP_SESSION_ID_HEADER.encode())
            if wanted is not None:
                transport = sessions.get(wanted.decode("latin-1"))
                if transport is None:
                    await _respond(send, 404, "no such MCP session (it ended, or never began)")
                    return
            elif scope["method"] != "POST":
                await _respond(send, 400, "an MCP session begins with an initialize POST")
                return
            else:
                session_id = uuid.uuid4().hex
                transport = StreamableHTTPServerTransport(session_id, security_settings=security)
                sessions[session_id] = transport
                started = anyio.Event()
                tg.start_soon(run_session, session_id, transport, started)
                await started.wait()
            await transport.handle_request(scope, receive, send)

        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        await uvicorn.Server(config).serve()
        tg.cancel_scope.cancel()
