"""Plumbing the real-wire platform fakes share: a listener that can black out, silence on a
connection until the client gives up, a call log, and faults armed from JSON.

A fault means the same on every fake: the vocabulary is :class:`oncewire.testing.Fault`
(the in-process fake's), applied by a :class:`~oncewire.testing.FakePlatform` that also
keeps the journal :class:`~oncewire.testing.ChatView` reads. On the wire:

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
                 cannot be matched to a request (nothing is read), so it starts when armed, and
                 is journaled then as fired on the operation ``connect`` (in its ``chat``)
==============  =================================================================================

Every fake also answers the same control routes (``POST /control/<action>``, a JSON object):
``inject``, ``fault``, ``release`` and ``state`` (:class:`ControlHandler`), and starts the same
way (:func:`fake_parser`, :func:`startup_faults`, :func:`announce_and_serve`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from oncewire.replies.wire import PlatformProfile
from oncewire.testing.fake_platform import ChatView, FakePlatform, Fault

__all__ = [
    "CallLog",
    "ControlHandler",
    "ControlledFake",
    "FakeServer",
    "JsonHandler",
    "ListenerServer",
    "PlatformFake",
    "TrackedHandler",
    "announce_and_serve",
    "arm_fault",
    "fake_parser",
    "fault_from_json",
    "faults_fired",
    "fsynced_append",
    "print_error",
    "startup_faults",
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


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet keep-alive handler that answers JSON, or nothing at all."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the journals are the record; stderr stays quiet

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
        self.wfile.flush()  # what was written before the silence is sent
        self.close_connection = True
        wait_silently(self.connection, seconds)


class TrackedHandler(JsonHandler):
    """A keep-alive handler whose connection the server knows to be idle between requests."""

    server: ListenerServer

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


class PlatformFake:
    """What every platform fake keeps in its directory: the chats, journaled by a
    :class:`FakePlatform` to ``chat.jsonl`` (fsync before the answer; :class:`ChatView` reads
    it), and every call answered, in ``calls.jsonl``."""

    def __init__(
        self, directory: Path, profile: PlatformProfile, *, name: str, faults: Sequence[Fault]
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.journal = directory / "chat.jsonl"
        self.chats = FakePlatform(self.journal, profile, name=name, faults=faults)
        self.calls = CallLog(directory / "calls.jsonl")


class ControlledFake(Protocol):
    """What the control routes reach in a platform fake."""

    name: str
    chats: FakePlatform

    def inject(self, params: Mapping[str, Any]) -> dict[str, Any]: ...

    def state(self) -> dict[str, Any]: ...


F = TypeVar("F", bound=ControlledFake)
ControlAction = Callable[[Mapping[str, Any]], dict[str, Any]]


class FakeServer(ListenerServer, Generic[F]):
    """A listener serving one platform fake."""

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], fake: F
    ) -> None:
        self.fake = fake
        super().__init__(address, handler, fake.name)


class ControlHandler(TrackedHandler):
    """A platform fake's handler: :meth:`control` answers ``/control/<action>``."""

    server: FakeServer[Any]

    def control(
        self,
        action: str,
        params: Mapping[str, Any],
        more: Mapping[str, ControlAction] | None = None,
    ) -> None:
        """Answer a control action: ``inject`` a user message, arm a ``fault``, ``release``
        parked operations, report the ``state``, or one of ``more`` (the fake's own)."""
        fake: ControlledFake = self.server.fake
        actions: dict[str, ControlAction] = {"inject": fake.inject, **(more or {})}
        try:
            if action in actions:
                return self.send_json(200, {"ok": True, **actions[action](params)})
            if action == "fault":
                fault, blackout = arm_fault(fake.chats, params)
                self.send_json(200, {"ok": True, "name": fault.name})
                if fault.kind == "conn_error":
                    # Journaled when it starts (the refused connections never reach the fake).
                    fake.chats.record_fault(fault, "connect", fault.chat or "")
                    self.server.blackout(blackout)  # after the answer: this connection is busy
                return None
            if action == "release":
                fake.chats.release_holds()
                return self.send_json(200, {"ok": True})
            if action == "state":
                return self.send_json(200, {"ok": True, **fake.state()})
        except ValueError as exc:
            return self.send_json(400, {"ok": False, "error": str(exc)})
        self.send_json(404, {"ok": False, "error": f"no control action {action!r}"})


_CONTROL_FAULT_NAMES = itertools.count()


def arm_fault(chats: FakePlatform, spec: Mapping[str, Any]) -> tuple[Fault, float]:
    """Arm a fault from a control request: (the fault, its blackout seconds). A ``conn_error``
    is not armed on the platform: the caller blacks the listener out."""
    fault, blackout = fault_from_json(spec)
    if not fault.name:
        # Fired counts are journaled by name: a name of this process never repeats one.
        fault = replace(fault, name=f"ctl-{os.getpid()}-{next(_CONTROL_FAULT_NAMES)}")
    if fault.kind != "conn_error":
        chats.faults.append(fault)
    return fault, blackout


def faults_fired(journal: Path) -> list[tuple[str, str, str]]:
    """(fault name, kind, operation) of every fault the journal records as fired."""
    return [(f["fault"], f["kind"], f["op"]) for f in ChatView([journal]).faults]


def fake_parser(module: str, *, name: str) -> argparse.ArgumentParser:
    """The options every platform fake takes: ``--host``, ``--port``, ``--journal`` (a
    directory), ``--name`` (the platform name in the journal) and ``--fault`` (repeated)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--journal", type=Path, required=True, help="a directory")
    parser.add_argument("--name", default=name, help="the platform name in the journal")
    parser.add_argument("--fault", action="append", default=[], help="a JSON Fault, armed")
    return parser


def startup_faults(specs: Sequence[str]) -> list[Fault]:
    """The faults given with ``--fault``, armed from the start; a ValueError names the bad one.
    A ``conn_error`` is refused: a blackout starts when armed, so it is armed through
    ``/control/fault`` when the next new connection is the one to refuse."""
    faults = []
    for spec in specs:
        try:
            fault, _ = fault_from_json(json.loads(spec))
        except ValueError as exc:
            raise ValueError(f"--fault {spec}: {exc}") from exc
        if fault.kind == "conn_error":
            raise ValueError(
                "conn_error is a listener blackout; arm it through /control/fault when "
                "the next new connection is the one to refuse"
            )
        faults.append(fault)
    return faults


def announce_and_serve(port: int, serve: Callable[[], None]) -> int:
    """Print ``ready port=N`` (what a parent process waits for), then serve until interrupted."""
    print(f"ready port={port}", flush=True)
    try:
        serve()
    except KeyboardInterrupt:
        pass
    return 0


def print_error(message: str) -> int:
    """One error line on stderr; the exit status of a fake that cannot start."""
    print(f"error: {message}", file=sys.stderr)
    return 2


def fsynced_append(fd: int, entry: Mapping[str, Any]) -> None:
    """Append one JSON line and fsync it (answers are written only after this returns)."""
    os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
    os.fsync(fd)
