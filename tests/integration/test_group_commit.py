"""``group_commit=True``: the transactions of many threads share commits, each all or nothing.

On SQLite the callers' blocks run one at a time in savepoints of one shared transaction, and the
first caller of a group to finish commits for every caller queued before its turn. These tests
build a group on purpose: the first caller's block is held open until the others wait for the
connection (``GroupCommit.queued``), so that all of them share one commit; then they check,
from a connection of their own, what was stored, and from the committer's counts that it was
one commit. A failing caller is rolled back alone; a failing commit fails every caller of its
group; the callers' own savepoints work; an interrupt inside a block does not wedge anyone.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.core.errors import (
    ConfigurationError,
    InvalidState,
    PayloadConflict,
    StatementError,
    StorageError,
)
from oncewire.ledger import LedgerTransaction
from oncewire.storage.sqlite import SQLiteStore
from oncewire.storage.sqlite.group import GroupCommit
from tests.support.pg import fresh_schema, server_url

Block = Callable[[LedgerTransaction], None]


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "app.db")


@pytest.fixture
def ledger(path: str) -> Iterator[Ledger]:
    opened = Ledger(path, group_commit=True)
    with opened.transaction() as tx:
        tx.execute("CREATE TABLE callers (key TEXT PRIMARY KEY)")
        tx.execute("CREATE TABLE parents (id INTEGER PRIMARY KEY)")
        tx.execute(
            "CREATE TABLE children (id INTEGER PRIMARY KEY, parent INTEGER "
            "REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)"
        )
    try:
        yield opened
    finally:
        opened.close()


def committer(ledger: Ledger) -> GroupCommit:
    groups = getattr(ledger.store.db, "groups", None)
    assert isinstance(groups, GroupCommit)
    return groups


def stored(path: str, sql: str) -> list[Any]:
    with closing(sqlite3.connect(path, timeout=10)) as db:
        return [row[0] if len(row) == 1 else tuple(row) for row in db.execute(sql)]


def wait_until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30  # a hang, not a performance bound
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.001)


class Caller(threading.Thread):
    """One caller: ``with ledger.transaction() as tx: block(tx)``, its outcome kept."""

    def __init__(self, ledger: Ledger, block: Block) -> None:
        super().__init__(daemon=True)
        self.ledger, self.block = ledger, block
        self.error: BaseException | None = None
        self.returned = False

    def run(self) -> None:
        try:
            with self.ledger.transaction() as tx:
                self.block(tx)
            self.returned = True
        except BaseException as exc:  # KeyboardInterrupt included: the test looks at it
            self.error = exc


def writes(key: str, *, then: Callable[[LedgerTransaction], None] | None = None) -> Block:
    """A block that writes the caller's row and accepts its effect (and then, maybe, more)."""

    def block(tx: LedgerTransaction) -> None:
        tx.execute("INSERT INTO callers (key) VALUES (:key)", {"key": key})
        tx.accept(key, "notify", {"key": key})
        if then is not None:
            then(tx)

    return block


def one_group(ledger: Ledger, first: Block, *others: Block) -> list[Caller]:
    """Run every block, all in one group: ``first`` stays open until each other caller waits
    for the connection, so that they run, in order, before the commit that ``first`` leads."""
    groups = committer(ledger)
    release = threading.Event()

    def held(tx: LedgerTransaction) -> None:
        try:
            first(tx)
        finally:
            assert release.wait(30)

    callers = [Caller(ledger, held)]
    callers[0].start()
    wait_until(lambda: groups.queued() == 1, "the first caller holds the connection")
    for block in others:
        caller = Caller(ledger, block)
        callers.append(caller)
        caller.start()
        wait_until(functools.partial(queued, groups, len(callers)), "the next caller waits")
    release.set()
    for caller in callers:
        caller.join(30)
        assert not caller.is_alive(), "a caller never returned"
    return callers


def queued(groups: GroupCommit, callers: int) -> bool:
    return groups.queued() == callers


def raises(exc: BaseException) -> Callable[[LedgerTransaction], None]:
    def then(tx: LedgerTransaction) -> None:
        raise exc

    return then


