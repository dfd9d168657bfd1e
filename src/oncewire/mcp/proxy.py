"""``oncewire mcp proxy``: between an MCP client and a server, every ``tools/call`` an effect.

The proxy is a message-level relay, not a server of its own: every JSON-RPC message passes
between the client (this process's stdin and stdout, :mod:`oncewire.mcp.proxy_wire`) and the
server (a child process on stdio, through the SDK's ``stdio_client``) unchanged, so the
handshake (``initialize`` or ``server/discover``), capabilities, ``tools/list``, resources,
prompts, sampling and elicitation, logging, progress and cancellation reach each side as the
other sent them, whatever the protocol revision. Only two things are the proxy's:

* request ids toward the server are the proxy's own (a counter), mapped back on the way out,
  so the proxy's own requests never collide with the client's and any id the client uses (a
  string, an integer of any size) comes back as it was sent;
* a ``tools/call`` of a tool that is not read-only is recorded as an effect before anything is
  forwarded and performed by the proxy's dispatcher (:mod:`oncewire.mcp.proxy_dispatch`); the
  client is answered from the store. :mod:`oncewire.mcp.proxy_calls` has the conventions (kind,
  payload, key, ``_meta``, what a repeat and an unknown outcome are answered with).

It learns the server's name and whether it deduplicates from the handshake's result, which tools
are read-only from ``tools/list`` (its own after the handshake and after a list_changed, and the
client's).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from oncewire.core.extras import refusal

try:
    import anyio
except ImportError as exc:  # anyio comes with the mcp extra
    raise refusal("mcp", "oncewire mcp proxy", exc) from exc

from oncewire.core.errors import InvalidState
from oncewire.effects.attempt import Attempt
from oncewire.effects.outcomes import Done, EffectOutcome, MaybeSent, NotSent, Rejected
from oncewire.ledger import Ledger
from oncewire.mcp import proxy_calls as calls
from oncewire.mcp.protocol import IDEMPOTENCY_KEY, REDELIVERY
from oncewire.mcp.proxy_dispatch import Dispatching, ForwardSink
from oncewire.mcp.proxy_state import (
    Intercepted,
    Live,
    NotSentYet,
    Relayed,
    Unfinished,
    id_key,
)
from oncewire.mcp.proxy_wire import INTERNAL_ERROR, INVALID_REQUEST, Incoming, parse_line, rpc_error
from oncewire.storage.records import TERMINAL_STATES, Effect, EffectState

__all__ = ["Proxy", "UpstreamGone"]

log = logging.getLogger("oncewire.mcp.proxy")

STAMP_PREFIX = "io.modelcontextprotocol/"  # the protocol's own per-request _meta stamps
POLL_SECONDS = 0.5  # the longest a waiting call sleeps without being woken
TOOLS_LIST_SECONDS = 30.0  # how long a call waits for the proxy's own tools/list


class UpstreamGone(Exception):
    """The server's connection ended."""


Send = Callable[[dict[str, Any]], Awaitable[None]]


