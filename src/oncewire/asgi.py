"""An ASGI middleware that runs each keyed request once (the IETF httpapi Idempotency-Key draft).

The invariant: a response is stored under a key only in the transaction that also holds the
handler's own writes (:meth:`IdempotentRequest.write`), so a key's receipt exists exactly when
its work committed, and a repeat with the same key and request replays that response instead of
running the handler again.

For a request whose method is in ``methods`` and that carries ``Idempotency-Key``:

=========================================================  ====================================
the key                                                    answer
=========================================================  ====================================
has a stored response, for the same request (method,       the stored response, replayed, with
path, query and body)                                      ``Idempotent-Replayed: true``
has a stored response for another request                  422, nothing runs
is being processed by this middleware right now            409 (422 if the body differs)
is new                                                     the handler runs; its response is
                                                           stored with its writes, then sent
=========================================================  ====================================

A missing key passes through unless ``required`` says the route needs one: then 400, as does a
malformed key (empty, more than 255 characters, two headers). The fingerprint is method, path,
query string and a SHA-256 of the body.

What is stored: the status, the response headers worth replaying (not ``Date``, ``Server``,
``Set-Cookie``, ``Content-Length`` or hop-by-hop headers), and the body. A response is stored
only when the handler completed it with a status below 500. The handler raising, a 5xx, a
failure of its deferred writes or of the commit: nothing is stored and the key may be retried,
as the draft allows; a retry replays only a response that committed. The handler's response is
buffered whole (no streaming on keyed requests) and sent once its receipt committed.

409 is decided in this process. Two processes serving the same key at once both run their
handler, but only one of them commits: the other's writes are rolled back and it answers with
the committed response (the receipt's reservation makes the second wait or replay, as
:meth:`Receipts.run_once` does), so the work happens once either way.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import threading
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

from oncewire.core.canonical import canonical_json, digest_json
from oncewire.core.errors import ConfigurationError, PayloadConflict
from oncewire.receipts.service import ReceiptResult, Receipts
from oncewire.storage import Transaction

__all__ = ["IdempotencyKeyMiddleware", "IdempotentRequest"]

log = logging.getLogger("oncewire.asgi")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_KEY_CHARS = 255
REPLAYED_HEADER = "idempotent-replayed"
# Not replayed: they describe one transmission or one client, not the stored result.
_NOT_KEPT = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "date",
        "server",
        "set-cookie",
        "content-length",
    }
)


class IdempotentRequest:
    """What the middleware tells the handler of a keyed request, at ``request.state.idempotency``
    (``scope["state"]["idempotency"]``).

    ``write(fn)`` defers ``fn(tx)`` to the transaction that stores this request's response:
    the handler's rows and the receipt commit together or not at all. ``fn`` runs after the
    handler returned, in a worker thread, in the order given; ``tx.execute`` takes ``:name``
    placeholders with a dict, on every backend.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self._writes: list[Callable[[Transaction], object]] = []

    def write(self, fn: Callable[[Transaction], object]) -> None:
        self._writes.append(fn)


