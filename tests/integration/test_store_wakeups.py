"""Whoever waits on a SQLite store is woken by a commit, not by its poll interval.

Every waiter here polls once an hour (``poll_seconds=3600``): if it makes progress within the
test's timeout, a wake-up did it. The commits come from this process and from another one, and
the effects are read back from the file with plain sqlite3.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncewire import Attempt, Dispatcher, Ledger, toolcalls
from oncewire.storage.sqlite import wake

HOUR = 3600.0

ACCEPT_CHILD = """
import sys
from oncewire import Ledger
with Ledger(sys.argv[1], create=False) as ledger:
    ledger.accept(sys.argv[2], "noop", {"from": "child"})
"""

DISPATCH_CHILD = """
import sys, threading
from oncewire import Dispatcher, Ledger
ledger = Ledger(sys.argv[1], create=False)
dispatcher = Dispatcher(ledger, {"tool.echo": lambda attempt: {"echo": attempt.payload}},
                        poll_seconds=3600)
def watch():
    sys.stdin.read()
    dispatcher.stop()
threading.Thread(target=watch, daemon=True).start()
print("ready", flush=True)
dispatcher.run(handle_signals=False)
"""


def state(db: Path, key: str) -> str | None:
    conn = sqlite3.connect(db, timeout=10)
    try:
        row = conn.execute("SELECT state FROM oncewire_effects WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])
    finally:
        conn.close()


def running(dispatcher: Dispatcher) -> threading.Thread:
    thread = threading.Thread(target=lambda: dispatcher.run(handle_signals=False), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("where", ["this process", "another process"])
def test_an_idle_dispatcher_is_woken_by_an_accept(
    tmp_path: Path,
    where: str,
    python_child: Callable[..., Any],
    wait: Callable[..., None],
) -> None:
    db = tmp_path / "app.db"
    called = threading.Event()
    with Ledger(str(db)) as ledger:
        dispatcher = Dispatcher(ledger, {"noop": lambda attempt: called.set()}, poll_seconds=HOUR)
        thread = running(dispatcher)
        try:
            time.sleep(0.2)  # the dispatcher found nothing and sleeps for its hour
            if where == "this process":
                ledger.accept("k1", "noop", {"from": "parent"})
            else:
                child = python_child(ACCEPT_CHILD, str(db), "k1")
                assert child.wait(timeout=30) == 0, child.stderr.read()
            assert called.wait(timeout=20), "the dispatcher slept through the commit"
            wait(lambda: state(db, "k1") == "done", what="k1 done")
        finally:
            dispatcher.stop()
            thread.join(timeout=30)


def test_a_tool_call_waiting_for_another_process_is_woken_by_its_settlement(
    tmp_path: Path, python_child: Callable[..., Any]
) -> None:
    db = tmp_path / "app.db"
    with Ledger(str(db)) as ledger:
        child = python_child(DISPATCH_CHILD, str(db), stdin=-1)
        assert child.stdout.readline().strip() == "ready"
        try:
            call = {"id": "call_1", "function": {"name": "echo", "arguments": '{"x": 1}'}}
            messages = toolcalls.call(ledger, "turn-1", [call], wait_seconds=20, poll_seconds=HOUR)
        finally:
            _, err = child.communicate(input="", timeout=30)
            assert child.returncode == 0, err
    assert messages[0]["content"] == '{"echo": {"x": 1}}'
    assert state(db, "turn-1/call_1") == "done"


def test_the_watch_thread_ends_with_its_last_subscriber(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    with Ledger(str(db)) as ledger:
        woken: list[int] = []
        stop_one = ledger.store.subscribe(lambda: woken.append(1))
        stop_two = ledger.store.subscribe(lambda: woken.append(2))
        found = wake.watch(str(db), lambda: sqlite3.connect(db))
        thread = found._thread
        assert thread is not None and thread.is_alive()
        ledger.accept("k1", "noop", {})
        deadline = time.monotonic() + 20
        while sorted(set(woken)) != [1, 2] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(set(woken)) == [1, 2]
        stop_one()
        assert thread.is_alive()  # one subscriber is left
        stop_two()
        thread.join(timeout=20)
        assert not thread.is_alive()


def test_a_commit_right_after_the_first_subscription_wakes_it(tmp_path: Path) -> None:
    """The watching thread's first look is its baseline: a commit made after ``subscribe``
    returned but before that look (a thread slow to start on a busy machine, here a connection
    slow to open) must still wake the subscriber, not become part of the baseline."""
    db = tmp_path / "app.db"
    Ledger(str(db)).close()

    def slow_connect() -> sqlite3.Connection:
        time.sleep(0.3)
        return sqlite3.connect(db, check_same_thread=False)

    watch = wake.Watch(str(db), slow_connect)  # a watch of its own, not the process's
    woken = threading.Event()
    stop = watch.add(woken.set)
    try:
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE after_subscribing (x INTEGER)")
        assert woken.wait(timeout=20), "a commit made after subscribing woke nobody"
    finally:
        stop()


def test_a_sink_attempt_is_unchanged_by_wakeups(tmp_path: Path) -> None:
    """Wake-ups only make the dispatcher look sooner: every effect still runs once."""
    db = tmp_path / "app.db"
    calls: list[str] = []

    def sink(attempt: Attempt) -> None:
        calls.append(attempt.key)

    with Ledger(str(db)) as ledger:
        dispatcher = Dispatcher(ledger, {"noop": sink}, poll_seconds=HOUR)
        thread = running(dispatcher)
        try:
            for i in range(50):
                ledger.accept(f"k{i}", "noop", {"i": i})
            deadline = time.monotonic() + 30
            while len(calls) < 50 and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            dispatcher.stop()
            thread.join(timeout=30)
    assert sorted(calls) == sorted(f"k{i}" for i in range(50))
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT state, attempts, COUNT(*) FROM oncewire_effects GROUP BY 1, 2")
    assert rows.fetchall() == [("done", 1, 50)]
    conn.close()
