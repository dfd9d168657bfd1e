"""The journaled fake platform as its own process, and the adapter that talks to it.

``python -m oncewire.testing serve --journal J --profile telegram --name fk_tg
--socket S [--fault JSON]...`` serves one :class:`FakePlatform` on a Unix socket and prints
``ready`` once it listens. Each connection carries one request (a JSON line) and at most one
answer (a JSON line):

==========================  ================================================================
``{"ok": true, "id": ...}``  accepted (and journaled, with fsync, before this line is written)
``{"status": 429, ...}``     refused with ``retry_after``
``{"status": 403, ...}``     refused for good
``{"reset": ...}``           the simulated connection failed before the request was written
no answer, connection closed the request may have landed (``timeout``, ``ack_lost``, parked
                             operations whose process was killed)
==========================  ================================================================

:class:`FakePlatformClient` classifies outcomes where its transport knows: it cannot connect
(refused, nothing left), it wrote the request and then timed out or saw the connection close
(ambiguous), or it read an answer.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oncewire.replies.wire import (
    Delivered,
    Gone,
    MaybeDelivered,
    NotDelivered,
    PlatformProfile,
    RejectedForGood,
    WireOutcome,
)
from oncewire.storage.replies import SendRequest
from oncewire.testing.fake_platform import FakePlatform, Fault

__all__ = ["FakePlatformClient", "serve"]

MAX_LINE = 1 << 20


def _request_dict(request: SendRequest) -> dict[str, Any]:
    return {
        "platform": request.platform,
        "bot": request.bot,
        "chat": request.chat,
        "thread": request.thread,
        "reply_to": request.reply_to,
        "format": request.format,
    }


class FakePlatformClient:
    """A :class:`~oncewire.replies.wire.Platform` adapter for a fake platform process."""

    def __init__(
        self, socket_path: Path | str, profile: PlatformProfile, *, timeout_seconds: float = 5.0
    ) -> None:
        self.socket_path = str(socket_path)
        self._profile = profile
        self.timeout_seconds = timeout_seconds

    @property
    def profile(self) -> PlatformProfile:
        return self._profile

    def send(self, request: SendRequest, body: str, *, marked: bool) -> WireOutcome:
        return self._call({"op": "send", "body": body, "marked": marked}, request)

    def edit(
        self, request: SendRequest, message_id: str, body: str, *, marked: bool
    ) -> WireOutcome:
        call = {"op": "edit", "message_id": message_id, "body": body, "marked": marked}
        return self._call(call, request)

    def delete(self, request: SendRequest, message_id: str) -> WireOutcome:
        return self._call({"op": "delete", "message_id": message_id}, request)

    def _call(self, call: dict[str, Any], request: SendRequest) -> WireOutcome:
        line = (json.dumps({**call, "request": _request_dict(request)}) + "\n").encode()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(self.timeout_seconds)
        try:
            try:
                conn.connect(self.socket_path)
            except OSError as exc:  # nothing was written: the platform cannot have seen it
                return NotDelivered(f"cannot connect: {exc.strerror or exc}")
            try:
                conn.sendall(line)
                with conn.makefile("rb") as reader:
                    answer = reader.readline(MAX_LINE)
            except TimeoutError:
                return MaybeDelivered("timed out after the request was written")
            except OSError as exc:
                return MaybeDelivered(f"connection failed after writing: {exc.strerror or exc}")
        finally:
            conn.close()
        if not answer.endswith(b"\n"):
            return MaybeDelivered("the connection closed before an answer")
        try:
            reply = json.loads(answer)
        except json.JSONDecodeError:
            return MaybeDelivered("an unreadable answer")
        if reply.get("ok"):
            return Delivered(str(reply["id"]))
        if "reset" in reply:
            return NotDelivered(str(reply["reset"]))
        if reply.get("status") == 429:
            return NotDelivered("429 too many requests", retry_after=float(reply["retry_after"]))
        if "gone" in reply:
            return Gone(str(reply["gone"]))
        return RejectedForGood(str(reply.get("reason", "rejected")))


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        line = self.rfile.readline(MAX_LINE)
        if not line.endswith(b"\n"):
            return
        call = json.loads(line)
        request = SendRequest(**call["request"])
        fake = self.server.fake
        if call["op"] == "send":
            outcome = fake.send(request, call["body"], marked=call["marked"])
        elif call["op"] == "edit":
            outcome = fake.edit(request, call["message_id"], call["body"], marked=call["marked"])
        else:
            outcome = fake.delete(request, call["message_id"])
        if isinstance(outcome, Delivered):
            answer: dict[str, Any] = {"ok": True, "id": outcome.message_id}
        elif isinstance(outcome, NotDelivered) and outcome.retry_after is not None:
            answer = {"status": 429, "retry_after": outcome.retry_after}
        elif isinstance(outcome, NotDelivered):
            answer = {"reset": outcome.reason}
        elif isinstance(outcome, RejectedForGood):
            answer = {"status": 403, "reason": outcome.reason}
        elif isinstance(outcome, Gone):
            answer = {"status": 404, "gone": outcome.reason}
        else:
            return  # ambiguous: close without an answer
        self.wfile.write((json.dumps(answer) + "\n").encode())


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, fake: FakePlatform) -> None:
        self.fake = fake
        super().__init__(path, _Handler)


def serve(
    journal: Path,
    profile: PlatformProfile,
    *,
    name: str,
    socket_path: Path,
    faults: Sequence[Fault] = (),
    ready: threading.Event | None = None,
) -> None:
    """Serve until killed (or until the server is shut down from another thread)."""
    if socket_path.exists():
        os.unlink(socket_path)
    fake = FakePlatform(journal, profile, name=name, faults=faults)
    with _Server(str(socket_path), fake) as server:
        print("ready", flush=True)
        if ready is not None:
            ready.set()
        try:
            server.serve_forever(poll_interval=0.05)
        finally:
            fake.close()


def main(argv: list[str]) -> int:
    import argparse

    from oncewire.replies.wire import DISCORD_LIKE, NON_EDITABLE, TELEGRAM_LIKE

    profiles = {p.name: p for p in (TELEGRAM_LIKE, DISCORD_LIKE, NON_EDITABLE)}
    parser = argparse.ArgumentParser(prog="python -m oncewire.testing serve")
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--profile", choices=sorted(profiles), required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--fault", action="append", default=[], help="JSON object of a Fault")
    args = parser.parse_args(argv)
    faults = [Fault(**json.loads(spec)) for spec in args.fault]
    serve(
        args.journal, profiles[args.profile], name=args.name, socket_path=args.socket, faults=faults
    )
    return 0