class Proxy:
    """One client session relayed to one server (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        name: str | None = None,
        fallback_name: str = "server",
        redeliver: Iterable[str] = (),
        call_timeout: float | None = None,
        grace_seconds: float = 10.0,
    ) -> None:
        self.ledger = ledger
        self.name = name
        self.fallback_name = fallback_name
        self.redeliver = frozenset(redeliver)
        self.session_id = uuid.uuid4().hex
        self.server = calls.ServerFacts()
        self.loop = asyncio.get_running_loop()  # built on the loop it serves
        self.grace_seconds = grace_seconds
        self._ids = itertools.count(1)
        self._relayed: dict[int, Relayed] = {}
        self._own: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._intercepted: dict[str, Intercepted] = {}  # by the client's id, as JSON
        self._live: dict[str, Live] = {}
        self._claimable: frozenset[str] = frozenset()  # _live's keys, for the dispatcher thread
        self._stamps: dict[str, Any] = {}
        self._waiters: set[asyncio.Event] = set()
        self._ready = asyncio.Event()
        self._gone = False
        self._handshake_seen = False  # an initialize or server/discover result went by
        self._stopping = False  # the client's input ended: the server is closed on purpose
        self._refreshing: asyncio.Task[None] | None = None
        self._to_client: Send | None = None
        self._to_server: Send | None = None
        self.sink = ForwardSink(self)
        self.dispatching = Dispatching(
            ledger,
            self.sink,
            attempt_timeout=call_timeout,
            recorded=self._wake_threadsafe,
            claimable=lambda: self._claimable,
            grace_seconds=grace_seconds,
        )

    @property
    def server_name(self) -> str:
        return self.name or self.server.name or self.fallback_name

    def redelivers(self, tool: str) -> bool:
        """Whether a call of ``tool`` whose outcome is unknown is redelivered (flagged)."""
        return self.server.deduplicates or tool in self.redeliver

    def _kinds(self) -> list[str]:
        return [
            calls.call_kind(self.server_name, tool)
            for tool, read_only in self.server.read_only.items()
            if not read_only
        ]

    # -- running -------------------------------------------------------------------------------
    async def run(
        self,
        client_lines: Any,
        to_client: Send,
        server_read: Any,
        to_server: Send,
    ) -> None:
        """Relay until the client's input ends or the server's connection does."""
        self.loop = asyncio.get_running_loop()
        self._to_client, self._to_server = to_client, to_server
        unsubscribe = self.ledger.store.subscribe_settled(self._wake_threadsafe)
        try:
            async with anyio.create_task_group() as tg:

                async def from_server() -> None:
                    await self._from_server(server_read)
                    await self._drain()  # the calls under way are answered (unknown, mostly)
                    tg.cancel_scope.cancel()

                async def from_client() -> None:
                    async for line in client_lines:
                        incoming = parse_line(line)
                        if incoming is not None:
                            await self._from_client(incoming)
                    log.info("the client's input ended")
                    self._stopping = True
                    await self._drain()
                    tg.cancel_scope.cancel()

                tg.start_soon(from_server)
                tg.start_soon(from_client)
        finally:
            unsubscribe()
            self.sink.cancel_all()
            await anyio.to_thread.run_sync(self.dispatching.close)

    async def _drain(self) -> None:
        """The client is gone: let the calls under way finish (at most the grace period)."""
        tasks = [i.task for i in self._intercepted.values() if i.task is not None]
        if tasks:
            with anyio.move_on_after(self.grace_seconds):
                await asyncio.gather(*tasks, return_exceptions=True)

    def _wake_threadsafe(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop is closed
            pass

    def _wake(self) -> None:
        for event in list(self._waiters):
            event.set()

    async def _send_client(self, message: dict[str, Any]) -> None:
        assert self._to_client is not None
        await self._to_client(message)

    async def _send_server(self, message: dict[str, Any]) -> None:
        assert self._to_server is not None
        if self._gone:
            raise UpstreamGone("the server's connection has ended")
        try:
            await self._to_server(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            raise UpstreamGone("the server's connection has ended") from exc

    # -- from the client -----------------------------------------------------------------------
    async def _from_client(self, incoming: Incoming) -> None:
        message = incoming.message
        if incoming.kind == "invalid":
            log.warning("refused a message from the client: %s", message["error"]["message"])
            await self._send_client(message)
        elif incoming.kind == "response":  # to a request of the server's: its id is the server's
            await self._relay_to_server(message)
        elif incoming.kind == "notification":
            await self._client_notification(message)
        elif message["method"] == "tools/call":
            await self._intercept(message)
        else:
            await self._relay_request(message)

    async def _relay_to_server(self, message: dict[str, Any]) -> None:
        try:
            await self._send_server(message)
        except UpstreamGone:
            log.warning("dropped a message for the server: its connection has ended")
        except ValueError as exc:
            log.warning("dropped a message the SDK's model refuses: %s", exc)

    async def _relay_request(self, message: dict[str, Any]) -> None:
        method = message["method"]
        self._stamp(message)
        if method not in ("initialize", "server/discover", "ping"):
            self._ready.set()  # the client holds the handshake done
        upstream_id = next(self._ids)
        self._relayed[upstream_id] = Relayed(message["id"], method)
        try:
            await self._send_server({**message, "id": upstream_id})
        except UpstreamGone:
            self._relayed.pop(upstream_id, None)
            await self._send_client(
                rpc_error(message["id"], INTERNAL_ERROR, "the server's connection has ended")
            )
        except ValueError as exc:  # the SDK's model of a message refused it
            self._relayed.pop(upstream_id, None)
            await self._send_client(
                rpc_error(message["id"], INVALID_REQUEST, f"invalid request: {exc}"[:2000])
            )

    def _stamp(self, message: dict[str, Any]) -> None:
        meta = (message.get("params") or {}).get("_meta")
        if isinstance(meta, dict):
            stamps = {k: v for k, v in meta.items() if k.startswith(STAMP_PREFIX)}
            if stamps:
                self._stamps = stamps

    async def _client_notification(self, message: dict[str, Any]) -> None:
        method = message["method"]
        params = message.get("params") or {}
        if method == "notifications/cancelled" and "requestId" in params:
            request_id = params["requestId"]
            intercepted = self._intercepted.get(id_key(request_id))
            if intercepted is not None:
                await self._cancel_call(intercepted, params.get("reason"))
                return
            for upstream_id, relayed in self._relayed.items():
                if relayed.client_id == request_id and type(relayed.client_id) is type(request_id):
                    message = {**message, "params": {**params, "requestId": upstream_id}}
                    break
            else:
                # Not a request in flight here (answered already, or never sent). Relayed as it
                # came, its id would name whichever request of the proxy's own numbering has it,
                # and cancel a call of somebody else's.
                log.info("dropped a cancellation for request %r: none is in flight", request_id)
                return
        await self._relay_to_server(message)
        if method == "notifications/initialized":
            self._ready.set()
            self._start_refresh()

    # -- from the server -----------------------------------------------------------------------
    async def _from_server(self, server_read: Any) -> None:
        try:
            async for item in server_read:
                if isinstance(item, Exception):
                    log.warning("the server sent a line that is not a JSON-RPC message: %s", item)
                    continue
                message = item.message.model_dump(by_alias=True, exclude_unset=True, mode="json")
                await self._server_message(message)
        finally:
            await self._upstream_ended()

    async def _server_message(self, message: dict[str, Any]) -> None:
        if "method" in message:  # a request or notification of the server's: as it is
            if message["method"] == "notifications/tools/list_changed":
                self.server.fresh = False
            await self._send_client(message)
            return
        upstream_id = message.get("id")
        if not isinstance(upstream_id, int):
            log.warning("the server answered a request the proxy never sent: %r", upstream_id)
            return
        own = self._own.pop(upstream_id, None)
        if own is not None:
            if not own.done():
                own.set_result(message)
            return
        relayed = self._relayed.pop(upstream_id, None)
        if relayed is None:
            log.warning("the server answered a request the proxy never sent: %r", upstream_id)
            return
        result = message.get("result")
        if isinstance(result, dict):
            self._learn(relayed.method, result)
        await self._send_client({**message, "id": relayed.client_id})

    def _learn(self, method: str, result: dict[str, Any]) -> None:
        self.server.learn(method, result)
        if method in ("initialize", "server/discover"):
            self._handshake_seen = True
        if method == "server/discover":  # a 2026 session: no notifications/initialized
            self._ready.set()
            self._start_refresh()

    async def _upstream_ended(self) -> None:
        self._gone = True
        self._ready.set()  # a forward waiting for the handshake finds the server gone
        if not self._stopping:
            log.warning("the server's connection ended")
        for future in self._own.values():
            if not future.done():
                future.set_exception(UpstreamGone("the server exited with the call in flight"))
        for relayed in self._relayed.values():
            await self._send_client(
                rpc_error(relayed.client_id, INTERNAL_ERROR, "the server exited before answering")
            )
        self._relayed.clear()
        self._wake()

    # -- the proxy's own requests --------------------------------------------------------------
    async def _request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        upstream_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        self._own[upstream_id] = future
        try:
            await self._send_server(
                {"jsonrpc": "2.0", "id": upstream_id, "method": method, "params": params}
            )
            return await future
        finally:
            self._own.pop(upstream_id, None)

    def _start_refresh(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = self.loop.create_task(self._refresh_tools())

    async def _refresh_tools(self) -> None:
        """Every page of the server's tools/list: which tools are read-only. A 2026 client
        pinned to its version sends no handshake: the proxy asks ``server/discover`` itself
        first (with the client's stamps), for the server's name and capabilities."""
        cursor: str | None = None
        try:
            if not self._handshake_seen and self._stamps:
                reply = await self._request("server/discover", {"_meta": dict(self._stamps)})
                if isinstance(reply.get("result"), dict):
                    self._handshake_seen = True
                    self.server.learn("server/discover", reply["result"])
            for _ in range(1000):
                params: dict[str, Any] = {"_meta": dict(self._stamps)} if self._stamps else {}
                if cursor is not None:
                    params["cursor"] = cursor
                reply = await self._request("tools/list", params)
                result = reply.get("result")
                if not isinstance(result, dict):
                    log.warning("the server's tools/list failed: %s", reply.get("error"))
                    return
                self.server.learn_tools(result)
                cursor = result.get("nextCursor")
                if not isinstance(cursor, str) or not cursor:
                    break
            self.server.fresh = True
        except UpstreamGone:
            return
        self.dispatching.serve(self._kinds())

    async def _tools_known(self) -> None:
        if self.server.fresh or self._gone:
            return
        self._start_refresh()
        assert self._refreshing is not None
        with anyio.move_on_after(TOOLS_LIST_SECONDS):
            await asyncio.shield(self._refreshing)

    # -- tools/call ----------------------------------------------------------------------------
    async def _intercept(self, message: dict[str, Any]) -> None:
        first = self._intercepted.get(id_key(message["id"]))
        if first is not None:
            await self._resent(message, first)
            return
        self._stamp(message)
        self._ready.set()
        intercepted = Intercepted(params=message.get("params"))
        self._intercepted[id_key(message["id"])] = intercepted
        intercepted.task = self.loop.create_task(self._call(message, intercepted))

    async def _resent(self, message: dict[str, Any], first: Intercepted) -> None:
        """A tools/call under the id of a call in flight here: each id gets one answer. The
        same request again (a resend) is answered by the first one's answer; another request
        under that id is refused with an error whose id is null (its id names the call in
        flight), nothing recorded or forwarded."""
        shown = json.dumps(message["id"])[:100]
        if message.get("params") == first.params:
            log.info("tools/call %s sent again while in flight: it gets the one answer", shown)
            return
        log.warning("refused a tools/call under the id %s of a call in flight", shown)
        text = (
            f"refused a tools/call under the request id {shown}, which names a tools/call still "
            "in flight with other params: nothing was recorded or forwarded (the id of a "
            "request must not be reused until it is answered)"
        )
        await self._send_client(rpc_error(None, INVALID_REQUEST, text))

    async def _call(self, message: dict[str, Any], intercepted: Intercepted) -> None:
        request_id = message["id"]
        reply: dict[str, Any] | None
        try:
            reply = await self._answer_call(message, intercepted)
        except calls.BadCall as exc:
            reply = {"jsonrpc": "2.0", "id": request_id, "error": exc.error()}
        except NotSentYet as exc:  # not run, still to be: unanswered, as any request it left
            reply = rpc_error(request_id, INTERNAL_ERROR, calls.not_sent_message(exc.effect))
        except Unfinished as exc:
            reply = {
                "jsonrpc": "2.0",
                "id": request_id,
                "result": calls.unfinished_result(exc.effect),
            }
        except asyncio.CancelledError:
            if not intercepted.cancelled:
                raise
            return  # the client cancelled it: no answer (the spec's SHOULD NOT)
        except Exception as exc:  # a store that failed: said, never hidden
            log.exception("a tools/call failed in the proxy")
            reply = rpc_error(request_id, INTERNAL_ERROR, f"the proxy failed: {exc}")
        finally:
            if self._intercepted.get(id_key(request_id)) is intercepted:
                del self._intercepted[id_key(request_id)]
        if reply is not None:
            await self._send_client(reply)

    async def _answer_call(
        self, message: dict[str, Any], intercepted: Intercepted
    ) -> dict[str, Any] | None:
        request_id = message["id"]
        call = calls.read_call(message.get("params"))
        await self._tools_known()
        if self.server.read_only.get(call.tool) is True:  # no effect: relayed as it is
            self._intercepted.pop(id_key(request_id), None)
            await self._relay_request(message)  # its answer (and a cancel) goes as any other
            return None
        key = call.key or f"{self.session_id}:{json.dumps(request_id)}"
        intercepted.key = key
        kind = calls.call_kind(self.server_name, call.tool)
        attempts = calls.REDELIVER_ATTEMPTS if self.redelivers(call.tool) else 1
        effect = await anyio.to_thread.run_sync(
            calls.accept, self.ledger, key, kind, call.payload, attempts
        )
        calls.AFTER_ACCEPT.hit()
        intercepted.accepted = True
        if intercepted.cancelled:  # while its accept committed: withdrawn now, not answered
            await self._withdraw(intercepted)
            return None
        live = self._live.get(key)
        if live is None:
            live = self._live[key] = Live(meta=call.meta)
            self._claimable = frozenset(self._live)  # before serve() wakes the dispatcher
        live.waiting += 1
        try:
            if effect.state not in TERMINAL_STATES:
                self.dispatching.serve([kind])
                effect = await self._settled(key)
            calls.AFTER_SETTLED.hit()
            return {"jsonrpc": "2.0", "id": request_id, **self._result(effect, live)}
        finally:
            live.waiting -= 1
            if not live.waiting:
                self._live.pop(key, None)
                self._claimable = frozenset(self._live)

    def _result(self, effect: Effect, live: Live) -> dict[str, Any]:
        if effect.state is EffectState.DONE and live.result is not None:
            return {"result": live.result}
        if effect.state is EffectState.REJECTED and live.error is not None:
            return {"error": live.error}
        return {"result": calls.answer(effect)}

    async def _settled(self, key: str) -> Effect:
        """The call's effect once it has ended, read from the store (whoever ended it)."""
        while True:
            event = asyncio.Event()
            self._waiters.add(event)
            try:
                effect = await anyio.to_thread.run_sync(self.ledger.effects.get, key)
                if effect.state in TERMINAL_STATES:
                    return effect
                if self._gone and effect.state is EffectState.PENDING:
                    raise NotSentYet(effect)  # never written to a server: it did not run
                if self._gone and effect.state is not EffectState.CLAIMED:
                    raise Unfinished(effect)
                with anyio.move_on_after(POLL_SECONDS):
                    await event.wait()
            finally:
                self._waiters.discard(event)

    async def _cancel_call(self, intercepted: Intercepted, reason: Any) -> None:
        intercepted.cancelled = True
        intercepted.reason = "the client cancelled the call (notifications/cancelled)"
        if isinstance(reason, str) and reason:
            intercepted.reason += f": {reason[:200]}"
        if intercepted.key is not None and not intercepted.accepted:
            return  # its accept may be committing: _answer_call withdraws it when it returns
        if intercepted.accepted:
            await self._withdraw(intercepted)
        if intercepted.task is not None:
            intercepted.task.cancel()

    async def _withdraw(self, intercepted: Intercepted) -> None:
        """Cancel the call's effect (a claim in flight may land: the store says so) and tell
        the server when its request is out."""
        key = intercepted.key
        assert key is not None
        try:
            await anyio.to_thread.run_sync(self.ledger.effects.cancel, key, intercepted.reason)
        except InvalidState:
            pass  # it had ended: nothing to withdraw
        live = self._live.get(key)
        if live is not None and live.upstream_id is not None:
            await self._tell_cancelled(live.upstream_id, intercepted.reason)

    async def _tell_cancelled(self, upstream_id: int, reason: str) -> None:
        try:
            await self._send_server(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": {"requestId": upstream_id, "reason": reason},
                }
            )
        except UpstreamGone:
            pass

    # -- the sink's side, on the loop ------------------------------------------------------------
    async def forward(self, attempt: Attempt) -> EffectOutcome:
        """Send the attempt's call to the server and read what it answers (a typed outcome)."""
        await self._ready.wait()
        if self._gone:
            return NotSent("the server is not running")
        tool, arguments = attempt.payload["tool"], attempt.payload["arguments"]
        live = self._live.get(attempt.key)
        meta = dict(live.meta) if live is not None else dict(self._stamps)
        meta[IDEMPOTENCY_KEY] = attempt.key
        meta[REDELIVERY] = attempt.redelivery
        upstream_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        self._own[upstream_id] = future
        request = {
            "jsonrpc": "2.0",
            "id": upstream_id,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": meta},
        }
        try:
            try:
                await self._send_server(request)
            except UpstreamGone:
                return NotSent("the server's connection had ended; the call was not sent")
            if live is not None:
                live.upstream_id = upstream_id
            try:
                reply = await future
            except UpstreamGone as exc:
                return MaybeSent(f"{exc}: it may have run")
            except asyncio.CancelledError:  # timed out, or the proxy is stopping
                self.loop.create_task(self._tell_cancelled(upstream_id, "timed out in the proxy"))
                raise
        finally:
            self._own.pop(upstream_id, None)
            if live is not None and live.upstream_id == upstream_id:
                live.upstream_id = None
        error = reply.get("error")
        if error is not None:
            outcome = calls.error_outcome(error)
            if live is not None and isinstance(outcome, Rejected):
                live.error = error
            return outcome
        result = reply.get("result")
        if live is not None and isinstance(result, dict):
            live.result = result
        return Done(result)
