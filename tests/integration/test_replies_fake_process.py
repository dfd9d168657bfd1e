"""The journaled fake platform as its own process: the adapter classifies outcomes from its
transport (cannot connect: refused; wrote and lost the connection: ambiguous), and the chat
survives a SIGKILL of the platform process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncewire.core.clock import SystemClock
from oncewire.lab.suites.replies_rig import Rig, footer, reply_text
from oncewire.replies import TELEGRAM_LIKE, MaybeDelivered, NotDelivered, SendRequest
from oncewire.testing import ManualClock
from oncewire.testing.fake_platform import ChatView
from oncewire.testing.fake_platform_process import FakePlatformClient


class Server:
    def __init__(self, folder: Path, socket_path: Path) -> None:
        self.folder, self.socket_path = folder, socket_path
        self.process: subprocess.Popen[str] | None = None

    def start(self, *faults: dict[str, object]) -> None:
        argv = [
            sys.executable,
            "-m",
            "oncewire.testing",
            "serve",
            "--journal",
            str(self.folder / "fk_tg.jsonl"),
            "--profile",
            "telegram",
            "--name",
            "fk_tg",
            "--socket",
            str(self.socket_path),
        ]
        for fault in faults:
            argv += ["--fault", json.dumps(fault)]
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"

    def kill(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.communicate(timeout=10)
        return self.process.returncode


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with tempfile.TemporaryDirectory(prefix="ow") as short:  # Unix socket paths are short
        started = Server(tmp_path / "rig", Path(short) / "tg.sock")
        (tmp_path / "rig").mkdir()
        yield started
        if started.process is not None and started.process.poll() is None:
            started.kill()


def test_cannot_connect_is_not_delivered_and_nothing_was_sent(tmp_path: Path) -> None:
    client = FakePlatformClient(tmp_path / "absent.sock", TELEGRAM_LIKE)
    outcome = client.send(SendRequest("fk_tg", "bot", "c"), "hello", marked=False)
    assert isinstance(outcome, NotDelivered) and outcome.retry_after is None


CELLS = {
    "clean": (None, "exact"),
    "ack_lost": ("ack_lost", "marked_dupes"),
    "timeout": ("timeout", "one_copy"),
    "conn_error": ("conn_error", "exact"),
    "rate_limit": ("rate_limit", "exact"),
    # Someone deletes the preview before the final edit: Gone over the socket, sent again once.
    "gone": ("gone", "exact"),
}


@pytest.mark.parametrize("mode", ["off", "many"])
@pytest.mark.parametrize("cell", list(CELLS))
def test_faults_through_the_platform_process(server: Server, cell: str, mode: str) -> None:
    kind, expect = CELLS[cell]
    aid, chat = f"A-{cell}-{mode}", f"p-{cell}"
    server.start(*([{"kind": kind, "contains": footer(aid)}] if kind else []))
    client = FakePlatformClient(server.socket_path, TELEGRAM_LIKE)
    with Rig(server.folder, clock=ManualClock(), remote={"fk_tg": client}) as rig:
        admission = rig.admit("fk_tg", chat, "in-1")
        result = rig.answer(admission.inbound.id, reply_text(aid, "through a socket."), mode)
        assert result.status == "delivered"
        fired = ChatView([server.folder / "fk_tg.jsonl"]).faults
        edit = bool(fired) and fired[0]["op"] == "edit"
        if cell == "gone":  # only a streamed reply has an edit whose target can be gone
            assert [f["op"] for f in fired] == (["edit"] if mode == "many" else [])
        failures = rig.check("fk_tg", chat, aid, admission.inbound.id, "exact" if edit else expect)
        assert not failures, "\n".join(failures)


def test_the_platform_process_killed_mid_send(server: Server) -> None:
    aid, chat = "A-platform-killed", "p-killed"
    server.start({"kind": "hold", "contains": footer(aid), "hold_seconds": 60})
    client = FakePlatformClient(server.socket_path, TELEGRAM_LIKE, timeout_seconds=30)
    with Rig(server.folder, clock=SystemClock(), remote={"fk_tg": client}) as rig:
        rig.engine.backoff_base_seconds = 0.05
        admission = rig.admit("fk_tg", chat, "in-1")
        outcome: list[str] = []
        worker = threading.Thread(
            target=lambda: outcome.append(
                rig.answer(admission.inbound.id, reply_text(aid, "survives.")).status
            )
        )
        worker.start()
        deadline = time.monotonic() + 20
        while not ChatView([server.folder / "fk_tg.jsonl"]).faults:
            assert time.monotonic() < deadline, "the platform never parked the send"
            time.sleep(0.02)
        assert server.kill() == -signal.SIGKILL
        time.sleep(0.2)  # the engine now finds nobody listening: refused, retried
        server.start()
        worker.join(timeout=30)
        assert outcome == ["delivered"]
        ops = rig.ledger.replies.ops(rig.ledger.replies.for_inbound(admission.inbound.id).id)  # type: ignore[union-attr]
        assert ops[0].state.value == "ambiguous"
        failures = rig.check("fk_tg", chat, aid, admission.inbound.id, "one_copy")
        assert not failures, "\n".join(failures)


def test_an_answer_cut_off_may_have_been_delivered(tmp_path: Path) -> None:
    import socket

    with tempfile.TemporaryDirectory(prefix="ow") as short:
        path = str(Path(short) / "mute.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)

        def mute() -> None:
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.close()  # read the request, answer nothing

        thread = threading.Thread(target=mute)
        thread.start()
        outcome = FakePlatformClient(path, TELEGRAM_LIKE).send(
            SendRequest("fk_tg", "bot", "c"), "hello", marked=False
        )
        thread.join()
        listener.close()
    assert isinstance(outcome, MaybeDelivered)
