"""The dispatcher end to end on a real SQLite file: typed outcomes, retries, dead letters,
redelivery flags, stale fences and a thread pool."""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import (
    Attempt,
    Dispatcher,
    Done,
    EffectState,
    Ledger,
    MaybeSent,
    NotSent,
    Rejected,
    RetryPolicy,
)
from oncewire.errors import StoreBusy
from oncewire.storage.sqlite import SQLiteStore
from oncewire.testing import ManualClock

# No waiting between attempts: run(until_idle=True) drains retries at once.
IMMEDIATE = RetryPolicy(base_seconds=0.0, jitter=0.0)


class Script:
    """A sink that plays a list of behaviours per key and records every attempt it saw."""

    def __init__(self, **plans: list[Any]) -> None:
        self.plans = {key: list(plan) for key, plan in plans.items()}
        self.seen: dict[str, list[Attempt]] = defaultdict(list)
        self.lock = threading.Lock()

    def __call__(self, attempt: Attempt) -> Any:
        with self.lock:
            self.seen[attempt.key].append(attempt)
            step = self.plans[attempt.key].pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    def flags(self, key: str) -> list[bool]:
        return [a.redelivery for a in self.seen[key]]


def drain(ledger: Ledger, sinks: dict[str, Callable[[Attempt], Any]], **kw: Any) -> Dispatcher:
    dispatcher = Dispatcher(ledger, sinks, retry=kw.pop("retry", IMMEDIATE), **kw)
    dispatcher.run(until_idle=True, handle_signals=False)
    return dispatcher


def test_typed_outcomes_reach_their_terminal_states(ledger: Ledger) -> None:
    sink = Script(
        plain=[{"ticket": 1}],
        done=[Done("receipt-9")],
        retried=[NotSent("503", retry_after=0), Done("second time")],
        refused=[Rejected("insufficient funds")],
        flaky=[ConnectionResetError("peer reset"), "landed"],
        unsure=[MaybeSent("timeout after write"), "ok"],
    )
    for key in sink.plans:
        ledger.accept(key, "work", {"key": key})
    dispatcher = drain(ledger, {"work": sink})

    states = {e.key: (e.state, e.attempts, e.result, e.last_error) for e in ledger.effects.list()}
    assert states == {
        "plain": (EffectState.DONE, 1, {"ticket": 1}, None),
        "done": (EffectState.DONE, 1, "receipt-9", None),
        # A NotSent attempt gives its charge back: one attempt counted of the two calls.
        "retried": (EffectState.DONE, 1, "second time", None),
        "refused": (EffectState.REJECTED, 1, None, "insufficient funds"),
        "flaky": (EffectState.DONE, 2, "landed", None),
        "unsure": (EffectState.DONE, 2, "ok", None),
    }
    assert all(plan == [] for plan in sink.plans.values())  # every behaviour was used once
    assert sink.flags("retried") == [False, False]  # NotSent: nothing landed
    assert sink.flags("flaky") == [False, True]  # it raised: it may have acted
    assert sink.flags("unsure") == [False, True]
    stats = dispatcher.stats
    assert (stats.done, stats.rejected, stats.not_sent, stats.maybe_sent) == (5, 1, 1, 2)
    assert (stats.claimed, stats.redeliveries, stats.stale_refused) == (9, 2, 0)


def test_a_dispatcher_given_claimable_keys_performs_only_those(ledger: Ledger) -> None:
    # The MCP proxy's dispatcher: of its kind's effects, only the calls its client waits for.
    sink = Script(mine=["one"], later=["two"])
    for key in ("mine", "theirs", "later"):
        ledger.accept(key, "work", {"key": key})
    claimable = {"mine"}
    drain(ledger, {"work": sink}, claimable=lambda: claimable)
    states = {e.key: (e.state, e.attempts) for e in ledger.effects.list()}
    assert states == {
        "mine": (EffectState.DONE, 1),
        "theirs": (EffectState.PENDING, 0),
        "later": (EffectState.PENDING, 0),
    }
    claimable = {"later"}  # a key added: claimed then
    drain(ledger, {"work": sink}, claimable=lambda: claimable)
    assert ledger.effects.get("later").state is EffectState.DONE
    assert ledger.effects.get("theirs").state is EffectState.PENDING
    assert sorted(sink.seen) == ["later", "mine"]


