"""The fake OpenAI-compatible server as a real child process, one per test; every HTTP client a
test opens is closed when it ends."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
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


class FakeOpenAI:
    """A running ``python -m oncewire.fakes.openai_api`` and its journal."""

    def __init__(self, directory: Path, script: Any) -> None:
        directory.mkdir(parents=True)
        self.journal_dir = directory / "journal"
        script_path = directory / "script.json"
        script_path.write_text(json.dumps(script), encoding="utf-8")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "oncewire.fakes.openai_api",
                "--port",
                "0",
                "--journal",
                str(self.journal_dir),
                "--script",
                str(script_path),
            ],
            env=_child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("ready port="):
            self.stop()
            raise RuntimeError(f"the fake did not start: {line!r} {self.process.stderr}")
        self.port = int(line.strip().split("=", 1)[1])
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def requests(self) -> list[dict[str, Any]]:
        path = self.journal_dir / "requests.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=10)


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