def test_a_failing_caller_is_rolled_back_alone_and_the_others_share_one_commit(
    ledger: Ledger, path: str
) -> None:
    groups = committer(ledger)
    commits = groups.commits
    a, b, c = one_group(
        ledger,
        writes("a"),
        writes("b", then=raises(RuntimeError("b fails"))),
        writes("c"),
    )
    assert a.returned and c.returned and a.error is None and c.error is None
    assert isinstance(b.error, RuntimeError) and not b.returned
    assert stored(path, "SELECT key FROM callers ORDER BY key") == ["a", "c"]
    assert stored(path, "SELECT key FROM oncewire_effects ORDER BY key") == ["a", "c"]
    assert groups.commits == commits + 1  # a and c: one commit for both


def test_a_statement_error_fails_its_caller_only(ledger: Ledger, path: str) -> None:
    def duplicate(tx: LedgerTransaction) -> None:
        tx.execute("INSERT INTO callers (key) VALUES (:key)", {"key": "a"})  # a's key, taken

    a, b, c = one_group(ledger, writes("a"), writes("b", then=duplicate), writes("c"))
    assert isinstance(b.error, StatementError)
    assert a.returned and c.returned
    assert stored(path, "SELECT key FROM callers ORDER BY key") == ["a", "c"]
    assert stored(path, "SELECT key FROM oncewire_effects ORDER BY key") == ["a", "c"]


def test_a_failing_commit_reaches_every_caller_of_the_group_and_stores_nothing(
    ledger: Ledger, path: str
) -> None:
    groups = committer(ledger)

    def dangling(tx: LedgerTransaction) -> None:
        # A deferred foreign key: checked only by the shared COMMIT, which it makes fail.
        tx.execute("INSERT INTO children (id, parent) VALUES (1, 404)")

    commits = groups.commits
    callers = one_group(ledger, writes("a"), writes("b", then=dangling), writes("c"))
    for caller in callers:
        assert isinstance(caller.error, StatementError), caller.error
        assert "committing" in str(caller.error)
        assert not caller.returned
    assert callers[0].error is not callers[2].error  # each caller its own exception
    assert stored(path, "SELECT COUNT(*) FROM callers") == [0]
    assert stored(path, "SELECT COUNT(*) FROM oncewire_effects") == [0]
    assert stored(path, "SELECT COUNT(*) FROM children") == [0]
    assert groups.commits == commits
    # The next group begins afresh.
    ledger.accept("after", "notify", {})
    assert stored(path, "SELECT key FROM oncewire_effects") == ["after"]


def test_a_statement_that_rolls_the_whole_transaction_back_fails_the_group(
    ledger: Ledger, path: str
) -> None:
    def or_rollback(tx: LedgerTransaction) -> None:
        # SQLite ends the whole shared transaction here, the others' work in it too.
        tx.execute("INSERT OR ROLLBACK INTO callers (key) VALUES (:key)", {"key": "a"})

    a, b, c = one_group(ledger, writes("a"), writes("b", then=or_rollback), writes("c"))
    assert isinstance(b.error, StatementError)
    assert isinstance(a.error, StorageError) and "rolled back by the database" in str(a.error)
    assert c.returned and c.error is None  # c came after: a new transaction of its own
    assert stored(path, "SELECT key FROM callers ORDER BY key") == ["c"]
    assert stored(path, "SELECT key FROM oncewire_effects ORDER BY key") == ["c"]


def test_the_callers_own_savepoints_work_inside_a_group(ledger: Ledger, path: str) -> None:
    def nested(tx: LedgerTransaction) -> None:
        tx.execute("INSERT INTO callers (key) VALUES ('b1')")
        tx.execute("SAVEPOINT mine")
        tx.execute("INSERT INTO callers (key) VALUES ('b-undone')")
        tx.execute("ROLLBACK TO mine")
        tx.execute("INSERT INTO callers (key) VALUES ('b2')")
        tx.execute("RELEASE mine")
        tx.execute("SAVEPOINT left_open")  # released with the caller's block
        tx.execute("INSERT INTO callers (key) VALUES ('b3')")
        store = tx.store_transaction
        with pytest.raises(RuntimeError), ledger.store.savepoint_in_tx(store, "verb"):
            tx.execute("INSERT INTO callers (key) VALUES ('b-verb')")
            raise RuntimeError("undo the verb's scope")
        for refused in ("RELEASE oncewire_caller", "ROLLBACK TO oncewire_caller", "COMMIT"):
            with pytest.raises(InvalidState):
                tx.execute(refused)
        tx.accept("b", "notify", {})

    a, b, c = one_group(ledger, writes("a"), nested, writes("c"))
    assert a.returned and b.returned and c.returned, (a.error, b.error, c.error)
    assert stored(path, "SELECT key FROM callers ORDER BY key") == ["a", "b1", "b2", "b3", "c"]
    assert stored(path, "SELECT key FROM oncewire_effects ORDER BY key") == ["a", "b", "c"]