def test_a_dispatcher_with_no_key_it_may_claim_opens_no_store_step(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy whose client waits for nothing: not even an empty transaction while it idles.
    ledger.accept("theirs", "work", {})
    steps: list[Any] = []
    step = ledger.store.dispatch_step
    monkeypatch.setattr(
        ledger.store, "dispatch_step", lambda *a, **k: steps.append(a) or step(*a, **k)
    )
    drain(ledger, {"work": Script()}, claimable=lambda: ())
    assert steps == []
    assert ledger.effects.get("theirs").state is EffectState.PENDING


def test_out_of_attempts_is_dead_with_a_reason(ledger: Ledger) -> None:
    # Attempts that may have landed count (NotSent ones do not: see test_settlement.py).
    sink = Script(k=[MaybeSent("reset #1"), MaybeSent("reset #2"), MaybeSent("reset #3")])
    ledger.accept("k", "work", {}, max_attempts=3)
    dispatcher = drain(ledger, {"work": sink})
    effect = ledger.effects.get("k")
    assert (effect.state, effect.attempts) == (EffectState.DEAD, 3)
    assert effect.last_error == (
        "out of attempts (3): reset #3; the outcome of the last attempt is unknown"
    )
    assert [a.number for a in sink.seen["k"]] == [1, 2, 3]
    assert dispatcher.stats.dead == 1


def test_a_passed_deadline_is_dead_without_an_attempt(ledger: Ledger, clock: ManualClock) -> None:
    sink = Script()
    ledger.accept("k", "work", {}, delay_seconds=4, deadline_seconds=5)
    drain(ledger, {"work": sink})  # not due yet: nothing to do
    assert ledger.effects.get("k").state is EffectState.PENDING
    clock.advance(11)
    dispatcher = drain(ledger, {"work": sink})
    effect = ledger.effects.get("k")
    assert (effect.state, effect.attempts) == (EffectState.DEAD, 0)
    assert effect.last_error == "deadline passed before delivery"
    assert sink.seen == {}
    assert dispatcher.stats.released == 1


def test_a_deadline_after_a_maybe_sent_says_it_may_have_landed(
    ledger: Ledger, clock: ManualClock
) -> None:
    ledger.accept("k", "work", {}, deadline_seconds=30)
    first: Dispatcher

    def unsure(attempt: Attempt) -> Any:
        first.stop()  # one attempt only: its retry is due in 10 s of the manual clock
        return MaybeSent("timeout")

    first = Dispatcher(ledger, {"work": unsure}, retry=RetryPolicy(base_seconds=10, jitter=0))
    first.run(handle_signals=False)
    assert ledger.effects.get("k").state is EffectState.UNCERTAIN
    clock.advance(31)
    drain(ledger, {"work": Script()})
    effect = ledger.effects.get("k")
    assert effect.state is EffectState.DEAD
    assert effect.last_error == "deadline passed; an earlier attempt may have landed"


def test_the_redelivery_flag_is_sticky(ledger: Ledger) -> None:
    sink = Script(k=[MaybeSent("timeout"), NotSent("connection refused", retry_after=0), "ok"])
    ledger.accept("k", "work", {})
    drain(ledger, {"work": sink})
    assert sink.flags("k") == [False, True, True]
    assert ledger.effects.get("k").maybe_sent is True


def test_a_stale_workers_outcome_is_refused_and_the_new_owner_wins(
    db_path: Path, ledger: Ledger, clock: ManualClock
) -> None:
    ledger.accept("k", "work", {"n": 1})
    b_seen: list[Attempt] = []
    b_stats: list[Any] = []

    def sink_b(attempt: Attempt) -> Any:
        b_seen.append(attempt)
        return {"by": "B"}

    def sink_a(attempt: Attempt) -> Any:
        # A stalls past its lease (its heartbeat, every lease_seconds/3 of real time, never
        # runs in this instant); B, another dispatcher on the same file, takes the effect over.
        clock.advance(31)
        with Ledger(str(db_path), clock=clock) as other:
            b = Dispatcher(other, {"work": sink_b}, retry=IMMEDIATE)
            b_stats.append(b.run(until_idle=True, handle_signals=False))
        return {"by": "A"}

    a = Dispatcher(ledger, {"work": sink_a}, lease_seconds=30, retry=IMMEDIATE)
    a.run(until_idle=True, handle_signals=False)

    assert a.stats.stale_refused == 1
    assert a.stats.done == 0
    (b,) = b_stats
    assert (b.released, b.done, b.redeliveries) == (1, 1, 1)
    assert [(x.number, x.fence, x.redelivery) for x in b_seen] == [(2, 2, True)]
    effect = ledger.effects.get("k")
    # A's lost lease is a recovery, not one of the effect's attempts: B's is the only one.
    assert (effect.state, effect.result, effect.attempts, effect.recoveries, effect.fence) == (
        EffectState.DONE,
        {"by": "B"},
        1,
        1,
        2,
    )


def test_a_thread_pool_runs_sinks_concurrently(ledger: Ledger) -> None:
    concurrency = 4
    meet = threading.Barrier(concurrency, timeout=10)
    threads: set[str] = set()
    calls = 0
    lock = threading.Lock()

    def sink(attempt: Attempt) -> Any:
        nonlocal calls
        with lock:
            calls += 1
            first_wave = calls <= concurrency
            threads.add(threading.current_thread().name)
        if first_wave:
            meet.wait()  # breaks (and the attempt fails) unless 4 sinks run at once
        return attempt.payload["i"] * 2

    for i in range(12):
        ledger.accept(f"k{i}", "work", {"i": i})
    dispatcher = drain(ledger, {"work": sink}, concurrency=concurrency, batch_size=8)
    assert dispatcher.stats.done == 12
    assert dispatcher.stats.maybe_sent == 0
    assert {e.key: e.result for e in ledger.effects.list()} == {f"k{i}": i * 2 for i in range(12)}
    assert len(threads) >= concurrency


def test_until_idle_waits_for_a_retry_that_is_already_scheduled(ledger: Ledger) -> None:
    # With the real clock: a short backoff must be waited out, not abandoned.
    real = Ledger(ledger.store)  # the same store, with the system clock
    sink = Script(k=[NotSent("busy", retry_after=0.05), "ok"])
    real.accept("k", "work", {})
    drain(real, {"work": sink}, poll_seconds=0.01)
    assert real.effects.get("k").state is EffectState.DONE
    assert len(sink.seen["k"]) == 2


@pytest.mark.parametrize("handle_signals", [True, False])
def test_stop_from_a_sink_records_the_attempt_in_flight(
    ledger: Ledger, handle_signals: bool
) -> None:
    dispatcher: Dispatcher

    def sink(attempt: Attempt) -> Any:
        dispatcher.stop()
        return "finished anyway"

    for i in range(3):
        ledger.accept(f"k{i}", "work", {})
    dispatcher = Dispatcher(ledger, {"work": sink}, batch_size=1)
    stats = dispatcher.run(handle_signals=handle_signals)
    assert (stats.claimed, stats.done) == (1, 1)
    assert [e.state for e in ledger.effects.list()] == [
        EffectState.DONE,
        EffectState.PENDING,
        EffectState.PENDING,
    ]


class WriteLock:
    """Another connection holding the database's write lock, released on demand or later."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.lock = threading.Lock()

    def take(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        with self.lock:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")

    def close(self) -> None:
        self.release()
        self.conn.close()


@pytest.fixture
def write_lock(db_path: Path, ledger: Ledger) -> Iterator[WriteLock]:
    held = WriteLock(db_path)
    yield held
    held.close()


@pytest.fixture
def impatient(db_path: Path, clock: ManualClock, ledger: Ledger) -> Iterator[Ledger]:
    """A second ledger on the same file whose writes give up after 50 ms of a held lock."""
    store = SQLiteStore(str(db_path), busy_timeout_ms=50)
    yield Ledger(store, clock=clock)
    store.close()


def test_a_store_outage_is_waited_out_and_the_outcome_still_recorded(
    impatient: Ledger, write_lock: WriteLock
) -> None:
    impatient.accept("k", "work", {})

    def sink(attempt: Attempt) -> Any:
        write_lock.take()  # the database becomes unwritable while the sink works ...
        threading.Timer(0.3, write_lock.release).start()  # ... for a little while
        return "landed"

    dispatcher = drain(impatient, {"work": sink}, storage_patience_seconds=30)
    effect = impatient.effects.get("k")
    assert (effect.state, effect.result, effect.attempts) == (EffectState.DONE, "landed", 1)
    assert dispatcher.stats.storage_errors >= 1
    assert dispatcher.stats.done == 1


def test_an_outage_longer_than_the_patience_is_raised_and_nothing_is_lost(
    impatient: Ledger, write_lock: WriteLock, clock: ManualClock
) -> None:
    impatient.accept("k", "work", {})

    def sink(attempt: Attempt) -> Any:
        write_lock.take()  # and never given back while this dispatcher runs
        return "landed"

    dispatcher = Dispatcher(impatient, {"work": sink}, storage_patience_seconds=0.2)
    with pytest.raises(StoreBusy):
        dispatcher.run(until_idle=True, handle_signals=False)
    assert dispatcher.stats.storage_errors >= 2
    write_lock.release()
    effect = impatient.effects.get("k")
    assert effect.state is EffectState.CLAIMED  # the outcome was never recorded ...
    clock.advance(60)  # ... so once its lease runs out, it is redelivered, flagged
    again = Script(k=["again"])
    drain(impatient, {"work": again})
    assert again.flags("k") == [True]
    assert impatient.effects.get("k").state is EffectState.DONE


def test_each_outage_backs_off_from_the_start(
    impatient: Ledger, write_lock: WriteLock, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker that rode out one outage meets the next with its shortest wait, not with the
    longest its lifetime's count of failures would give."""
    impatient.accept("k1", "work", {})
    impatient.accept("k2", "work", {})

    def sink(attempt: Attempt) -> Any:
        write_lock.take()  # each call makes the database unwritable for a while
        threading.Timer(0.5, write_lock.release).start()
        return "landed"

    with caplog.at_level(logging.WARNING, logger="oncewire.dispatch"):
        dispatcher = drain(impatient, {"work": sink}, storage_patience_seconds=30, batch_size=1)
    assert [e.state for e in impatient.effects.list()] == [EffectState.DONE] * 2
    delays = [
        float(m.group(1))
        for r in caplog.records
        if (m := re.search(r"retrying in ([0-9.]+)s", r.getMessage()))
    ]
    # Two outages, each of several failures; each starts over at the first step (0.1 s).
    assert delays.count(0.1) == 2, delays
    assert dispatcher.stats.storage_errors == len(delays) >= 2