def _problem(status: int, title: str, detail: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    body = canonical_json({"title": title, "detail": detail, "status": status}).encode()
    return status, [(b"content-type", b"application/problem+json")], body


def _parse_key(values: list[bytes]) -> str | None:
    """The key from the header's values (a structured-field string, quoted or not); None when
    malformed."""
    if len(values) != 1:
        return None
    try:
        text = values[0].decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if not text or len(text) > MAX_KEY_CHARS or not text.isprintable():
        return None
    return text


def _stored(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> dict[str, Any]:
    kept = [
        [name.decode("latin-1"), value.decode("latin-1")]
        for name, value in headers
        if name.lower().decode("latin-1") not in _NOT_KEPT
    ]
    try:
        text, encoding = body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(body).decode("ascii"), "base64"
    return {"status": status, "headers": kept, "body": text, "body_encoding": encoding}


def _replay(stored: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    body_text = stored["body"]
    if stored.get("body_encoding") == "base64":
        body = base64.b64decode(body_text)
    else:
        body = body_text.encode("utf-8")
    headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in stored["headers"]]
    headers.append((REPLAYED_HEADER.encode(), b"true"))
    return int(stored["status"]), headers, body


async def _send_whole(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    headers = [(n, v) for n, v in headers if n.lower() != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class IdempotencyKeyMiddleware:
    """Run each request that carries ``Idempotency-Key`` once, backed by ``receipts`` (see the
    module's table).

    ``methods`` are the keyed methods (others pass through). ``required`` is a bool or a
    function of the ASGI scope saying whether the route needs a key. ``key_scope``, a function
    of the scope, namespaces keys (by API client or tenant: two clients must not share a key's
    response); without it, keys are global to the receipts store.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        receipts: Receipts,
        methods: Collection[str] = ("POST", "PATCH"),
        required: bool | Callable[[Scope], bool] = False,
        key_scope: Callable[[Scope], str] | None = None,
    ) -> None:
        # Refused here, where the mistake is made, not at the first keyed request.
        if not isinstance(receipts, Receipts):
            raise ConfigurationError(
                f"receipts must be an oncewire.Receipts, not {type(receipts).__name__}"
            )
        if isinstance(methods, str) or not all(isinstance(m, str) and m for m in methods):
            raise ConfigurationError("methods must be a collection of HTTP methods, like ('POST',)")
        if not isinstance(required, bool) and not callable(required):
            raise ConfigurationError("required must be True, False or a function of the scope")
        self.app = app
        self.receipts = receipts
        self.methods = frozenset(m.upper() for m in methods)
        self.required = required
        self.key_scope = key_scope
        self._lock = threading.Lock()
        self._in_flight: dict[str, str] = {}  # receipt key -> the request's digest

    def _requires_key(self, scope: Scope) -> bool:
        return self.required(scope) if callable(self.required) else bool(self.required)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"].upper() not in self.methods:
            await self.app(scope, receive, send)
            return
        values = [v for n, v in scope["headers"] if n.lower() == b"idempotency-key"]
        if not values:
            if self._requires_key(scope):
                detail = "this route requires an Idempotency-Key header"
                await _send_whole(send, *_problem(400, "Idempotency-Key missing", detail))
                return
            await self.app(scope, receive, send)
            return
        key = _parse_key(values)
        if key is None:
            detail = f"one Idempotency-Key of 1 to {MAX_KEY_CHARS} printable ASCII characters"
            await _send_whole(send, *_problem(400, "Idempotency-Key malformed", detail))
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client left before its request was whole: nothing to run
        if self.key_scope is not None:
            key = f"{self.key_scope(scope)}/{key}"
        payload = {
            "method": scope["method"].upper(),
            "path": scope.get("raw_path", scope["path"].encode()).decode("latin-1"),
            "query": scope.get("query_string", b"").decode("latin-1"),
            "body_sha256": hashlib.sha256(body).hexdigest(),
        }
        digest = digest_json(canonical_json(payload))
        with self._lock:
            running = self._in_flight.get(key)
            if running is None:
                self._in_flight[key] = digest
        if running is not None:
            if running != digest:
                await _send_whole(send, *_conflict_422())
            else:
                detail = "a request with this Idempotency-Key is still being processed"
                await _send_whole(send, *_problem(409, "request in progress", detail))
            return
        try:
            await self._once(scope, receive, send, key, payload, digest, body)
        finally:
            with self._lock:
                del self._in_flight[key]

    async def _once(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        key: str,
        payload: dict[str, Any],
        digest: str,
        body: bytes,
    ) -> None:
        try:
            existing = await asyncio.to_thread(self.receipts.store.get_receipt, key)
        except Exception:
            log.exception("reading the receipt of Idempotency-Key %r failed", key)
            detail = "the idempotency store could not be read; nothing was done"
            await _send_whole(send, *_problem(503, "try again", detail))
            return
        if existing is not None:
            if existing.digest != digest:
                await _send_whole(send, *_conflict_422())
            else:
                await _send_whole(send, *_replay(existing.result))
            return
        request = IdempotentRequest(key)
        state = dict(scope.get("state") or {})
        state["idempotency"] = request
        inner_scope = {**scope, "state": state}
        response = _Buffered()
        # Raises through to the server when the handler raises: nothing stored, key retryable.
        await self.app(inner_scope, _replaying(body, receive), response.send)
        if not response.complete or response.status >= 500:
            await response.forward(send)  # not stored: the key may be retried
            return
        status, headers, content = response.status, response.headers, b"".join(response.body)
        stored = _stored(status, headers, content)

        def commit(tx: Transaction) -> dict[str, Any]:
            for fn in request._writes:
                fn(tx)
            return stored

        try:
            result: ReceiptResult[Any] = await asyncio.to_thread(
                self.receipts.run_once, key, payload, commit
            )
        except PayloadConflict:  # another process stored another request under the key
            await _send_whole(send, *_conflict_422())
            return
        except Exception:
            log.exception("storing the response of Idempotency-Key %r failed", key)
            detail = "the response could not be stored; retry with the same key"
            await _send_whole(send, *_problem(500, "not stored", detail))
            return
        if result.replayed:  # another process committed this key first: its response wins
            await _send_whole(send, *_replay(result.result))
            return
        await _send_whole(send, status, headers, content)


def _conflict_422() -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    detail = "this Idempotency-Key was used with a different request"
    return _problem(422, "Idempotency-Key reused", detail)


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body already read, then the server's own messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class _Buffered:
    """Collects the app's response instead of sending it."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.started = False
        self.complete = False

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.started = True
            self.status = int(message["status"])
            self.headers = [(bytes(n), bytes(v)) for n, v in message.get("headers", [])]
        elif kind == "http.response.body" and self.started and not self.complete:
            self.body.append(bytes(message.get("body", b"")))
            self.complete = not message.get("more_body", False)
        # Anything else (trailers, extensions) is not part of what is stored or replayed.

    async def forward(self, send: Send) -> None:
        """Send what the app sent, as it sent it (a response that is not stored)."""
        if not self.started:
            return
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": b"".join(self.body), "more_body": False})
