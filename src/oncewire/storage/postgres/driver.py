"""PostgresDriver: per-thread autocommit connections, explicit transactions, LISTEN/NOTIFY.

The connection half of the PostgreSQL backend (:mod:`oncewire.storage.driver`). Each thread
gets its own autocommit connection; a transaction is an explicit ``BEGIN`` through
``conn.transaction()``. A connection the server dropped (restart, ``pg_terminate_backend``) is
discarded and replaced at the next call; the error of the call that found it broken reaches the
caller as a :class:`StorageError`, because a commit whose answer was lost is not known to have
failed. A read outside a transaction is run again once on a fresh connection; inside one (a
read snapshot) it is not, because the answer would come from another moment.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from oncewire.core.errors import InvalidState
from oncewire.storage.driver import Pipeline, StatementRunner, Transaction, store_transaction
from oncewire.storage.postgres.connection import connect, psycopg, translate_errors, translated
from oncewire.storage.sql import Queries, queries
from oncewire.storage.sqlguard import SavepointStack, check_statement, named_to_pyformat

__all__ = ["CHANNEL", "PostgresDriver", "PostgresTransaction"]

CHANNEL = "oncewire_effects"

_IDLE, _INTRANS, _INERROR = 0, 2, 3  # libpq's PQtransactionStatus

T = TypeVar("T")


class _Begun:
    """Ends a psycopg transaction block that :meth:`PostgresStore._begin` already entered."""

    __slots__ = ("block",)

    def __init__(self, block: Any) -> None:
        self.block = block

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        return bool(self.block.__exit__(exc_type, exc, tb))


class _TupleRows:
    """The caller's connection as oncewire's verbs read it: rows as tuples, whatever
    ``row_factory`` the caller gave the connection (``dict_row`` is common)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    @property
    def info(self) -> Any:
        return self._conn.info

    def execute(self, sql: Any, params: Any = None) -> Any:
        cursor = self._conn.cursor(row_factory=psycopg.rows.tuple_row)
        return cursor.execute(sql, params)


class PostgresTransaction:
    """The caller's view of an open PostgreSQL transaction.

    ``execute`` takes ``:name`` placeholders with a dict (the portable form, translated to
    ``%(name)s``) or psycopg's own ``%s`` / ``%(name)s``, and refuses what would end the
    transaction or change the connection (:mod:`oncewire.storage.sqlguard`), and several
    statements in one string.
    """

    __slots__ = ("conn", "is_open", "savepoints")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.is_open = True
        self.savepoints = SavepointStack()

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        self.check_open()
        check_statement(sql, self.savepoints)
        if isinstance(params, Mapping):
            sql = named_to_pyformat(sql) or sql
        return self.conn.execute(sql, params or None)

    def execute_internal(self, sql: str) -> None:
        """oncewire's own savepoint statements (which the caller may not release)."""
        self.check_open()
        self.conn.execute(sql)

    def check_open(self) -> None:
        """Refuse to go on unless this transaction is still open on its connection."""
        if not self.is_open:
            raise InvalidState("use the transaction inside its with block")
        if self.conn.info.transaction_status not in (_INTRANS, _INERROR):
            raise InvalidState(
                "the transaction is no longer open; nothing more was written and nothing "
                "will be committed"
            )


