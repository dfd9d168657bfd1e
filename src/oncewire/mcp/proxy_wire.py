"""The client's side of ``oncewire mcp proxy`` on stdio: JSON-RPC lines in, JSON-RPC lines out.

The proxy reads its stdin itself instead of through the SDK's ``stdio_server`` so that every
line it cannot use gets an answer that says why, with the request's id when the line has a
usable one: a line that is not JSON is a parse error (-32700, id null); JSON that is not one
JSON-RPC 2.0 message (a batch, a number, a request whose id is neither a string nor an integer,
params that are not an object) is an invalid request (-32600). Nothing such a line says is
recorded or forwarded, and the proxy goes on serving.

While it serves, the proxy's file descriptor 1 points at its stderr (as the SDK's
``stdio_server`` does), so a stray ``print`` never corrupts the MCP channel; the channel itself
is a duplicate of the original stdout.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

from oncewire.core.extras import refusal

try:
    import anyio
except ImportError as exc:  # anyio comes with the mcp extra
    raise refusal("mcp", "oncewire mcp proxy", exc) from exc

__all__ = ["Incoming", "StdioChannel", "parse_line", "rpc_error"]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603


def rpc_error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error response."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


@dataclass(frozen=True, slots=True)
class Incoming:
    """One line from the client: a message to act on, or the error to answer it with."""

    kind: Literal["request", "notification", "response", "invalid"]
    message: dict[str, Any]  # for "invalid": the error response to send


def _usable_id(value: Any) -> bool:
    # MCP: a request id is a string or an integer (not null, not a float, not a bool).
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def parse_line(line: bytes | str | dict[str, Any]) -> Incoming | None:
    """Read one line (or one message a transport already decoded); None for a blank line."""
    if isinstance(line, dict):
        return _classify(line)
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Incoming(
                "invalid", rpc_error(None, PARSE_ERROR, f"parse error: not UTF-8 ({exc})")
            )
    if not line.strip():
        return None
    try:
        value = json.loads(line)
    except (ValueError, RecursionError) as exc:
        return Incoming("invalid", rpc_error(None, PARSE_ERROR, f"parse error: not JSON ({exc})"))
    if isinstance(value, list):
        return Incoming(
            "invalid",
            rpc_error(None, INVALID_REQUEST, "invalid request: JSON-RPC batches are not supported"),
        )
    if not isinstance(value, dict):
        return Incoming(
            "invalid",
            rpc_error(
                None,
                INVALID_REQUEST,
                f"invalid request: a message is a JSON object, not {type(value).__name__}",
            ),
        )
    return _classify(value)


def _classify(value: dict[str, Any]) -> Incoming:
    has_id = "id" in value
    request_id = value.get("id")
    answer_id = request_id if has_id and _usable_id(request_id) else None

    def invalid(why: str) -> Incoming:
        return Incoming("invalid", rpc_error(answer_id, INVALID_REQUEST, f"invalid request: {why}"))

    if value.get("jsonrpc") != "2.0":
        return invalid('"jsonrpc" must be "2.0"')
    if "method" in value:
        method = value["method"]
        if not isinstance(method, str) or not method:
            return invalid('"method" must be a non-empty string')
        params = value.get("params")
        if params is not None and not isinstance(params, dict):
            return invalid('"params" must be an object')
        if not has_id:
            return Incoming("notification", value)
        if not _usable_id(request_id):
            return invalid('"id" must be a string or an integer')
        return Incoming("request", value)
    if has_id and ("result" in value or "error" in value):
        if "result" in value and not isinstance(value["result"], dict):
            return invalid('a response\'s "result" must be an object')
        return Incoming("response", value)
    return invalid("neither a request, a notification nor a response")


class StdioChannel:
    """The proxy's stdin and (a duplicate of) its stdout, one JSON-RPC message per line."""

    def __init__(self) -> None:
        sys.stdout.flush()
        self._out_fd = os.dup(1)
        os.dup2(2, 1)  # from now on a stray print lands on stderr, not on the channel
        self._out: BinaryIO = os.fdopen(self._out_fd, "wb", buffering=0)
        self._lock = anyio.Lock()

    async def lines(self) -> AsyncIterator[bytes]:
        stdin = anyio.wrap_file(sys.stdin.buffer)
        async for line in stdin:
            yield line

    async def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        async with self._lock:
            await anyio.to_thread.run_sync(self._write, data)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = self._out.write(view)
            view = view[written or 0 :]

    def close(self) -> None:
        try:
            self._out.close()
        except OSError:
            pass
