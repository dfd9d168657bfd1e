"""A Ledger opened before ``os.fork()`` works in both processes, each on its own connection.

The driver kept one connection per thread and never looked at the process: a child forked by
a server (a pre-fork worker, a multiprocessing "fork" pool) wrote through its parent's
connection, two processes on one SQLite handle or one PostgreSQL socket, and closing its ledger
closed the parent's connection (on PostgreSQL, a Terminate sent on the parent's socket ends the
parent's session). Now the child notices the pid changed and opens connections of its own; it
never uses, nor closes, what it inherited. Each test forks for real: the child writes and closes
its ledger, then the parent writes again on the same connection as before, and both writes are
read from the store directly.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oncewire import Ledger, Receipts
from oncewire.storage import Transaction
from tests.support import tables

NOTES = "CREATE TABLE notes (who TEXT PRIMARY KEY, backend TEXT)"


def postgres(url: str) -> bool:
    return url.startswith("postgresql://")


def backend_id(url: str) -> str:
    """Which server session a statement runs in (SQLite: none to tell)."""
    return "pg_backend_pid()" if postgres(url) else "'sqlite'"


def in_child(child: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``child()`` in a forked child process; what it returned (or raised), as JSON."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.close(read)
            try:
                answer = {"ok": True, **child()}
            except BaseException as exc:
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            os.write(write, json.dumps(answer).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    answer: dict[str, Any] = json.loads(b"".join(chunks))
    assert answer.pop("ok"), answer
    return answer


def _note(tx: Any, url: str, who: str) -> None:
    tx.execute(
        f"INSERT INTO notes (who, backend) VALUES (:who, CAST({backend_id(url)} AS TEXT))",
        {"who": who},
    )


def test_a_ledger_opened_before_a_fork_works_in_both_processes(store_url: str) -> None:
    ledger = Ledger(store_url)
    try:
        with ledger.transaction() as tx:
            tx.execute(NOTES)
            _note(tx, store_url, "parent-before")
            tx.accept("parent-before", "mail", {"n": 1})
        parents = ledger.store.db.conn()

        def child() -> dict[str, Any]:
            mine = ledger.store.db.conn()
            with ledger.transaction() as tx:
                _note(tx, store_url, "child")
                tx.accept("child", "mail", {"n": 2})
            ledger.close()  # closes the child's own connections, never the parent's
            return {"same_connection": mine is parents}

        assert in_child(child) == {"same_connection": False}
        assert ledger.store.db.conn() is parents  # the parent's connection, still open
        with ledger.transaction() as tx:
            _note(tx, store_url, "parent-after")
            tx.accept("parent-after", "mail", {"n": 3})
        assert [e.key for e in ledger.effects.list()] == ["parent-before", "child", "parent-after"]
    finally:
        ledger.close()
    assert tables.rows(store_url, "SELECT key FROM oncewire_effects ORDER BY id") == [
        ("parent-before",),
        ("child",),
        ("parent-after",),
    ]
    sessions = dict(tables.rows(store_url, "SELECT who, backend FROM notes"))
    assert sorted(sessions) == ["child", "parent-after", "parent-before"]
    if postgres(store_url):  # the child's own session; the parent's survived the child's close
        assert sessions["parent-before"] == sessions["parent-after"] != sessions["child"]


def test_a_child_that_only_closes_the_ledger_leaves_the_parents_connection_open(
    store_url: str,
) -> None:
    ledger = Ledger(store_url)
    try:
        ledger.accept("before", "mail", {})
        parents = ledger.store.db.conn()
        assert in_child(lambda: (ledger.close(), {})[1]) == {}
        if postgres(store_url):  # the server still has the parent's session (no Terminate was sent)
            session = parents.info.backend_pid
            assert tables.rows(
                store_url, f"SELECT pid FROM pg_stat_activity WHERE pid = {session}"
            ) == [(session,)]
        assert ledger.store.db.conn() is parents
        ledger.accept("after", "mail", {})
    finally:
        ledger.close()
    assert tables.rows(store_url, "SELECT key FROM oncewire_effects ORDER BY id") == [
        ("before",),
        ("after",),
    ]


def test_receipts_opened_before_a_fork_work_in_the_child(store_url: str) -> None:
    receipts = Receipts(store_url)
    try:
        with receipts.store.transaction() as tx:
            tx.execute(NOTES)

        def work(who: str) -> Callable[[Transaction], str]:
            def write(tx: Transaction) -> str:
                _note(tx, store_url, who)
                return who

            return write

        receipts.run_once("r-parent", {}, work("parent"))
        answer = in_child(
            lambda: {"result": receipts.run_once("r-child", {}, work("child")).result}
        )
        assert answer == {"result": "child"}
        assert receipts.run_once("r-child", {}, work("again")).replayed
    finally:
        receipts.close()
    assert sorted(tables.rows(store_url, "SELECT key, result FROM oncewire_receipts")) == [
        ("r-child", '"child"'),
        ("r-parent", '"parent"'),
    ]
    sessions = dict(tables.rows(store_url, "SELECT who, backend FROM notes"))
    assert sorted(sessions) == ["child", "parent"]
    if postgres(store_url):
        assert sessions["child"] != sessions["parent"]  # the child's own session


def test_a_fork_while_another_thread_holds_the_write_lock_leaves_the_child_able_to_write(
    tmp_path: Path,
) -> None:
    # SQLite records the locks a process holds in memory all its connections share, and a
    # fork copies it: a child forked mid-transaction of another thread inherited "one of my
    # connections holds the write lock" from a connection it never sees, and every write of
    # its own waited out the busy timeout. The fork now waits for that commit.
    db = str(tmp_path / "app.db")
    ledger = Ledger(db)
    holding, done = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with ledger.transaction() as tx:
            tx.accept("held", "mail", {"n": 1})
            holding.set()
            time.sleep(0.5)  # the fork is asked for meanwhile
        done.set()

    holder = threading.Thread(target=hold_the_lock)
    try:
        holder.start()
        assert holding.wait(10)

        def child() -> dict[str, Any]:
            started = time.monotonic()
            ledger.accept("child", "mail", {"n": 2})
            ledger.close()
            return {"waited_under": time.monotonic() - started < 5}

        assert in_child(child) == {"waited_under": True}
        assert done.is_set()  # the fork was held back until the holder committed
    finally:
        holder.join(10)
        ledger.close()
    assert tables.rows(db, "SELECT key FROM oncewire_effects ORDER BY id") == [
        ("held",),
        ("child",),
    ]
