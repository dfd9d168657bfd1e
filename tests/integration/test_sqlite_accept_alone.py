"""SQLite: ``Ledger.accept`` outside a transaction is one autocommit statement.

SQLite commits a statement run outside ``BEGIN`` when it completes, and a statement that writes
takes the write lock before it reads, as ``BEGIN IMMEDIATE`` would. What the connection ran is
read from sqlite3's trace callback; what was stored, from separate connections (``peek``) and
from a child killed with SIGKILL. Killed at its crash point, it stores nothing
(``tests/integration/test_crash_points_kill.py``).
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.core.errors import InvalidState, StoreFull
from oncewire.storage.sqlite import SQLiteStore

Child = Callable[..., subprocess.Popen[str]]
Peek = Callable[..., list[tuple[Any, ...]]]


def test_an_accept_alone_is_its_insert_and_is_committed_when_it_returns(
    db_path: Path, peek: Peek
) -> None:
    with Ledger(str(db_path)) as ledger:
        ledger.accept("warm", "send", {})
        conn = ledger.store.db.conn()  # type: ignore[attr-defined]
        sent: list[str] = []
        conn.set_trace_callback(sent.append)
        try:
            ledger.accept("k", "send", {"n": 1})
            # Read by another connection before this ledger does anything else.
            seen = peek(db_path, "SELECT key, state, payload FROM oncewire_effects WHERE key = 'k'")
        finally:
            conn.set_trace_callback(None)
        assert not conn.in_transaction
    assert seen == [("k", "pending", '{"n":1}')]
    assert len(sent) == 1 and sent[0].startswith("INSERT INTO oncewire_effects"), sent


def test_an_accept_alone_inside_an_open_transaction_is_refused(db_path: Path, peek: Peek) -> None:
    with Ledger(str(db_path)) as ledger:
        with ledger.transaction() as tx:
            tx.execute("CREATE TABLE caller_rows (id INTEGER PRIMARY KEY)")
        with ledger.transaction() as tx:
            tx.execute("INSERT INTO caller_rows VALUES (9)")
            with pytest.raises(InvalidState, match="already open"):
                ledger.accept("inside", "send", {"n": 1})
    assert peek(db_path, "SELECT COUNT(*) FROM oncewire_effects") == [(0,)]
    assert peek(db_path, "SELECT id FROM caller_rows") == [(9,)]


def test_an_accept_alone_waits_for_another_writer_then_commits(db_path: Path, peek: Peek) -> None:
    with Ledger(str(db_path)) as ledger:
        with ledger.transaction() as tx:
            tx.execute("CREATE TABLE caller_rows (id INTEGER PRIMARY KEY)")
        blocker = sqlite3.connect(str(db_path), isolation_level=None, check_same_thread=False)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            blocker.execute("INSERT INTO caller_rows VALUES (1)")
            release = threading.Timer(0.3, blocker.execute, ("COMMIT",))
            release.start()
            started = time.monotonic()
            ledger.accept("k", "send", {})
            waited = time.monotonic() - started
            release.join()
        finally:
            blocker.close()
    # It waited for the lock (the busy timeout), not failed: both writes are there.
    assert waited >= 0.2, waited
    assert peek(db_path, "SELECT id FROM caller_rows") == [(1,)]
    assert peek(db_path, "SELECT key FROM oncewire_effects") == [("k",)]


def test_a_full_database_refuses_an_accept_alone_and_stores_nothing(
    db_path: Path, peek: Peek
) -> None:
    store = SQLiteStore(str(db_path))
    ledger = Ledger(store)
    try:
        conn = store.db.conn()
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        conn.execute(f"PRAGMA max_page_count = {pages + 1}")
        accepted: list[str] = []
        failed: StoreFull | None = None
        for i in range(2_000):
            try:
                ledger.accept(f"k{i:04d}", "send", {"pad": "x" * 500})
            except StoreFull as exc:
                failed = exc
                break
            accepted.append(f"k{i:04d}")
        assert failed is not None, "the page limit was never reached"
        assert str(db_path) in str(failed) and "disk full" in str(failed), str(failed)
        assert not conn.in_transaction
        stored = [key for (key,) in peek(db_path, "SELECT key FROM oncewire_effects ORDER BY key")]
        assert stored == accepted
        conn.execute("PRAGMA max_page_count = 1000000")
        refused = f"k{len(accepted):04d}"
        ledger.accept(refused, "send", {"pad": "x" * 500})  # space returns: accepted now
    finally:
        ledger.close()
    assert peek(db_path, "SELECT COUNT(*) FROM oncewire_effects WHERE key = ?", (refused,)) == [
        (1,)
    ]


ACCEPT_MANY = """
import sys
from oncewire import Ledger
with Ledger(sys.argv[1]) as ledger:
    for n in range(100_000):
        ledger.accept(f"k{n:06d}", "send", {"n": n})
        print(n, flush=True)
"""


def test_every_accept_alone_that_returned_survives_a_sigkill(
    db_path: Path, python_child: Child, peek: Peek
) -> None:
    Ledger(str(db_path)).close()
    child = python_child(ACCEPT_MANY, str(db_path))
    assert child.stdout is not None
    returned = -1
    for line in child.stdout:
        returned = int(line)
        if returned >= 300:
            break
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    rest = child.stdout.read()
    returned = max([returned, *(int(line) for line in rest.splitlines() if line.strip())])
    keys = [key for (key,) in peek(db_path, "SELECT key FROM oncewire_effects ORDER BY key")]
    # Every accept that returned was committed; at most the one under way when the kill landed
    # is there besides, whole.
    assert keys[: returned + 1] == [f"k{n:06d}" for n in range(returned + 1)]
    assert len(keys) - (returned + 1) in (0, 1), (len(keys), returned)
    payloads = peek(db_path, "SELECT key, payload FROM oncewire_effects")
    assert all(payload == f'{{"n":{int(key[1:])}}}' for key, payload in payloads)
