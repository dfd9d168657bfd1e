"""SQLiteDriver: one connection per thread, ``BEGIN IMMEDIATE`` writers, group commit.

The connection half of the SQLite backend (:mod:`oncewire.storage.driver`): the transaction the
caller shares with oncewire (:class:`SQLiteTransaction`, guarded by
:mod:`oncewire.storage.sqlguard`), a verb's own transaction, reads that survive a stored text
which is not UTF-8, and the group commit that flushes many commits with one fsync.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from oncewire.core.errors import InvalidState
from oncewire.storage.driver import StatementRunner, Transaction, store_transaction
from oncewire.storage.records import UndecodableText
from oncewire.storage.sql import Queries, queries
from oncewire.storage.sqlguard import SavepointStack, check_statement
from oncewire.storage.sqlite.connection import connect, translate_errors, translated

__all__ = ["SQLiteDriver", "SQLiteTransaction", "lenient_text", "undecodable_text"]


def lenient_text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        # Shown with replacement characters, and led by one so that no JSON decoder takes
        # the repaired text for the payload that was stored.
        return UndecodableText("\ufffd" + data.decode("utf-8", "replace"))


def undecodable_text(exc: BaseException | None) -> bool:
    """The driver's own failure to decode a stored text as UTF-8 (it has no result code)."""
    return isinstance(exc, sqlite3.OperationalError) and not hasattr(exc, "sqlite_errorcode")


class SQLiteTransaction:
    """An open SQLite write transaction (``BEGIN IMMEDIATE``), and the caller's view of it.

    ``execute`` takes ``?`` or ``:name`` placeholders and refuses what would end the
    transaction or change the connection (:mod:`oncewire.storage.sqlguard`). Used as a context
    manager it commits on normal exit and rolls back on an exception; the commit first checks
    that the transaction is still open. A class rather than a generator: every accept and every
    dispatcher step goes through it.
    """

    __slots__ = ("conn", "is_open", "savepoints", "what")

    def __init__(self, conn: sqlite3.Connection, what: str = "running a transaction") -> None:
        self.conn = conn
        self.what = what
        self.is_open = False
        self.savepoints = SavepointStack()

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        self.check_open()
        check_statement(sql, self.savepoints)
        return self.conn.execute(sql, params)

    def execute_internal(self, sql: str) -> None:
        """oncewire's own savepoint statements (which the caller may not release)."""
        self.check_open()
        self.conn.execute(sql)

    def check_open(self) -> None:
        """Refuse to go on unless this transaction is still the connection's open one."""
        if not self.is_open:
            raise InvalidState("use the transaction inside its with block")
        if not self.conn.in_transaction:
            # SQLite rolls a transaction back by itself on some errors (a full disk, an I/O
            # error): a statement run now would commit on its own, outside of it.
            raise InvalidState(
                "the transaction is no longer open (the database rolled it back after an "
                "error); nothing more was written and nothing will be committed"
            )

    def begin(self) -> None:
        if self.conn.in_transaction:
            raise InvalidState("a transaction is already open on this thread")
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise translated(f"{self.what}: beginning", exc) from exc
        self.is_open = True

    def end(self, failed: bool) -> None:
        conn = self.conn
        self.is_open = False
        if failed:
            self._rollback()
            return
        if not conn.in_transaction:
            raise InvalidState(
                "the transaction ended before its with block did; nothing more was committed"
            )
        try:
            conn.execute("COMMIT")
        except BaseException as exc:
            self._rollback()
            if isinstance(exc, sqlite3.Error):
                raise translated(f"{self.what}: committing", exc) from exc
            raise

    def _rollback(self) -> None:
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the original error is the one worth reporting

    def __enter__(self) -> SQLiteTransaction:
        self.begin()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.end(exc is not None)
        if isinstance(exc, sqlite3.Error):
            raise translated(self.what, exc) from exc


class _Write(SQLiteTransaction):
    """A verb's own transaction: yields the connection, translates errors as ``what``."""

    __slots__ = ()

    def __enter__(self) -> sqlite3.Connection:  # type: ignore[override]
        self.begin()
        return self.conn