@pytest.mark.parametrize("where", ["first", "middle"])
def test_an_interrupt_inside_a_block_does_not_wedge_the_group(
    ledger: Ledger, path: str, where: str
) -> None:
    interrupt = writes("x", then=raises(KeyboardInterrupt()))
    if where == "first":  # the caller that would have led
        callers = one_group(ledger, interrupt, writes("b"), writes("c"))
    else:
        callers = one_group(ledger, writes("a"), interrupt, writes("c"))
    interrupted = callers[0] if where == "first" else callers[1]
    assert isinstance(interrupted.error, KeyboardInterrupt)
    others = [caller for caller in callers if caller is not interrupted]
    assert all(caller.returned for caller in others), [caller.error for caller in others]
    expected = ["b", "c"] if where == "first" else ["a", "c"]
    assert stored(path, "SELECT key FROM callers ORDER BY key") == expected
    assert stored(path, "SELECT key FROM oncewire_effects ORDER BY key") == expected
    ledger.accept("after", "notify", {})  # nothing is left holding the connection
    assert "after" in stored(path, "SELECT key FROM oncewire_effects")


def test_a_second_transaction_on_the_same_thread_is_refused_not_a_deadlock(
    ledger: Ledger, path: str
) -> None:
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO callers (key) VALUES ('outer')")
        with pytest.raises(InvalidState, match="already open on this thread"):
            ledger.accept("inner", "notify", {})
        # The store's verbs run on the shared connection while the block runs: a read sees
        # the block's own writes, as in a transaction of the thread's own.
        tx.accept("outer", "notify", {})
        assert ledger.effects.get("outer").key == "outer"
    assert stored(path, "SELECT key FROM oncewire_effects") == ["outer"]


def test_eight_threads_each_commit_all_or_nothing_in_shared_commits(
    ledger: Ledger, path: str
) -> None:
    groups = committer(ledger)
    commits, committed = groups.commits, groups.committed
    succeeded: list[str] = []
    failed: list[str] = []
    lock = threading.Lock()

    def worker(thread: int) -> None:
        for n in range(40):
            key = f"t{thread}-{n:02d}"
            try:
                with ledger.transaction() as tx:
                    writes(key)(tx)
                    if n % 5 == 3:
                        raise RuntimeError("this caller changes its mind")
            except RuntimeError:
                with lock:
                    failed.append(key)
                continue
            with lock:
                succeeded.append(key)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(succeeded) == 8 * 32 and len(failed) == 8 * 8
    assert stored(path, "SELECT key FROM callers ORDER BY key") == sorted(succeeded)
    assert stored(path, "SELECT key FROM oncewire_effects ORDER BY key") == sorted(succeeded)
    assert groups.committed - committed == len(succeeded)
    assert groups.commits - commits < len(succeeded), "no commit was shared"


