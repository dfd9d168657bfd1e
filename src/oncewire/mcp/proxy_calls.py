"""What ``oncewire mcp proxy`` records for a ``tools/call`` and what it answers: the conventions.

Nothing here needs the ``mcp`` package; the proxy (:mod:`oncewire.mcp.proxy`) speaks the wire.

The conventions (the integrator's docs/mcp.md repeats them):

* **Which calls are effects.** Every ``tools/call`` of a tool the server does not annotate
  ``readOnlyHint: true`` (in its ``tools/list``), and of a tool the proxy has not seen listed.
  A read-only tool's call is relayed as it is, with no effect.
* **kind** ``mcp.<server>.<tool>``: ``<server>`` is ``--name``, by default the ``serverInfo.name``
  of the server's ``initialize`` (or ``server/discover``) result.
* **payload** ``{"tool": <name>, "arguments": <the arguments object>}`` (``{}`` when the client
  sends none).
* **key** the client's ``params._meta["io.oncewire/idempotency-key"]``, else SEP-3182's
  ``params.idempotencyKey``, else ``<proxy session id>:<JSON-RPC id>`` (a resend of the same
  request within one proxy's session is answered once; a new session never reuses it). The same
  key with another tool or other arguments is the JSON-RPC error :data:`CONFLICT_CODE`
  (-32602, invalid params) naming the conflict; nothing is recorded or forwarded.
* **forwarded** ``params._meta`` carries the client's ``_meta`` (a progress token, the protocol's
  own stamps) plus ``io.oncewire/idempotency-key`` (the key) and ``io.oncewire/redelivery``
  (true when an earlier attempt may have reached the server).
* **result** the server's ``CallToolResult`` is the effect's result, as JSON (an ``isError``
  result too: the tool ran and said so); a repeat of a key that is ``done`` is answered with it,
  without calling the server. A JSON-RPC error from the server is ``rejected`` (the server
  refused the call): the live call is answered with that error, a repeat with an ``isError``
  result saying the tool refused it; but an internal error (-32603, which the SDK's HTTP
  transport also gives for an HTTP 5xx), a parse error (-32700) or a connection-closed error
  (-32000, which the SDK's HTTP transport gives when the response stream ends without an
  answer) does not say the call did not run: its outcome is unknown.
* **outcome unknown** (the proxy died after forwarding, the server exited or timed out with the
  call in flight, the client cancelled it after it left): the effect ends ``dead`` (or
  ``cancelled``) with the store's ``maybe_sent``, and the call, and every repeat of its key, is
  answered with an ``isError`` result that begins :data:`~oncewire.toolcalls.UNKNOWN_OUTCOME`.
  It is never run again silently. A tool named by ``--redeliver``, or every tool of a server
  that declares ``capabilities.experimental["io.oncewire/deduplicates"]``, is redelivered with
  the flag instead (up to :data:`REDELIVER_ATTEMPTS` attempts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oncewire.core import crash
from oncewire.core.errors import OncewireError, PayloadConflict, StorageError
from oncewire.effects.outcomes import MaybeSent, Rejected
from oncewire.ledger import Ledger
from oncewire.mcp.protocol import DEDUPLICATES, IDEMPOTENCY_KEY, SEP_IDEMPOTENCY_KEY
from oncewire.storage.records import Effect, EffectState
from oncewire.toolcalls import UNKNOWN_OUTCOME, effect_content

__all__ = [
    "AFTER_ACCEPT",
    "AFTER_FORWARD",
    "AFTER_SETTLED",
    "BEFORE_FORWARD",
    "CONFLICT_CODE",
    "NOT_REDELIVERED",
    "REDELIVER_ATTEMPTS",
    "BadCall",
    "CallRequest",
    "ServerFacts",
    "accept",
    "answer",
    "call_kind",
    "error_outcome",
    "error_result",
    "not_sent_message",
    "read_call",
    "unfinished_result",
]

SERVER_INFO = "io.modelcontextprotocol/serverInfo"  # a 2026 discover result's _meta stamp

AFTER_ACCEPT = crash.register(
    "mcp.proxy.after_accept",
    "a tools/call's effect is committed; the proxy has not answered or forwarded it",
)
BEFORE_FORWARD = crash.register(
    "mcp.proxy.before_forward",
    "the call's claim is recorded as starting; the request has not been written to the server",
)
AFTER_FORWARD = crash.register(
    "mcp.proxy.after_forward",
    "the server answered the call; its result is not stored",
)
AFTER_SETTLED = crash.register(
    "mcp.proxy.after_settled",
    "the call's outcome is stored; the client has not been answered",
)

# JSON-RPC "invalid params": a call the proxy refuses (a key bound to another call, no name).
CONFLICT_CODE = -32602
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603  # the store failed: the call was not recorded
# Attempts of a redeliverable call (--redeliver, or a server that deduplicates); every other
# call gets one: an attempt whose outcome is unknown is never made again.
REDELIVER_ATTEMPTS = 5
NOT_REDELIVERED = (
    "not redelivered: an earlier attempt may have reached the server, which does not say it "
    "deduplicates (oncewire mcp proxy --redeliver TOOL would redeliver it)"
)


class BadCall(ValueError):
    """A ``tools/call`` the proxy answers with a JSON-RPC error, recording nothing."""

    def __init__(self, message: str, code: int = INVALID_PARAMS, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.data = data

    def error(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": str(self)}
        if self.data is not None:
            error["data"] = self.data
        return error


@dataclass(frozen=True, slots=True)
class CallRequest:
    """A ``tools/call`` read: the tool, its arguments, the client's ``_meta`` and the key."""

    tool: str
    arguments: dict[str, Any]
    meta: dict[str, Any]
    key: str | None  # the client's own key; None: the proxy derives one

    @property
    def payload(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": self.arguments}


def read_call(params: Any) -> CallRequest:
    """The call in ``params``, or :class:`BadCall` saying what is wrong with it."""
    if params is None:
        raise BadCall("tools/call needs params: {name, arguments}")
    if not isinstance(params, Mapping):
        raise BadCall(f"tools/call params must be an object, not {type(params).__name__}")
    tool = params.get("name")
    if not isinstance(tool, str) or not tool:
        raise BadCall("tools/call params.name must be the tool's name (a non-empty string)")
    arguments = params.get("arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise BadCall(
            f"tools/call params.arguments must be an object, not {type(arguments).__name__}"
        )
    meta = params.get("_meta")
    if meta is None:
        meta = {}
    if not isinstance(meta, Mapping):
        raise BadCall(f"tools/call params._meta must be an object, not {type(meta).__name__}")
    key = meta.get(IDEMPOTENCY_KEY)
    where = f"params._meta[{IDEMPOTENCY_KEY!r}]"
    if key is None:
        key = params.get(SEP_IDEMPOTENCY_KEY)
        where = f"params.{SEP_IDEMPOTENCY_KEY}"
    if key is not None and (not isinstance(key, str) or not key):
        raise BadCall(f"{where} must be a non-empty string, not {json.dumps(key)[:80]}")
    return CallRequest(tool, dict(arguments), dict(meta), key)


def accept(ledger: Ledger, key: str, kind: str, payload: dict[str, Any], attempts: int) -> Effect:
    """The call's effect, recorded now or before under ``key`` (blocking: run in a thread); a
    :class:`BadCall` that says why when it cannot be, nothing recorded."""
    try:
        return ledger.effects.accept_alone(key, kind, payload, max_attempts=attempts)[0]
    except PayloadConflict as exc:
        raise BadCall(
            f"conflict: the idempotency key {key!r} is already bound to another call (another "
            "tool or other arguments); this call was refused and not forwarded",
            CONFLICT_CODE,
            {"key": key, "conflict": exc.code},
        ) from exc
    except StorageError as exc:
        raise BadCall(
            f"the proxy could not record the call, so it was not forwarded: {exc}",
            INTERNAL_ERROR,
        ) from exc
    except OncewireError as exc:  # a key, kind or payload the store refuses
        raise BadCall(f"the call cannot be recorded, so it was not forwarded: {exc}") from exc


# The error the SDK's streamable HTTP transport resolves a request with when the response
# stream ends without an answer (the server died or the connection broke after the request
# left): mcp_types.CONNECTION_CLOSED.
CONNECTION_CLOSED = -32000
# JSON-RPC errors that do not say the call did not run: the server failed while handling it
# (internal error; the SDK's transports also answer it for an HTTP 5xx), its answer could not
# be read (parse error), or the connection ended before it came (connection closed). Every
# other code is the server refusing the call.
MAYBE_RAN_CODES = frozenset({INTERNAL_ERROR, -32700, CONNECTION_CLOSED})


def error_outcome(error: Any) -> MaybeSent | Rejected:
    """What a JSON-RPC error answering a forwarded call says happened, by its code."""
    code = error.get("code") if isinstance(error, Mapping) else None
    text = error.get("message") if isinstance(error, Mapping) else error
    if code in MAYBE_RAN_CODES:
        return MaybeSent(
            f"the server failed while handling the call: JSON-RPC error {code}: {text}"
        )
    return Rejected(f"the server refused the call: JSON-RPC error {code}: {text}")


def call_kind(server: str, tool: str) -> str:
    """The effect kind of a call of ``tool`` on ``server``."""
    return f"mcp.{server}.{tool}"


def error_result(text: str) -> dict[str, Any]:
    """A ``CallToolResult`` with ``isError`` that tells the model ``text``. It says it is a
    whole result (``resultType``), as the 2026-07-28 schema requires and a client of it checks;
    a client of an earlier revision reads it as an extra field, which results may carry."""
    return {"content": [{"type": "text", "text": text}], "isError": True, "resultType": "complete"}


def answer(effect: Effect) -> dict[str, Any]:
    """The ``CallToolResult`` for a terminal effect, from the store alone (a repeat of its key,
    or a call answered by another process): the stored result of a ``done`` one; for any other
    an ``isError`` result in the words :func:`oncewire.toolcalls.effect_content` tells a model
    ("outcome unknown: the tool may or may not have run; do not assume either ...")."""
    if effect.state is EffectState.DONE:
        stored = None if effect.result_json is None else json.loads(effect.result_json)
        if isinstance(stored, dict) and isinstance(stored.get("content"), list):
            return stored
        why = effect.last_error or "the server's answer was not stored"
        return error_result(f"the tool ran, but its result cannot be replayed: {why}")
    return error_result(effect_content(effect))


def not_sent_message(effect: Effect) -> str:
    """The JSON-RPC error message for a call the server's exit left unsent (``pending``): it
    has not run, and the proxy the client retries it through with its key performs it."""
    return (
        "the server exited before this call was sent: it has not run; it stays recorded under "
        f"its key {effect.key!r}, and a retry with that key is answered with its outcome"
    )


def unfinished_result(effect: Effect) -> dict[str, Any]:
    """The answer to a call whose server went away before its effect ended."""
    return error_result(
        f"{UNKNOWN_OUTCOME} (the server exited before the call ended; it stays recorded under "
        f"its key {effect.key!r} and a retry with that key is answered with its outcome)"
    )


@dataclass
class ServerFacts:
    """What the proxy learns of its server from the answers it relays."""

    name: str | None = None  # serverInfo.name
    protocol_version: str | None = None  # the version initialize negotiated
    deduplicates: bool = False  # capabilities.experimental["io.oncewire/deduplicates"]
    read_only: dict[str, bool] = field(default_factory=dict)  # tool -> readOnlyHint is true
    fresh: bool = False  # read_only holds the whole of the latest tools/list

    def learn(self, method: str, result: Mapping[str, Any]) -> None:
        """From a result of ``method`` the server gave."""
        if method in ("initialize", "server/discover"):
            info = result.get("serverInfo")
            if info is None:
                meta = result.get("_meta")
                info = meta.get(SERVER_INFO) if isinstance(meta, Mapping) else None
            if isinstance(info, Mapping) and isinstance(info.get("name"), str) and info["name"]:
                self.name = info["name"]
            version = result.get("protocolVersion")
            if isinstance(version, str) and version:
                self.protocol_version = version
            capabilities = result.get("capabilities")
            experimental = (
                capabilities.get("experimental") if isinstance(capabilities, Mapping) else None
            )
            self.deduplicates = isinstance(experimental, Mapping) and isinstance(
                experimental.get(DEDUPLICATES), Mapping
            )
        elif method == "tools/list":
            self.learn_tools(result)

    def learn_tools(self, result: Mapping[str, Any]) -> None:
        """From one page of tools/list."""
        tools = result.get("tools")
        for tool in tools if isinstance(tools, list) else []:
            if isinstance(tool, Mapping) and isinstance(tool.get("name"), str):
                annotations = tool.get("annotations")
                self.read_only[tool["name"]] = (
                    isinstance(annotations, Mapping) and annotations.get("readOnlyHint") is True
                )
