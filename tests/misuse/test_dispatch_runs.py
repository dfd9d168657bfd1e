"""A run of plain sink calls handed to one worker thread at once, on both backends.

A batch of plain (not ``async def``) calls is handed to a worker thread in one piece, so that a
fast batch costs one thread handoff instead of one per call. Each call must still be its own
attempt: started and finished at its own time, recorded as it returns, given up on alone when it
times out (the calls behind it then run on another thread, each exactly once), and handed back
unstarted when the dispatcher stops before reaching it. An ``async def`` sink that raises
``CancelledError`` on its own (not cancelled by a timeout) is an error like any other exception:
it used to be taken for a cancellation and its attempt waited, unrecorded, for ever.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from oncewire import Attempt, Dispatcher, Ledger
from tests.contract.conftest import RawDatabase
from tests.misuse.test_dispatch import FAR, dispatch_once, wait_for


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


def _accept(ledger: Ledger, keys: list[str]) -> None:
    with ledger.transaction() as tx:
        for key in keys:
            tx.accept(key, "send", {})


def _history(raw: RawDatabase, key: str) -> list[tuple[Any, ...]]:
    return raw.query(
        "SELECT a.outcome, a.state, a.started_at, a.finished_at FROM oncewire_attempts AS a "
        "JOIN oncewire_effects AS e ON e.id = a.effect_id WHERE e.key = ? ORDER BY a.fence",
        (key,),
    )


def test_a_call_timing_out_mid_run_leaves_the_rest_of_the_run_to_another_thread(
    ledger: Ledger, raw: RawDatabase, release: threading.Event
) -> None:
    keys = ["a", "b", "hangs", "c", "d"]
    calls: list[tuple[str, str]] = []  # (key, thread name), in call order

    def send(attempt: Attempt) -> str:
        calls.append((attempt.key, threading.current_thread().name))
        if attempt.key == "hangs":
            release.wait(60)
        return attempt.key

    _accept(ledger, keys)
    dispatch_once(ledger, raw, {"send": send}, keys, attempt_timeout=0.3, batch_size=5)
    assert [key for key, _ in calls] == keys  # in order, each called exactly once
    threads = dict(calls)
    assert threads["a"] == threads["b"] == threads["hangs"]  # one handoff for the run
    assert threads["c"] == threads["d"] != threads["hangs"]  # the rest: a new thread
    states = {key: raw.effect_row(key)["state"] for key in keys}
    assert states == {"a": "done", "b": "done", "hangs": "uncertain", "c": "done", "d": "done"}
    # Each attempt has its own times: on one thread, each call finished before the next one
    # started; the hung one was given up on after its timeout, and only then did "c" start.
    rows = {key: _history(raw, key) for key in keys}
    assert {key: [(o, s) for o, s, _, _ in r] for key, r in rows.items()} == {
        "a": [("done", "done")],
        "b": [("done", "done")],
        "hangs": [("timeout", "uncertain")],
        "c": [("done", "done")],
        "d": [("done", "done")],
    }
    times = {key: (rows[key][0][2], rows[key][0][3]) for key in keys}
    for started, finished in times.values():
        assert started is not None and started <= finished
    for first, then in [("a", "b"), ("b", "hangs"), ("c", "d")]:
        assert times[first][1] <= times[then][0]
    hung_started, hung_finished = times["hangs"]
    assert hung_finished - hung_started >= 0.3 - 1e-3
    assert times["c"][0] >= hung_started + 0.3 - 1e-3


def test_stopping_mid_run_hands_back_the_calls_not_started(
    ledger: Ledger, raw: RawDatabase, release: threading.Event
) -> None:
    keys = ["slow", "b", "c", "d"]
    called: list[str] = []
    inside = threading.Event()

    def send(attempt: Attempt) -> str:
        called.append(attempt.key)
        if attempt.key == "slow":
            inside.set()
            release.wait(60)
        return attempt.key

    _accept(ledger, keys)
    dispatcher = Dispatcher(ledger, {"send": send}, batch_size=4, retry=FAR, poll_seconds=0.02)
    thread = threading.Thread(target=dispatcher.run, kwargs={"handle_signals": False})
    thread.start()
    try:
        assert inside.wait(30)
        dispatcher.stop()
        # Handed back at once, while "slow" still runs: their sinks were never called.
        wait_for(lambda: raw.effect_row("d")["state"] == "pending", "the unstarted calls")
        assert raw.effect_row("slow")["state"] == "claimed"
        release.set()
    finally:
        release.set()
        dispatcher.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert called == ["slow"]
    assert raw.effect_row("slow")["state"] == "done"
    for key in ["b", "c", "d"]:
        row = raw.effect_row(key)
        assert (row["state"], row["attempts"], bool(row["maybe_sent"])) == ("pending", 0, False)
        ((outcome, state, started_at, _),) = _history(raw, key)
        assert (outcome, state, started_at) == ("not_sent", "pending", None)
    assert dispatcher.stats.not_started == 3


def test_an_async_sink_raising_cancelled_error_itself_is_recorded_uncertain(
    ledger: Ledger, raw: RawDatabase
) -> None:
    async def send(attempt: Attempt) -> Any:
        raise asyncio.CancelledError("the sink's own")

    ledger.accept("k", "send", {})
    dispatch_once(ledger, raw, {"send": send}, ["k"])  # before: waited for ever
    row = raw.effect_row("k")
    assert (row["state"], row["result"], bool(row["maybe_sent"])) == ("uncertain", None, True)
    assert row["last_error"].startswith("sink raised CancelledError")
