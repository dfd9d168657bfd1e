"""The fake OpenAI-compatible server as a real child process, one per test; every HTTP client a
test opens is closed when it ends. Also what the gateway tests share to start a fake as a child
process (:func:`spawn_fake`) and to serve scripted answers on loopback (:class:`LoopbackServer`,
the ``answering`` fixture)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.conftest import _child_env


@pytest.fixture(autouse=True)
def _close_every_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Close the clients a test left open, so no pooled socket is collected (and reported as an
    unclosed ResourceWarning) in the middle of a later test."""
    opened: list[httpx2.Client] = []
    original = httpx2.Client.__init__

    def tracked(self: httpx2.Client, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(httpx2.Client, "__init__", tracked)
    yield
    for client in opened:
        client.close()


def spawn_fake(
    module: str, args: Sequence[str], *, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], int]:
    """Start ``python -m module args...`` and wait for its ``ready port=N`` line: (the process,
    N). A fake that does not start is killed, and the RuntimeError says what it printed."""
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        env=dict(env if env is not None else _child_env()),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("ready port="):
        _, stderr = stop_process(process)
        raise RuntimeError(f"the fake did not start: {line!r} {stderr!r}")
    return process, int(line.strip().split("=", 1)[1])


def stop_process(process: subprocess.Popen[str]) -> tuple[str, str]:
    """Kill a fake still running and reap it: (what it printed on stdout, on stderr)."""
    if process.poll() is None:
        process.kill()
    return process.communicate(timeout=10)


class PlatformFakeProcess:
    """A platform fake running as a child process: its control routes (``call``) and the
    clients a test made for it (``adopt``), closed when it stops."""

    def __init__(
        self, module: str, args: Sequence[str], *, env: dict[str, str] | None = None
    ) -> None:
        self.process, self.port = spawn_fake(module, args, env=env)
        self.base = f"http://127.0.0.1:{self.port}"
        self.control = httpx2.Client(base_url=self.base, timeout=10.0)
        self.adopted: list[Any] = []

    def adopt(self, thing: Any) -> Any:
        """``thing``, closed when the fake stops."""
        self.adopted.append(thing)
        return thing

    def call(self, action: str, **params: Any) -> dict[str, Any]:
        """``POST /control/<action>``; the answer must be a 200."""
        answer = self.control.post(f"/control/{action}", json=params)
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()
        return result

    def close_adopted(self) -> None:
        while self.adopted:
            self.adopted.pop().close()

    def stop(self) -> None:
        stop_process(self.process)
        self.close_adopted()
        self.control.close()


# (status, headers, body) for a request, given its handler (method, path, headers) and its body.
Answer = Callable[[BaseHTTPRequestHandler, bytes], tuple[int, dict[str, str], bytes]]


class LoopbackServer:
    """A threading HTTP server on a loopback port: every GET and POST is read whole and answered
    with what ``answer`` returns. ``url`` is its base URL; :meth:`stop` closes it."""

    def __init__(self, answer: Answer) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self._answer()

            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                status, headers, data = answer(self, body)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll: stop() waits for the serving loop's next look (0.5 s by default).
        threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


Answering = Callable[..., str]


@pytest.fixture
def answering() -> Iterator[Answering]:
    """``answering(status, body, content_type=None)``: the base URL of a loopback server that
    answers every GET and POST with that status and body (and content type, when given)."""
    servers: list[LoopbackServer] = []

    def start(status: int, body: bytes, content_type: str | None = None) -> str:
        headers = {} if content_type is None else {"content-type": content_type}
        server = LoopbackServer(lambda request, received: (status, headers, body))
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


class FakeOpenAI:
    """A running ``python -m oncewire.testing.openai_api`` and its journal."""

    def __init__(self, directory: Path, script: Any) -> None:
        directory.mkdir(parents=True)
        self.journal_dir = directory / "journal"
        script_path = directory / "script.json"
        script_path.write_text(json.dumps(script), encoding="utf-8")
        self.process, self.port = spawn_fake(
            "oncewire.testing.openai_api",
            ["--port", "0", "--journal", str(self.journal_dir), "--script", str(script_path)],
        )
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def requests(self) -> list[dict[str, Any]]:
        path = self.journal_dir / "requests.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    def stop(self) -> None:
        stop_process(self.process)


@pytest.fixture
def fake_openai(tmp_path: Path) -> Iterator[Callable[[Any], FakeOpenAI]]:
    """``fake_openai(script)`` starts the fake with that script; stopped at teardown."""
    started: list[FakeOpenAI] = []

    def start(script: Any) -> FakeOpenAI:
        fake = FakeOpenAI(tmp_path / f"fake{len(started)}", script)
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.stop()


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
