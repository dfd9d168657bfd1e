"""A fake generic webhook platform (a chat that cannot edit), run as its own process.

``python -m oncewire.testing.webhook_platform --port 0 --journal DIR [--name noedit]
[--secret-env VAR] [--deliver-to URL] [--honour-idempotency-key] [--fault JSON]... [--host H]``
prints ``ready port=N`` once it listens. The contract is oncewire's own (see
:mod:`oncewire.gateway.platforms.webhook`):

* ``POST /messages`` ``{"chat", "thread", "text", "reply_to"}`` → ``200 {"message_id"}``;
  400 ``{"error"}`` for a bad body or a text over 4096 code points; 401 for a missing or wrong
  ``Oncewire-Signature`` when a secret is set. With ``--honour-idempotency-key`` a repeated
  ``Idempotency-Key`` with the same message answers the message already made (no second copy)
  and with another message 409; without it (the default) every POST is a message of its own.
* Inbound: ``POST /control/inject`` ``{"chat", "text", "thread"?, "message_id"?}`` queues a
  user message, which the fake POSTs as ``{"message_id", "chat", "thread", "text"}`` (signed) to
  ``--deliver-to`` and retries until it answers 2xx; ``/control/redeliver`` ``{"message_id"}``
  delivers one again (a platform's re-delivery). Deliveries not yet answered 2xx are resumed by a
  restarted fake.

What the chat shows is journaled by a :class:`~oncewire.testing.FakePlatform` to
``DIR/chat.jsonl`` (fsync before the answer; :class:`~oncewire.testing.ChatView` reads
it); inbound messages and delivery attempts go to ``DIR/inbound.jsonl``, honoured keys to
``DIR/keys.jsonl`` (both fsync), every call to ``DIR/calls.jsonl``. Faults are armed with
``--fault`` or ``/control/fault`` in the fake platform's vocabulary
(:mod:`oncewire.testing.control`: ``rate_limit`` is a 429 with ``Retry-After``, ``rejected`` a
403, ``conn_error`` a blackout);
``/control/release`` lets parked requests go on; ``/control/state`` reports deliveries and the
faults fired.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from email.message import Message
from pathlib import Path
from typing import Any

from oncewire.replies.wire import (
    NON_EDITABLE,
    Delivered,
    NotDelivered,
    RejectedForGood,
)
from oncewire.storage.replies import SendRequest
from oncewire.testing.control import (
    ControlHandler,
    FakeServer,
    PlatformFake,
    announce_and_serve,
    fake_parser,
    faults_fired,
    fsynced_append,
    print_error,
    startup_faults,
)
from oncewire.testing.fake_platform import ChatView, Fault

__all__ = ["WebhookFake", "main", "serve"]

SIGNATURE_HEADER = "Oncewire-Signature"
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
# Delivery retries: the first wait, doubled after each failure up to the last.
RETRY_FIRST_SECONDS = 0.1
RETRY_MAX_SECONDS = 2.0

Reply = tuple[int, Any, dict[str, str]]  # (status, body, headers); body None: no answer


def _sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class WebhookFake(PlatformFake):
    """The fake's state: the chat (a journaled FakePlatform), honoured keys, deliveries."""

    def __init__(
        self,
        directory: Path,
        *,
        name: str = "noedit",
        secret: str | None = None,
        deliver_to: str | None = None,
        honour_keys: bool = False,
        faults: Sequence[Fault] = (),
    ) -> None:
        super().__init__(directory, NON_EDITABLE, name=name, faults=faults)
        self.secret = secret
        self.deliver_to = deliver_to
        self.honour_keys = honour_keys
        self._lock = threading.Lock()
        self._keys: dict[str, tuple[str, str]] = {}  # key -> (message id, message digest)
        keys_path = directory / "keys.jsonl"
        for entry in _read(keys_path):
            self._keys[entry["key"]] = (entry["message_id"], entry["digest"])
        self._keys_fd = os.open(keys_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._inbound: dict[str, dict[str, Any]] = {}  # message id -> message
        self._attempts: dict[str, int] = {}
        self._delivered: set[str] = set()
        inbound_path = directory / "inbound.jsonl"
        for entry in _read(inbound_path):
            if "message" in entry:
                self._inbound[entry["message"]["message_id"]] = entry["message"]
            elif "attempt" in entry:
                mid = entry["attempt"]
                self._attempts[mid] = self._attempts.get(mid, 0) + 1
                if 200 <= entry["status"] < 300:
                    self._delivered.add(mid)
        self._inbound_fd = os.open(inbound_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._queue: queue.Queue[str] = queue.Queue()
        for message_id in self._inbound:
            if message_id not in self._delivered:
                self._queue.put(message_id)
        threading.Thread(target=self._deliver_forever, daemon=True).start()

    # -- outbound ----------------------------------------------------------------------------
    def post_message(self, headers: Message[str, str], raw: bytes) -> Reply:
        if self.secret is not None:
            signature = headers.get(SIGNATURE_HEADER)
            if signature is None or not hmac.compare_digest(_sign(self.secret, raw), signature):
                return 401, {"error": "missing or wrong signature"}, {}
        try:
            message = _message(raw)
        except ValueError as exc:
            return 400, {"error": str(exc)}, {}
        key = headers.get(IDEMPOTENCY_KEY_HEADER) if self.honour_keys else None
        digest = hashlib.sha256(json.dumps(message, sort_keys=True).encode()).hexdigest()
        if key is not None:
            with self._lock:
                known = self._keys.get(key)
            if known is not None and known[1] == digest:
                return 200, {"message_id": known[0], "replayed": True}, {}
            if known is not None:
                return 409, {"error": "Idempotency-Key reused with another message"}, {}
        request = SendRequest(
            self.name, "bot", message["chat"], message["thread"], message["reply_to"]
        )
        outcome = self.chats.send(request, message["text"], marked=False)
        if isinstance(outcome, Delivered):
            self._remember(key, outcome.message_id, digest)
            return 200, {"message_id": outcome.message_id}, {}
        if isinstance(outcome, NotDelivered):
            after = max(1, math.ceil(outcome.retry_after or 1))
            return 429, {"error": "rate limited", "retry_after": after}, {"retry-after": str(after)}
        if isinstance(outcome, RejectedForGood):
            return 403, {"error": "forbidden: the chat refuses messages"}, {}
        if key is not None:  # applied without an answer (ack_lost, hold_after)?
            landed = self._landed(message["chat"], message["text"])
            if landed is not None:
                self._remember(key, landed, digest)
        return 0, None, {}

    def _remember(self, key: str | None, message_id: str, digest: str) -> None:
        if key is None:
            return
        with self._lock:
            fsynced_append(self._keys_fd, {"key": key, "message_id": message_id, "digest": digest})
            self._keys[key] = (message_id, digest)

    def _landed(self, chat: str, text: str) -> str | None:
        with self._lock:
            claimed = {message_id for message_id, _ in self._keys.values()}
        for shown in reversed(ChatView([self.journal]).visible(self.name, chat)):
            if shown.text == text and shown.message_id not in claimed:
                return shown.message_id
        return None

    # -- inbound -----------------------------------------------------------------------------
    def inject(self, params: Mapping[str, Any]) -> dict[str, Any]:
        if self.deliver_to is None:
            raise ValueError("the fake was started without --deliver-to")
        message = {
            "chat": params.get("chat"),
            "thread": params.get("thread", ""),
            "text": params.get("text"),
        }
        if not all(isinstance(v, str) for v in message.values()) or not message["chat"]:
            raise ValueError("inject needs chat and text strings (and thread, if any)")
        with self._lock:
            message_id = params.get("message_id") or f"u{len(self._inbound) + 1}"
            if not isinstance(message_id, str) or message_id in self._inbound:
                raise ValueError(f"message_id {message_id!r} is taken or not a string")
            message["message_id"] = message_id
            fsynced_append(self._inbound_fd, {"message": message})
            self._inbound[message_id] = message
        self._queue.put(message_id)
        return {"message_id": message_id}

    def redeliver(self, params: Mapping[str, Any]) -> dict[str, Any]:
        message_id = params.get("message_id")
        with self._lock:
            if message_id not in self._inbound:
                raise ValueError(f"no injected message {message_id!r}")
        self._queue.put(str(message_id))
        return {"message_id": message_id}

    def _deliver_forever(self) -> None:
        while True:
            message_id = self._queue.get()
            wait = RETRY_FIRST_SECONDS
            while not self._deliver_once(message_id):
                time.sleep(wait)
                wait = min(wait * 2, RETRY_MAX_SECONDS)

    def _deliver_once(self, message_id: str) -> bool:
        assert self.deliver_to is not None
        with self._lock:
            body = json.dumps(self._inbound[message_id]).encode()
        request = urllib.request.Request(self.deliver_to, data=body, method="POST")
        request.add_header("content-type", "application/json")
        if self.secret is not None:
            request.add_header(SIGNATURE_HEADER, _sign(self.secret, body))
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                status = int(answer.status)
        except urllib.error.HTTPError as exc:
            status = exc.code
        except OSError:
            status = 0  # not reached
        with self._lock:
            fsynced_append(self._inbound_fd, {"attempt": message_id, "status": status})
            self._attempts[message_id] = self._attempts.get(message_id, 0) + 1
            if 200 <= status < 300:
                self._delivered.add(message_id)
        return 200 <= status < 300

    # -- control -----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        with self._lock:
            inbound = [
                {
                    "message_id": message_id,
                    "attempts": self._attempts.get(message_id, 0),
                    "delivered": message_id in self._delivered,
                }
                for message_id in self._inbound
            ]
        return {
            "inbound": inbound,
            "faults_fired": faults_fired(self.journal),
        }


def _message(raw: bytes) -> dict[str, Any]:
    try:
        message = json.loads(raw)
    except ValueError:
        raise ValueError("the body is not JSON") from None
    if not isinstance(message, dict):
        raise ValueError("the body is not a JSON object")
    unknown = sorted(set(message) - {"chat", "thread", "text", "reply_to"})
    if unknown:
        raise ValueError(f"unknown fields {unknown}")
    message.setdefault("thread", "")
    message.setdefault("reply_to", None)
    if not isinstance(message.get("chat"), str) or not message["chat"]:
        raise ValueError("chat must be a non-empty string")
    if not isinstance(message.get("text"), str) or not message["text"].strip():
        raise ValueError("text must be a non-empty string")
    if not isinstance(message["thread"], str):
        raise ValueError("thread must be a string")
    if message["reply_to"] is not None and not isinstance(message["reply_to"], str):
        raise ValueError("reply_to must be a string or null")
    if len(message["text"]) > NON_EDITABLE.cap:
        raise ValueError("message is too long")
    return message


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            break  # a torn last line: it was never answered
    return entries


class _Handler(ControlHandler):
    server: FakeServer[WebhookFake]

    def do_POST(self) -> None:
        raw = self.read_body()
        fake = self.server.fake
        if self.path.startswith("/control/"):
            return self._control(self.path.removeprefix("/control/"), raw)
        if self.path.rstrip("/") != "/messages":
            return self.send_json(404, {"error": f"no route {self.path}"})
        status, body, headers = fake.post_message(self.headers, raw)
        key = self.headers.get(IDEMPOTENCY_KEY_HEADER)
        fake.calls.write({"path": self.path, "key": key, "status": status, "body": body})
        if body is None:
            return self.stay_silent()
        self.send_json(status, body, headers)

    def _control(self, action: str, raw: bytes) -> None:
        try:
            params = json.loads(raw or b"{}")
            if not isinstance(params, dict):
                raise ValueError("a control body is a JSON object")
        except ValueError as exc:
            return self.send_json(400, {"ok": False, "error": str(exc)})
        self.control(action, params, {"redeliver": self.server.fake.redeliver})


def serve(host: str, port: int, fake: WebhookFake) -> FakeServer[WebhookFake]:
    """Bind the server (not serving yet: call ``serve()`` on it)."""
    return FakeServer((host, port), _Handler, fake)


def main(argv: Sequence[str] | None = None) -> int:
    parser = fake_parser("oncewire.testing.webhook_platform", name="noedit")
    parser.add_argument("--secret-env", help="the environment variable holding the HMAC secret")
    parser.add_argument("--deliver-to", help="the URL inbound messages are POSTed to")
    parser.add_argument("--honour-idempotency-key", action="store_true")
    args = parser.parse_args(argv)
    secret = None
    if args.secret_env:
        secret = os.environ.get(args.secret_env)
        if not secret:
            return print_error(f"--secret-env {args.secret_env} is not set")
    try:
        faults = startup_faults(args.fault)
    except ValueError as exc:
        return print_error(str(exc))
    fake = WebhookFake(
        args.journal,
        name=args.name,
        secret=secret,
        deliver_to=args.deliver_to,
        honour_keys=args.honour_idempotency_key,
        faults=faults,
    )
    server = serve(args.host, args.port, fake)
    return announce_and_serve(server.port, server.serve)


if __name__ == "__main__":
    sys.exit(main())
