"""Group commit on SQLite: the transactions of many threads share one ``COMMIT``.

With ``group_commit=True`` (:mod:`oncewire.storage.grouping`), :meth:`SQLiteDriver.transaction`
hands out a place in a shared transaction instead of a transaction of the thread's own:

- One connection of the store holds the shared transaction (``BEGIN IMMEDIATE``, begun by the
  first caller of a group). The connection is used by one caller at a time, first come, first
  served (:class:`_Turns`): a caller's block is one turn, a group's commit another.
- A caller's block runs inside a savepoint of its own (oncewire's: the caller's SQL may not
  release it or roll back to it; the caller's own savepoints work as before, above it). While
  the block runs, the shared connection is the thread's connection, so that the store's other
  verbs behave as they do inside a transaction of the thread's own (a read sees the block's
  writes, a write of its own is refused as a second transaction on the thread).
- A block that raises (any exception, ``KeyboardInterrupt`` included) is rolled back to its
  savepoint, and the caller gets its exception: the others are untouched. A block that ends
  normally is released into the shared transaction and its caller joins the group.
- The first caller of a group to finish its block leads: it queues for a turn, and every caller
  whose turn comes before the leader's joins the group; at its turn the leader commits the
  shared transaction (one ``COMMIT``, one flush at ``synchronous=FULL``) and releases every
  caller of the group at once. Callers that arrive while the commit runs wait for the
  connection and form the next group. Each caller returns only after the commit that holds its
  transaction is durable.
- A failing ``COMMIT`` (a deferred constraint that one caller violated, a full disk) rolls the
  shared transaction back: every caller of the group gets the error, and nothing of the group
  is stored. So does a statement after which SQLite rolled the whole transaction back by itself
  (a full disk, ``INSERT OR ROLLBACK``): the callers already in the group get an error saying
  so, and the caller whose statement it was gets its own.

A commit is a real commit of the file: whatever waits on it (``subscribe``: ``PRAGMA
data_version``, by any connection of any process) learns of it after the shared commit, as of
any other. A process forked from this one starts with a group committer of its own
(:meth:`SQLiteDriver.forked`), never the parent's connection.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from oncewire.core.errors import InvalidState, StorageError
from oncewire.storage.grouping import AFTER_SHARED_COMMIT, BEFORE_SHARED_COMMIT
from oncewire.storage.sqlite.errors import translated
from oncewire.storage.sqlite.guard import CallerGuard

if TYPE_CHECKING:
    from oncewire.storage.sqlite.driver import SQLiteDriver, SQLiteTransaction

__all__ = ["GroupCommit"]

# The savepoint of each caller's block (oncewire's: the caller's SQL cannot release it).
SAVEPOINT = "oncewire_caller"

_LOST = (
    "the shared transaction of this caller's group was rolled back by the database after a "
    "statement of another caller in the group (group_commit); nothing of this transaction was "
    "committed"
)
_INTERRUPTED = (
    "the commit shared by this caller's group was interrupted before it ran (group_commit); "
    "nothing of this transaction was committed"
)


class _Turns:
    """Who uses the shared connection: one thread at a time, first come, first served.

    A thread that finds the connection taken waits on a lock of its own, which the thread
    whose turn ends releases: the turn is handed to the next thread in line, and only that
    thread wakes.
    """

    __slots__ = ("_busy", "_lock", "_waiting", "holder")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = False  # a thread holds the turn, or it is being handed to one
        self._waiting: deque[threading.Lock] = deque()
        self.holder: int | None = None  # the thread whose turn it is

    def take(self, *, interruptible: bool = True) -> BaseException | None:
        """Wait for this thread's turn.

        An exception while waiting (``KeyboardInterrupt``) gives the place up and is raised;
        unless ``interruptible`` is false (a leader, whose group waits on its commit): then the
        thread waits on, and the exception is returned once the turn is the thread's.
        """
        with self._lock:
            if not self._busy:
                self._busy = True
                self.holder = threading.get_ident()
                return None
            mine = threading.Lock()
            mine.acquire()
            self._waiting.append(mine)
        deferred: BaseException | None = None
        while True:
            try:
                mine.acquire()  # released by the thread that hands the turn over
                break
            except BaseException as exc:
                if not interruptible:
                    deferred = exc
                    continue
                with self._lock:
                    try:
                        self._waiting.remove(mine)
                    except ValueError:  # handed over as the exception came: pass it on
                        self._hand_over()
                raise
        self.holder = threading.get_ident()
        return deferred

    def give(self) -> None:
        with self._lock:
            self.holder = None
            self._hand_over()

    def others_waiting(self) -> bool:
        return bool(self._waiting)

    def queued(self) -> int:
        with self._lock:
            return len(self._waiting) + self._busy

    def _hand_over(self) -> None:
        if self._waiting:
            self._waiting.popleft().release()
        else:
            self._busy = False


class _Group:
    """The callers whose blocks share one open transaction, until its commit."""

    __slots__ = ("cause", "done", "failure", "led", "size")

    def __init__(self) -> None:
        self.size = 0  # callers whose block was released into the transaction
        self.led = False  # a caller queued to commit it
        self.done = threading.Event()
        self.failure: Callable[[], BaseException] | None = None  # a new error per caller
        self.cause: BaseException | None = None

    def fail(self, failure: Callable[[], BaseException], cause: BaseException | None) -> None:
        self.failure, self.cause = failure, cause
        self.done.set()

    def outcome(self) -> None:
        """Return if the group committed; raise its failure (one instance per caller)."""
        if self.failure is not None:
            raise self.failure() from self.cause


class GroupCommit:
    """The shared transaction of one store in this process (see the module docstring)."""

    def __init__(self, driver: SQLiteDriver) -> None:
        self.driver = driver
        self._turns = _Turns()
        self._lock = threading.Lock()  # a group's size and leader
        self._conn: sqlite3.Connection | None = None
        self._guard: CallerGuard | None = None
        self._group: _Group | None = None  # open on the connection, taking callers
        self.commits = 0  # shared commits that succeeded
        self.committed = 0  # callers' transactions they made durable

    def transaction(self) -> _Member:
        return _Member(self)

    def queued(self) -> int:
        """Callers waiting for the shared connection, or holding it (blocks and commits)."""
        return self._turns.queued()

    def holds_turn(self) -> bool:
        return self._turns.holder == threading.get_ident()

    # -- the connection (only while this thread holds the turn) ------------------------------
    def _connection(self) -> sqlite3.Connection:
        conn = self._conn
        if conn is None:
            conn = self._conn = self.driver.connect()
            self.driver.track(conn)  # closed with the driver, left alone in a forked child
            self._guard = CallerGuard(conn)
        return conn

    def _open_group(self, conn: sqlite3.Connection) -> _Group:
        group = self._group
        if group is not None and not conn.in_transaction:
            self._lose(group, None)  # cannot happen unnoticed; never join a vanished one
            group = None
        if group is None:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise translated("running a transaction: beginning", exc, self.driver.path) from exc
            group = self._group = _Group()
        return group

    def _lose(self, group: _Group, cause: BaseException | None) -> None:
        """The shared transaction is gone: every caller of ``group`` learns it."""
        if self._group is group:
            self._group = None
        if not group.done.is_set():
            group.fail(lambda: StorageError(_LOST), cause)

    def _abort(self, group: _Group, cause: BaseException) -> None:
        """Roll the shared transaction back after oncewire's own statement failed on it."""
        conn = self._conn
        if conn is not None and conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        self._lose(group, cause)

    def _end_block(self, group: _Group, failed: bool) -> None:
        """Roll a failed block back to its savepoint, or release a finished one into the
        shared transaction (and count its caller in the group)."""
        conn = self._conn
        assert conn is not None
        if not conn.in_transaction:  # the database rolled the whole transaction back
            self._lose(group, None)
            if failed:
                return  # the caller's own error says why
            raise InvalidState(
                "the transaction ended before its with block did (the database rolled it back "
                "after an error); nothing of it was committed"
            )
        try:
            if failed:
                conn.execute(f'ROLLBACK TO SAVEPOINT "{SAVEPOINT}"')
            conn.execute(f'RELEASE SAVEPOINT "{SAVEPOINT}"')
        except BaseException as exc:
            self._abort(group, exc)
            if isinstance(exc, sqlite3.Error):
                raise translated("running a transaction: ending", exc, self.driver.path) from exc
            raise
        if failed:
            self._close_if_empty()
        else:
            with self._lock:
                group.size += 1

    def _close_if_empty(self) -> None:
        """End the shared transaction if no caller's block is in it: nobody would commit it,
        and it holds the file's write lock against every other connection."""
        group, conn = self._group, self._conn
        if group is None or group.size or conn is None:
            return
        self._group = None
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                raise translated("running a transaction: ending", exc, self.driver.path) from exc

    # -- the commit --------------------------------------------------------------------------
    def _lead(self, group: _Group) -> bool:
        """Whether this caller, whose block just joined ``group``, commits it."""
        with self._lock:
            lead = not group.led and not group.done.is_set()
            group.led = True
        return lead

    def _await_commit(self, group: _Group, lead: bool) -> None:
        if lead:
            # Everyone queued before this turn joins the group: then it commits, once.
            deferred = self._turns.take(interruptible=False)
            try:
                self._commit(group)
            finally:
                self._turns.give()
            if deferred is not None:
                raise deferred
        else:
            group.done.wait()
        group.outcome()

    def _commit(self, group: _Group) -> None:
        if group.done.is_set():
            return  # lost before its turn came (the callers were told)
        if self._group is group:
            self._group = None  # whoever comes next begins the next group
        conn = self._conn
        assert conn is not None
        try:
            BEFORE_SHARED_COMMIT.hit()
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            path = self.driver.path
            if isinstance(exc, sqlite3.Error):
                error = exc
                what = "running a transaction: committing a group"
                group.fail(lambda: translated(what, error, path), exc)
                return
            group.fail(lambda: StorageError(_INTERRUPTED), exc)
            if isinstance(exc, Exception):
                return
            raise  # the leader's own interrupt; the others learn of it as a StorageError
        self.commits += 1
        self.committed += group.size
        AFTER_SHARED_COMMIT.hit()
        group.done.set()


