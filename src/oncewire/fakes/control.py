"""Plumbing the real-wire platform fakes share: a listener that can black out, silence on a
connection until the client gives up, a call log, and faults armed from JSON.

A fault means the same on every fake: the vocabulary is :class:`oncewire.platforms.fake.Fault`
(the in-process fake's), applied by a :class:`~oncewire.platforms.fake.FakePlatform` that also
keeps the journal :class:`~oncewire.platforms.fake.ChatView` reads. On the wire:

==============  =================================================================================
``rate_limit``   the platform's own 429 body (``retry_after`` in whole seconds, at least 1)
``timeout``      the request is read and not applied; the fake stays silent until the client
                 gives up (it sees a read timeout: the request may have arrived)
``ack_lost``     applied and journaled (fsync), then silence as for ``timeout``
``rejected``     the platform's refusal for good (Telegram: 403 bot blocked)
``hold``         parked before it is applied, until released or ``hold_seconds`` pass; silence
``hold_after``   applied and journaled, then parked; silence
``conn_error``   a listener blackout: the listening socket and every idle keep-alive connection
                 are closed at once, and the port reopens after ``blackout_seconds``; a client
                 connecting meanwhile is refused (it knows the request never left). A blackout
                 cannot be matched to a request (nothing is read), so it starts when armed
==============  =================================================================================
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from oncewire.platforms.fake import Fault

__all__ = [
    "CallLog",
    "ListenerServer",
    "TrackedHandler",
    "fault_from_json",
    "fsynced_append",
    "wait_silently",
]

_FAULT_FIELDS = frozenset(f.name for f in fields(Fault))
DEFAULT_BLACKOUT_SECONDS = 1.0


def fault_from_json(spec: Mapping[str, Any]) -> tuple[Fault, float]:
    """(the fault, its blackout seconds) from a JSON object of :class:`Fault` fields plus, for
    ``conn_error``, ``blackout_seconds``. Unknown keys are refused, naming them."""
    if not isinstance(spec, Mapping):
        raise ValueError("a fault is a JSON object of Fault fields")
    spec = dict(spec)
    blackout = spec.pop("blackout_seconds", DEFAULT_BLACKOUT_SECONDS)
    unknown = sorted(set(spec) - _FAULT_FIELDS)
    if unknown:
        raise ValueError(f"unknown fault keys {unknown} (known: {sorted(_FAULT_FIELDS)})")
    if not isinstance(blackout, int | float) or not 0 < blackout < 3600:
        raise ValueError("blackout_seconds must be a number of seconds in (0, 3600)")
    try:
        return Fault(**spec), float(blackout)
    except TypeError as exc:
        raise ValueError(f"bad fault {spec!r}: {exc}") from exc


class CallLog:
    """Every call a fake answered, one JSON line each (flushed: a diagnostic, not the journal)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the process
        self._lock = threading.Lock()

    def write(self, entry: Mapping[str, Any]) -> None:
        line = json.dumps({**entry, "ts": time.time()}, sort_keys=True, default=str)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


def wait_silently(connection: socket.socket, seconds: float) -> None:
    """Send nothing until the client closes its end or ``seconds`` pass (then close)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([connection], [], [], min(left, 0.5))
        if readable:
            try:
                if not connection.recv(4096):
                    return  # the client went away
            except OSError:
                return


class ListenerServer(ThreadingHTTPServer):
    """A threading HTTP server whose listener can black out (``conn_error``) and come back on
    the same port. Serve it with :meth:`serve` (not ``serve_forever``)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], name: str = ""
    ) -> None:
        super().__init__(address, handler)
        self._connections: dict[socket.socket, bool] = {}  # socket -> idle (between requests)
        self._connections_lock = threading.Lock()
        self._reopened = threading.Event()
        self._blackout_lock = threading.Lock()
        self.fake_name = name

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def track(self, connection: socket.socket, *, idle: bool) -> None:
        with self._connections_lock:
            self._connections[connection] = idle

    def forget(self, connection: socket.socket) -> None:
        with self._connections_lock:
            self._connections.pop(connection, None)

    def blackout(self, seconds: float) -> None:
        """Refuse connections for ``seconds`` from now (returns at once)."""
        threading.Thread(target=self._blackout, args=(seconds,), daemon=True).start()

    def _blackout(self, seconds: float) -> None:
        with self._blackout_lock:
            self.shutdown()  # the accept loop stops; serve() waits for the reopening
            self.socket.close()
            with self._connections_lock:
                idle = [c for c, is_idle in self._connections.items() if is_idle]
            for connection in idle:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            time.sleep(seconds)
            self.socket = socket.socket(self.address_family, self.socket_type)
            self.server_bind()
            self.server_activate()
            self._reopened.set()

    def serve(self) -> None:
        """Serve until the process ends, across blackouts."""
        while True:
            self.serve_forever(poll_interval=0.05)
            self._reopened.wait()
            self._reopened.clear()


class TrackedHandler(BaseHTTPRequestHandler):
    """A keep-alive handler whose connection the server knows to be idle between requests."""

    protocol_version = "HTTP/1.1"
    server: ListenerServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the journals are the record; stderr stays quiet

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, idle=True)

    def finish(self) -> None:
        self.server.forget(self.connection)
        super().finish()

    def handle_one_request(self) -> None:
        self.server.track(self.connection, idle=True)
        super().handle_one_request()

    def parse_request(self) -> bool:
        self.server.track(self.connection, idle=False)
        return super().parse_request()

    def read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def send_json(
        self, status: int, payload: Any, headers: Mapping[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True  # the client went away; what it missed is journaled

    def stay_silent(self, seconds: float = 600.0) -> None:
        """No answer: the client's read times out (or it goes away first)."""
        self.close_connection = True
        wait_silently(self.connection, seconds)


def fsynced_append(fd: int, entry: Mapping[str, Any]) -> None:
    """Append one JSON line and fsync it (answers are written only after this returns)."""
    os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
    os.fsync(fd)
