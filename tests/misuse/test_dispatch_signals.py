"""``oncewire dispatch`` and signals, with real child processes and real signals, on both
backends.

Regressions: a dispatcher ignored SIGTERM and SIGINT while a sink hung (it waited for the sink
for ever); the ``--workers`` supervisor restarted a crashing worker without saying why or
backing off.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import Attempt, Dispatcher, Ledger
from tests.contract.conftest import RawDatabase
from tests.misuse.test_dispatch import wait_for

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="process identity needs Linux /proc"
)

APP = """
import os, pathlib, time

HERE = pathlib.Path(__file__).parent

def hang(attempt):
    (HERE / "started").write_text(attempt.key)
    time.sleep(600)
    return "never"

def note(attempt):
    return "noted"

def boom(attempt):
    marker = HERE / "crashed-once"
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        os._exit(7)
    return "second time"

SINKS = {"hang": hang, "note": note, "boom": boom}
"""


@pytest.fixture
def ledger(store_url: str) -> Iterator[Ledger]:
    """On the system clock: the dispatchers here are real processes."""
    opened = Ledger(store_url)
    try:
        yield opened
    finally:
        opened.close()


class Child:
    """``python -m oncewire dispatch ...`` with its stderr collected line by line."""

    def __init__(self, cwd: Path, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "oncewire", "dispatch", *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        assert self.process.stderr is not None
        stream = self.process.stderr
        self._reader = threading.Thread(target=lambda: self.lines.extend(stream), daemon=True)
        self._reader.start()

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def wait_said(self, text: str, timeout: float = 60) -> None:
        wait_for(lambda: self.said(text) or self.process.poll() is not None, repr(text), timeout)
        assert self.said(text), "".join(self.lines)

    def finish(self, timeout: float) -> int:
        code = self.process.wait(timeout=timeout)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self._reader.join(5)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "sigapp.py").write_text(APP)
    yield tmp_path


def test_the_first_signal_waits_the_grace_period_then_leaves_the_claim_to_recovery(
    ledger: Ledger, raw: RawDatabase, app: Path, store_url: str
) -> None:
    ledger.accept("h1", "hang", {})
    child = Child(
        app,
        "--db",
        store_url,
        "--app",
        "sigapp:SINKS",
        "--grace",
        "1",
        "--poll-seconds",
        "0.05",
        "--batch-size",
        "1",
    )
    try:
        wait_for(lambda: (app / "started").exists(), "the sink to start")
        ledger.accept("later", "note", {})  # due, but must not be claimed once stopping
        time.sleep(0.2)
        child.process.send_signal(signal.SIGTERM)
        begun = time.monotonic()
        code = child.finish(timeout=60)
        took = time.monotonic() - begun
    finally:
        child.kill()
    out = "".join(child.lines)
    assert code == 3, out  # left a claim for recovery
    assert took < 20, took
    assert "waiting up to 1s for 1 attempt(s) in flight: h1" in out
    assert "leaving their claims to recovery" in out and "h1" in out
    assert "Traceback" not in out
    hung = raw.effect_row("h1")
    assert (hung["state"], hung["attempts"]) == ("claimed", 1)  # stays claimed: recovery's
    later = raw.effect_row("later")
    assert later["state"] in ("pending", "done")
    if later["state"] == "pending":
        assert later["attempts"] == 0

    # The next dispatcher sees the owner dead and redelivers the attempt, flagged.
    seen: list[tuple[str, int, bool]] = []

    def sink(attempt: Attempt) -> Any:
        seen.append((attempt.key, attempt.number, attempt.redelivery))
        return "recovered"

    Dispatcher(ledger, {"hang": sink, "note": sink}, poll_seconds=0.01).run(
        until_idle=True, handle_signals=False
    )
    assert ("h1", 2, True) in seen
    hung = raw.effect_row("h1")
    assert (hung["state"], hung["result"], bool(hung["maybe_sent"])) == (
        "done",
        '"recovered"',
        True,
    )


def test_a_second_signal_leaves_at_once(
    ledger: Ledger, raw: RawDatabase, app: Path, store_url: str
) -> None:
    ledger.accept("h1", "hang", {})
    child = Child(
        app, "--db", store_url, "--app", "sigapp:SINKS", "--grace", "600", "--poll-seconds", "0.05"
    )
    try:
        wait_for(lambda: (app / "started").exists(), "the sink to start")
        child.process.send_signal(signal.SIGTERM)
        child.wait_said("waiting up to 600s for 1 attempt(s) in flight: h1")
        child.process.send_signal(signal.SIGINT)
        code = child.finish(timeout=30)  # not 600 s
    finally:
        child.kill()
    out = "".join(child.lines)
    assert code == 3, out
    assert "leaving now" in out
    assert raw.effect_row("h1")["state"] == "claimed"


def test_the_supervisor_restarts_a_crashed_worker_with_a_backoff_and_says_so(
    ledger: Ledger, raw: RawDatabase, app: Path, store_url: str
) -> None:
    ledger.accept("b1", "boom", {})
    child = Child(
        app,
        "--db",
        store_url,
        "--app",
        "sigapp:SINKS",
        "--workers",
        "2",
        "--poll-seconds",
        "0.05",
        "--lease-seconds",
        "5",
    )
    try:
        child.wait_said("exited with code 7; starting another in 0.5s (failure 1 in a row)")
        wait_for(lambda: raw.effect_row("b1")["state"] == "done", "the redelivery")
        child.process.send_signal(signal.SIGTERM)
        code = child.finish(timeout=60)
    finally:
        child.kill()
    out = "".join(child.lines)
    assert code == 0, out
    row = raw.effect_row("b1")
    assert (row["result"], bool(row["maybe_sent"]), row["fence"]) == ('"second time"', True, 2)