class _Member:
    """One caller's block in the shared transaction: ``with store.transaction() as tx``."""

    __slots__ = ("committer", "group", "lent", "tx")

    def __init__(self, committer: GroupCommit) -> None:
        self.committer = committer
        self.group: _Group | None = None
        self.tx: SQLiteTransaction | None = None
        self.lent: Any = None

    def __enter__(self) -> SQLiteTransaction:
        committer = self.committer
        driver = committer.driver
        own = driver.own_conn()
        if committer.holds_turn() or (own is not None and own.in_transaction):
            raise InvalidState("a transaction is already open on this thread")
        committer._turns.take()
        try:
            conn = committer._connection()
            group = committer._open_group(conn)
            conn.execute(f'SAVEPOINT "{SAVEPOINT}"')
        except BaseException as exc:
            try:
                committer._close_if_empty()
            finally:
                committer._turns.give()
            if isinstance(exc, sqlite3.Error):
                raise translated("running a transaction: beginning", exc, driver.path) from exc
            raise
        tx = driver.shared_transaction(conn, committer._guard)
        tx.savepoints.opened(SAVEPOINT, by_caller=False)
        self.group, self.tx = group, tx
        self.lent = driver.lend(conn)
        return tx

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        committer, group, tx = self.committer, self.group, self.tx
        assert group is not None and tx is not None
        tx.is_open = False
        committer.driver.lend(self.lent)
        turns = committer._turns
        lead = committed_here = False
        try:
            committer._end_block(group, exc is not None)
            if exc is None:
                lead = committer._lead(group)
                if lead and not turns.others_waiting():
                    committed_here = True  # nobody else in line: commit on the turn held
                    committer._commit(group)
        finally:
            turns.give()
        if exc is not None:
            if isinstance(exc, sqlite3.Error):
                raise translated(tx.what, exc, tx.store) from exc
            return  # the block's own exception goes on
        if committed_here:
            group.outcome()
        else:
            committer._await_commit(group, lead)