class SQLiteDriver(StatementRunner):
    """The :class:`~oncewire.storage.driver.Driver` of one SQLite file."""

    dialect = "sqlite"
    # A chunk of settlements is one statement; 128 rows of 9 values stay far below SQLite's
    # limit on bound values and keep the padded statement texts few.
    values_chunk = 128

    def __init__(self, path: str, *, create: bool, busy_timeout_ms: int, synchronous: str) -> None:
        self.path = path
        self.queries: Queries = queries("sqlite")
        self.synchronous = synchronous
        self._create = create
        self._busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()

    # -- connections -------------------------------------------------------------------------
    def adopt(self, conn: sqlite3.Connection) -> None:
        """Keep ``conn`` (opened by the store to check and migrate the file) to be closed."""
        with self._all_lock:
            self._all.append(conn)

    def use(self, conn: sqlite3.Connection) -> None:
        """Make ``conn`` (already adopted) this thread's connection."""
        self._local.conn = conn

    def conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(
                self.path,
                create=self._create,
                busy_timeout_ms=self._busy_timeout_ms,
                synchronous=self.synchronous,
            )
            self._local.conn = conn
            self.adopt(conn)
        return conn

    def close(self) -> None:
        with self._all_lock:
            for conn in self._all:
                try:
                    conn.close()
                except sqlite3.ProgrammingError:
                    pass  # created in another thread that already closed it
            self._all.clear()
        self._local = threading.local()

    # -- transactions ------------------------------------------------------------------------
    def transaction(self) -> SQLiteTransaction:
        return SQLiteTransaction(self.conn())

    def write(self, what: str) -> _Write:
        return _Write(self.conn(), what)

    def translate_errors(self, what: str) -> translate_errors:
        return translate_errors(what)

    def tx_conn(self, tx: Transaction) -> sqlite3.Connection:
        tx = store_transaction(tx)
        if not isinstance(tx, SQLiteTransaction):
            raise InvalidState(
                f"this store is SQLite: {type(tx).__name__} is not one of its transactions; "
                "nothing was written"
            )
        tx.check_open()  # never write outside the caller's transaction (autocommit)
        return tx.conn

    def in_transaction(self, conn: Any) -> bool:
        return bool(conn.in_transaction)

    def caller_transaction(self, conn: Any) -> SQLiteTransaction:
        """The caller's own ``sqlite3`` connection, inside its own open transaction, as a
        transaction oncewire's ``_in_tx`` verbs write through (committing stays the caller's)."""
        if not isinstance(conn, sqlite3.Connection):
            raise InvalidState(
                f"this ledger's store is SQLite: accept_in takes a sqlite3 connection, not "
                f"{type(conn).__name__}; nothing was written"
            )
        try:
            open_tx = conn.in_transaction
        except sqlite3.ProgrammingError:  # closed
            open_tx = False
        if not open_tx:
            raise InvalidState(
                "accept_in needs a connection inside an open transaction (BEGIN, or a statement "
                "that writes, first); nothing was written"
            )
        tx = SQLiteTransaction(conn)
        tx.is_open = True
        return tx

    @contextlib.contextmanager
    def group_commit(self) -> Iterator[None]:
        conn = self.conn()
        if self.synchronous not in ("FULL", "EXTRA") or self.path == ":memory:":
            yield
            return
        # In WAL mode, synchronous=NORMAL still writes each commit to the WAL (a killed
        # process loses nothing); it skips the fsync, which one fsync of the WAL file at the
        # end of the block then does for every commit in it.
        with translate_errors("relaxing the flush for a group of commits"):
            conn.execute("PRAGMA synchronous = NORMAL")
        try:
            yield
        finally:
            with translate_errors("restoring the flush after a group of commits"):
                conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            try:
                fd = os.open(f"{self.path}-wal", os.O_RDONLY)
            except FileNotFoundError:
                pass  # checkpointed and removed: everything is in the database file
            else:
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    @contextlib.contextmanager
    def lenient(self) -> Iterator[None]:
        """Inside the block, a stored text that is not UTF-8 is read as :class:`UndecodableText`
        instead of failing the statement (for text written around oncewire)."""
        conn = self.conn()
        conn.text_factory = lenient_text
        try:
            yield
        finally:
            conn.text_factory = str

    # -- statements --------------------------------------------------------------------------
    def read_sql(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Rows of a statement given as text (every named query's read goes through here)."""
        conn = self.conn()
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if not undecodable_text(exc):
                raise translated("reading", exc) from exc
            # The driver could not decode a stored text as UTF-8 (written around oncewire):
            # read again with that text marked undecodable, so one bad row cannot make every
            # reader of the store fail.
            with self.lenient(), translate_errors("reading"):
                return conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise translated("reading", exc) from exc

    # -- execution strategy ------------------------------------------------------------------
    @contextlib.contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        conn = self.conn()
        if conn.in_transaction:
            yield conn  # the caller's transaction is the snapshot
            return
        with translate_errors("beginning a read"):
            # Deferred: in WAL mode the first read fixes the snapshot; no lock is taken
            # against writers.
            conn.execute("BEGIN")
        try:
            yield conn
        finally:
            if conn.in_transaction:
                with translate_errors("ending a read"):
                    conn.execute("ROLLBACK")

    def constraint_refusal(
        self, constraint: str, refusal: Callable[[], Exception]
    ) -> contextlib.nullcontext[None]:
        # SQLite names no constraint in its errors (only its message does, which is never
        # read). Nor is there a race to map: BEGIN IMMEDIATE made the transaction the only
        # writer from its first statement, so what it read still holds when it writes.
        return contextlib.nullcontext()