class PostgresDriver(StatementRunner):
    """The :class:`~oncewire.storage.driver.Driver` of one PostgreSQL database (or schema)."""

    dialect = "postgresql"
    # Settlements and renewals travel as one array per column (unnest): one statement for all.
    values_chunk = 1_000_000

    def __init__(self, url: str, *, connect_timeout: int | None) -> None:
        self.url = url
        self.queries: Queries = queries("postgresql")
        self._connect_timeout = connect_timeout
        self._local = threading.local()
        self._all: list[Any] = []
        self._all_lock = threading.Lock()

    # -- connections -------------------------------------------------------------------------
    def conn(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is not None and (conn.closed or conn.broken):
            self.forget(conn)
            conn = None
        if conn is None:
            conn = connect(self.url, timeout_seconds=self._connect_timeout)
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    def forget(self, conn: Any) -> None:
        with self._all_lock:
            if conn in self._all:
                self._all.remove(conn)
        try:
            conn.close()
        except Exception:
            pass
        self._local.conn = None

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except Exception:
                pass
        self._local = threading.local()

    @contextmanager
    def group_commit(self) -> Iterator[None]:
        # Commits inside skip waiting for their WAL flush; the synchronous commit at the end
        # (a transaction that takes an xid, so its commit record must reach the disk) flushes
        # the WAL up to and including every one of them.
        conn = self.conn()
        with translate_errors("relaxing the flush for a group of commits"):
            conn.execute("SET synchronous_commit = off")
        try:
            yield
        finally:
            conn = self.conn()
            with translate_errors("flushing a group of commits"):
                conn.execute("SET synchronous_commit = on")
                with conn.transaction():
                    conn.execute("SELECT pg_current_xact_id()")

    def _begin(self) -> tuple[Any, Any]:
        """A connection with a transaction begun on it, and psycopg's block to end it with.

        A connection the server dropped while it sat idle (a restart, pg_terminate_backend) is
        only found out at its next statement: when that is the BEGIN, nothing was sent that
        could have committed, so a fresh connection takes its place once.
        """
        for retry in (False, True):
            conn = self.conn()
            if conn.info.transaction_status != _IDLE:
                raise InvalidState("a transaction is already open on this thread")
            block = conn.transaction()
            try:
                block.__enter__()
            except psycopg.Error as exc:
                if conn.broken:
                    self.forget(conn)
                    if not retry:
                        continue
                raise translated("running a transaction: beginning", exc) from exc
            return conn, block
        raise AssertionError("unreachable")  # pragma: no cover

    @contextmanager
    def transaction(self) -> Iterator[PostgresTransaction]:
        conn, block = self._begin()
        tx = PostgresTransaction(conn)
        try:
            with translate_errors("running a transaction"), _Begun(block):
                yield tx
                # psycopg's commit of a transaction that is no longer open, or that an earlier
                # statement aborted, returns quietly (the server answers COMMIT with ROLLBACK):
                # the caller would believe its rows and effects were committed.
                status = conn.info.transaction_status
                if status == _INERROR:
                    raise InvalidState(
                        "a statement in this transaction failed earlier, so the database "
                        "aborted it: nothing was committed"
                    )
                if status != _INTRANS:
                    raise InvalidState(
                        "the transaction ended before its with block did; nothing more was "
                        "committed"
                    )
        finally:
            tx.is_open = False
            if conn.broken:
                self.forget(conn)

    @contextmanager
    def write(self, what: str) -> Iterator[Any]:
        with translate_errors(what), self.transaction() as tx:
            yield tx.conn

    def read_sql(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.reading(lambda conn: list(conn.execute(sql, params or None).fetchall()))

    def reading(self, read: Callable[[Any], T], what: str = "reading") -> T:
        """``read(conn)`` outside any transaction. A connection the server dropped while it sat
        idle is replaced and the read run again, once: reading twice changes nothing.

        Inside a transaction (a read snapshot, say) a dropped connection took the transaction
        with it: running the read again on a fresh connection would answer from another moment,
        so the error is raised instead.
        """
        for retry in (False, True):
            conn = self.conn()
            idle = conn.info.transaction_status == _IDLE
            try:
                return read(conn)
            except psycopg.Error as exc:
                if conn.broken and idle:
                    self.forget(conn)
                    if not retry:
                        continue
                raise translated(what, exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` whenever new effects commit (LISTEN on a connection of its own)."""
        stop = threading.Event()

        def listen() -> None:
            while not stop.is_set():
                try:
                    conn = connect(self.url)
                except Exception:
                    stop.wait(1.0)
                    continue
                try:
                    conn.execute(f"LISTEN {CHANNEL}")
                    wake()  # anything committed while we were not listening
                    while not stop.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            wake()
                except Exception:
                    stop.wait(0.5)
                finally:
                    try:
                        conn.close()
                    except Exception:
                        pass

        thread = threading.Thread(target=listen, name="oncewire-listen", daemon=True)
        thread.start()

        def unsubscribe() -> None:
            stop.set()
            thread.join(timeout=2)

        return unsubscribe

    def translate_errors(self, what: str) -> contextlib.AbstractContextManager[None]:
        return translate_errors(what)

    def tx_conn(self, tx: Transaction) -> Any:
        tx = store_transaction(tx)
        if not isinstance(tx, PostgresTransaction):
            raise InvalidState(
                f"this store is PostgreSQL: {type(tx).__name__} is not one of its transactions; "
                "nothing was written"
            )
        tx.check_open()  # never write outside the caller's transaction (autocommit)
        return tx.conn

    def in_transaction(self, conn: Any) -> bool:
        return bool(conn.info.transaction_status != _IDLE)

    def caller_transaction(self, conn: Any) -> PostgresTransaction:
        """The caller's own psycopg connection, inside its own open transaction, as a
        transaction oncewire's ``_in_tx`` verbs write through (committing stays the caller's)."""
        if psycopg is None or not isinstance(conn, psycopg.Connection):
            raise InvalidState(
                f"this ledger's store is PostgreSQL: accept_in takes a psycopg connection, not "
                f"{type(conn).__name__}; nothing was written"
            )
        if conn.closed or conn.info.transaction_status != _INTRANS:
            raise InvalidState(
                "accept_in needs a connection inside an open transaction (run a statement or "
                "enter conn.transaction() first; a failed transaction cannot take the effect); "
                "nothing was written"
            )
        return PostgresTransaction(_TupleRows(conn))

    # -- execution strategy ------------------------------------------------------------------
    @contextmanager
    def pipeline(self, conn: Any) -> Iterator[Pipeline]:
        supported = bool(psycopg.Pipeline.is_supported())
        statements = Pipeline(conn, defer=supported)
        try:
            if not supported:  # a libpq without pipeline mode: one statement at a time
                yield statements
            else:
                failed: BaseException | None = None
                try:
                    with conn.pipeline():
                        try:
                            yield statements
                        except psycopg.Error as exc:
                            failed = exc
                except psycopg.Error:
                    # The first error is the one worth raising, not the pipeline's own abort
                    # that follows it.
                    if failed is None:
                        raise
                if failed is not None:
                    raise failed
                statements.collect()
        finally:
            statements.close()

    @contextmanager
    def snapshot(self) -> Iterator[Any]:
        conn = self.conn()
        if conn.info.transaction_status != _IDLE:
            yield conn  # the caller's transaction reads
            return
        try:
            with conn.transaction():
                with translate_errors("beginning a read"):
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                yield conn
        finally:
            if conn.broken:
                self.forget(conn)

    @contextmanager
    def constraint_refusal(
        self, constraint: str, refusal: Callable[[], Exception]
    ) -> Iterator[None]:
        try:
            yield
        except psycopg.IntegrityError as exc:
            if exc.diag.constraint_name != constraint:
                raise
            raise refusal() from None
