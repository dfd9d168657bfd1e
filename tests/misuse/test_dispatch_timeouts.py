"""Attempt timeouts, and outcomes recorded as their sinks return, on both backends.

Regressions: a hung sink held every claim of its dispatcher for ever (no timeout), and with
``concurrency`` > 1 the outcomes of the sinks that did return waited, unrecorded, for the whole
batch. A timed-out attempt is ``uncertain`` (a later attempt is a flagged redelivery): an
``async def`` sink is cancelled, a thread abandoned, a ``SubprocessSink`` child killed.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import Attempt, Dispatcher, Ledger
from oncewire.sinks import SubprocessSink
from tests.contract.conftest import RawDatabase
from tests.misuse.test_dispatch import dispatch_once, wait_for


@pytest.fixture
def ledger(store_url: str) -> Iterator[Ledger]:
    """On the system clock: these tests run real dispatchers, in real time."""
    opened = Ledger(store_url)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """What hung sinks wait for; set at the end so no thread outlives its test for long."""
    event = threading.Event()
    yield event
    event.set()


def test_a_hung_sink_times_out_uncertain_and_the_next_effect_goes_on(
    ledger: Ledger, raw: RawDatabase, release: threading.Event
) -> None:
    seen: list[tuple[str, int, bool]] = []

    def send(attempt: Attempt) -> Any:
        seen.append((attempt.key, attempt.number, attempt.redelivery))
        if attempt.key == "hangs" and attempt.number == 1:
            release.wait(60)  # never answers in time
            return "too late"
        return "ok"

    ledger.accept("hangs", "send", {})
    ledger.accept("next", "send", {})
    # concurrency 1: before timeouts, "next" waited for ever behind "hangs".
    dispatch_once(ledger, raw, {"send": send}, ["hangs", "next"], attempt_timeout=0.3)
    hung = raw.effect_row("hangs")
    assert (hung["state"], hung["result"], bool(hung["maybe_sent"])) == ("uncertain", None, True)
    assert hung["last_error"] == "attempt timed out after 0.3s; the outcome is unknown"
    assert hung["lease_owner"] is None
    assert raw.effect_row("next")["state"] == "done"
    release.set()  # the abandoned call returns now; its answer must be dropped
    raw.execute("UPDATE oncewire_effects SET not_before = 0 WHERE key = 'hangs'")  # due now
    Dispatcher(ledger, {"send": send}, poll_seconds=0.01).run(until_idle=True, handle_signals=False)
    hung = raw.effect_row("hangs")
    assert (hung["state"], hung["result"], hung["attempts"]) == ("done", '"ok"', 2)
    assert ("hangs", 2, True) in seen  # the attempt after a timeout is a flagged redelivery


def test_a_hung_async_sink_is_cancelled(ledger: Ledger, raw: RawDatabase) -> None:
    cancelled = threading.Event()

    async def send(attempt: Attempt) -> Any:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    ledger.accept("k", "send", {})
    dispatch_once(ledger, raw, {"send": send}, ["k"], attempt_timeout=0.2)
    assert cancelled.wait(10)
    row = raw.effect_row("k")
    assert (row["state"], bool(row["maybe_sent"])) == ("uncertain", True)
    assert "timed out after 0.2s" in row["last_error"]


def test_a_timed_out_subprocess_sink_child_is_killed(
    ledger: Ledger, raw: RawDatabase, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    script = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    sink = SubprocessSink([sys.executable, "-c", script], timeout_seconds=120)
    ledger.accept("k", "send", {})
    dispatch_once(ledger, raw, {"send": sink}, ["k"], attempt_timeout=1.0)
    row = raw.effect_row("k")
    assert (row["state"], bool(row["maybe_sent"])) == ("uncertain", True)
    assert "timed out after 1s" in row["last_error"]
    pid = int(pid_file.read_text())

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, f"child {pid} to be killed and reaped", timeout=10)


def test_per_kind_timeouts(ledger: Ledger, raw: RawDatabase, release: threading.Event) -> None:
    def slow(attempt: Attempt) -> str:
        release.wait(0.6)
        return "finished"

    ledger.accept("q", "quick", {})
    ledger.accept("s", "slow", {})
    dispatch_once(
        ledger,
        raw,
        {"quick": slow, "slow": slow},
        ["q", "s"],
        attempt_timeout=0.2,
        attempt_timeouts={"slow": None},
        concurrency=2,
    )
    assert raw.effect_row("q")["state"] == "uncertain"
    assert (raw.effect_row("s")["state"], raw.effect_row("s")["result"]) == ("done", '"finished"')


def test_an_outcome_is_recorded_when_its_sink_returns_not_when_its_batch_does(
    ledger: Ledger, raw: RawDatabase, release: threading.Event
) -> None:
    def send(attempt: Attempt) -> str:
        if attempt.key == "hangs":
            release.wait(60)
        return attempt.key

    keys = ["hangs", "a", "b", "c"]
    for key in keys:
        ledger.accept(key, "send", {})
    dispatcher = Dispatcher(ledger, {"send": send}, concurrency=4, batch_size=4, poll_seconds=0.02)
    thread = threading.Thread(target=dispatcher.run, kwargs={"handle_signals": False})
    thread.start()
    try:
        # While "hangs" is still in its sink, the other three are already stored as done.
        wait_for(lambda: all(raw.effect_row(k)["state"] == "done" for k in "abc"), "a, b, c")
        assert raw.effect_row("hangs")["state"] == "claimed"
        release.set()
        wait_for(lambda: raw.effect_row("hangs")["state"] == "done", "hangs")
    finally:
        release.set()
        dispatcher.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert dispatcher.stats.done == 4


def test_fast_sinks_in_one_batch_are_recorded_together(ledger: Ledger, raw: RawDatabase) -> None:
    # Recording as sinks return must not turn a batch of fast sinks into a commit each.
    keys = [f"k{i:03d}" for i in range(100)]
    with ledger.transaction() as tx:
        for key in keys:
            tx.accept(key, "send", {})
    dispatcher = Dispatcher(ledger, {"send": lambda a: None}, batch_size=100)
    stats = dispatcher.run(until_idle=True, handle_signals=False)
    assert stats.done == 100
    assert {raw.effect_row(k)["state"] for k in keys} == {"done"}
    # One claim, and the settlements in few transactions (``updated_at`` is each commit's now).
    commits = raw.query("SELECT COUNT(DISTINCT updated_at) FROM oncewire_effects")[0][0]
    assert commits <= 10, commits