def test_an_accept_alone_joins_the_group(ledger: Ledger, path: str) -> None:
    """Ledger.accept outside a transaction of the caller's takes the shared transaction too:
    its one statement and its commit are grouped with the other threads'."""
    groups = committer(ledger)
    committed = groups.committed
    keys = [f"alone-{n}" for n in range(40)]
    threads = [
        threading.Thread(target=lambda k=k: ledger.accept(k, "notify", {"key": k})) for k in keys
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert stored(
        path, "SELECT key FROM oncewire_effects WHERE key LIKE 'alone-%' ORDER BY key"
    ) == sorted(keys)
    assert groups.committed - committed >= len(keys)  # every accept went through the group


def test_a_wake_up_comes_after_the_shared_commit(ledger: Ledger, path: str) -> None:
    seen: list[int] = []
    stop = ledger.store.subscribe(
        lambda: seen.append(stored(path, "SELECT COUNT(*) FROM callers")[0])
    )
    try:
        time.sleep(0.05)  # the watcher's first look
        seen.clear()
        one_group(ledger, writes("a"), writes("b"), writes("c"))
        wait_until(lambda: 3 in seen, "a wake-up shows the group's rows")
    finally:
        stop()
    assert set(seen) == {3}, "a wake-up came before the shared commit"


def test_a_forked_child_commits_through_its_own_shared_transaction(
    ledger: Ledger, path: str
) -> None:
    ledger.accept("parent-before", "notify", {})
    pid = os.fork()
    if pid == 0:  # the child: several threads, through a committer of its own
        code = 1
        try:
            threads = [
                threading.Thread(target=ledger.accept, args=(f"child-{n}", "notify", {}))
                for n in range(4)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            ledger.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    ledger.accept("parent-after", "notify", {})
    keys = stored(path, "SELECT key FROM oncewire_effects ORDER BY key")
    assert keys == ["child-0", "child-1", "child-2", "child-3", "parent-after", "parent-before"]


def test_read_only_and_in_memory_stores_do_not_group(ledger: Ledger, path: str) -> None:
    ledger.accept("written", "notify", {})
    with Ledger(path, read_only=True, group_commit=True) as reader:
        assert not reader.store.commits_grouped
        assert reader.effects.get("written").key == "written"
        with pytest.raises(StorageError):
            reader.accept("refused", "notify", {})
    memory = SQLiteStore(":memory:", group_commit=True)
    try:
        assert not memory.commits_grouped
    finally:
        memory.close()
    assert ledger.store.commits_grouped


def test_group_commit_applies_to_a_store_the_ledger_opens(path: str) -> None:
    store = SQLiteStore(path)
    try:
        with pytest.raises(ConfigurationError, match="group_commit"):
            Ledger(store, group_commit=True)
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_concurrent_callers_keep_their_own_outcome_on_every_backend(
    backend: str, tmp_path: Path
) -> None:
    if backend == "sqlite":
        url = str(tmp_path / "app.db")
        schema: Any = None
    else:
        schema = fresh_schema(server_url(), "group")
        url = schema.__enter__()
    try:
        with Ledger(url, group_commit=True) as grouped:
            assert grouped.store.commits_grouped
            with grouped.transaction() as tx:
                tx.execute("CREATE TABLE callers (key TEXT PRIMARY KEY)")
            outcomes: dict[str, bool] = {}

            def caller(key: str, fail: bool) -> None:
                try:
                    with grouped.transaction() as tx:
                        writes(key)(tx)
                        if fail:
                            raise RuntimeError("rolled back")
                    outcomes[key] = True
                except RuntimeError:
                    outcomes[key] = False

            threads = [
                threading.Thread(target=caller, args=(f"k{n}", n % 3 == 0)) for n in range(24)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            kept = sorted(key for key, ok in outcomes.items() if ok)
            assert len(outcomes) == 24 and len(kept) == 16
            with grouped.store.db.snapshot() as conn:
                rows = conn.execute("SELECT key FROM callers ORDER BY key").fetchall()
            assert [row[0] for row in rows] == kept
            assert sorted(e.key for e in grouped.effects.list(limit=100)) == kept
    finally:
        if schema is not None:
            schema.__exit__(None, None, None)


def test_a_caller_that_fails_alone_leaves_no_transaction_holding_the_file(
    ledger: Ledger, path: str
) -> None:
    # Regression: the shared transaction, begun for a caller whose block then failed, stayed
    # open with nobody in it to commit it, and held the write lock against every other
    # connection (another process's accept waited out its busy timeout).
    ledger.accept("k", "mail", {})
    with pytest.raises(RuntimeError), ledger.transaction() as tx:
        writes("a")(tx)
        raise RuntimeError("fails alone")
    with pytest.raises(PayloadConflict):
        ledger.accept("k", "sms", {})
    with closing(sqlite3.connect(path, timeout=0, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")  # the lock is free at once
        other.execute("INSERT INTO callers (key) VALUES ('other')")
        other.execute("COMMIT")
    assert stored(path, "SELECT key FROM callers") == ["other"]
