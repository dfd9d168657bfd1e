"""The Driver: what the store, written once, needs from a database, and nothing more.

A verb in :mod:`oncewire.storage.verbs` runs named queries (:mod:`oncewire.storage.sql`) through
the store's driver, ``self.db``::

    with self.db.write("renewing leases") as conn:           # one transaction, errors translated
        rows = self.db.all(conn, Q.renew_leases, owner=owner, ...)
    rows = self.db.read(Q.get_effect, key=key)                # outside any transaction

:class:`Driver` holds what every backend does the same way: one connection per thread (opened
on first use, a broken one forgotten and replaced, and new ones in a child process forked from
this one), running a named query on a connection, the caller's transaction
(:mod:`oncewire.storage.transaction`) checked before a verb writes through it. A backend's driver
(:class:`oncewire.storage.sqlite.driver.SQLiteDriver`,
:class:`oncewire.storage.postgres.driver.PostgresDriver`) adds what differs: connecting and its
settings, the transaction discipline (``BEGIN IMMEDIATE`` on SQLite, an explicit ``BEGIN`` on
an autocommit connection on PostgreSQL), the translation of its errors into
:mod:`oncewire.core.errors` (by code, never by message), opening and migrating the schema, and
the execution strategy (``pipeline``, a read ``snapshot``'s isolation, how many rows one
``{values}`` statement carries, a constraint's refusal mapped to a typed error).
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from oncewire.core.errors import InvalidState, StorageError
from oncewire.storage.inspection import Inspection
from oncewire.storage.migrate import Dialect
from oncewire.storage.sql import Queries, Query, queries
from oncewire.storage.transaction import GuardedTransaction, Transaction, store_transaction

# Transaction, GuardedTransaction and store_transaction are the transaction module's, here for
# the verbs and backends that reach them through the driver.
__all__ = [
    "Driver",
    "ErrorTranslation",
    "GuardedTransaction",
    "Pending",
    "Pipeline",
    "Row",
    "Transaction",
    "store_transaction",
]

Row = Sequence[Any]
T = TypeVar("T")

# This process's pid, updated in a child as soon as os.fork() returns there: what a driver
# compares its own with on every call for a connection (a global read, where os.getpid() is a
# system call).
_process = os.getpid()


def _forked() -> None:
    global _process
    _process = os.getpid()


os.register_at_fork(after_in_child=_forked)


class ErrorTranslation:
    """Turn driver errors raised inside the block into the error tree, once, at this boundary.

    ``error`` is the driver's root exception (an empty tuple when the driver is not installed:
    nothing matches it); ``translated(what, exc)`` picks the error-tree exception. A class
    rather than a generator: it wraps every statement on the hot path. Made by
    :meth:`Driver.in_tx`, it also carries the connection of the caller's transaction, which
    ``with`` gives the block.
    """

    __slots__ = ("conn", "error", "translated", "what")

    def __init__(
        self,
        error: type[Exception] | tuple[()],
        translated: Callable[[str, Any], StorageError],
        what: str,
    ) -> None:
        self.error, self.translated, self.what = error, translated, what
        self.conn: Any = None

    def __enter__(self) -> Any:
        return self.conn

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, self.error):
            raise self.translated(self.what, exc) from exc


class Pending:
    """The rows of a statement sent through a :class:`Pipeline`: ``rows`` is filled in when the
    pipeline's block has ended (at once where statements do not travel)."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: list[Row] = []

    def one(self) -> Row | None:
        """The first row, or None."""
        return self.rows[0] if self.rows else None


class Pipeline:
    """Statements sent through one pipeline on one connection (see :meth:`Driver.pipeline`).

    ``run`` and ``batch`` send statements whose rows nobody reads (one cursor serves them all);
    ``rows`` sends one whose rows are read into the :class:`Pending` it returns. When ``defer``
    is false (SQLite; a PostgreSQL client without pipeline mode) every statement runs, and is
    read, before the call returns.
    """

    __slots__ = ("_conn", "_defer", "_pending", "_writes")

    def __init__(self, conn: Any, *, defer: bool) -> None:
        self._conn = conn
        self._defer = defer
        self._writes: Any = None
        self._pending: list[tuple[Any, Pending]] = []

    def _cursor(self) -> Any:
        if self._writes is None:
            self._writes = self._conn.cursor()
        return self._writes

    def run(self, q: Query, /, **params: Any) -> None:
        self._cursor().execute(*q.render(params))

    def batch(self, q: Query, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            text, _ = q.render(rows[0])
            self._cursor().executemany(text, [q.render(row)[1] for row in rows])

    def sql(self, text: str) -> None:
        """Send ``text``, a statement of the driver's own with no values, whose rows nobody
        reads."""
        self._cursor().execute(text)

    def rows(self, q: Query, /, **params: Any) -> Pending:
        pending = Pending()
        cursor = self._conn.cursor()
        cursor.execute(*q.render(params))
        if self._defer:
            self._pending.append((cursor, pending))
        else:
            try:
                pending.rows = list(cursor.fetchall())
            finally:
                cursor.close()
        return pending

    def collect(self) -> None:
        """Read the rows of every deferred statement (once the pipeline has been synced)."""
        for cursor, pending in self._pending:
            pending.rows = list(cursor.fetchall())

    def close(self) -> None:
        for cursor, _ in self._pending:
            cursor.close()
        if self._writes is not None:
            self._writes.close()


class Driver(abc.ABC):
    """The connection half of a backend; see the module docstring."""

    dialect: str
    name: str  # the database, as refusals name it ("SQLite")
    label: str  # what is being opened, as the retries while opening name it
    # Rows one ``{values ...}`` statement carries at most (SQLite binds each value on its own).
    values_chunk: int
    transaction_type: type[GuardedTransaction]
    schema: Dialect  # the schema's files and the migration runner's hooks
    read_only = False  # opened without writing: never migrated, every write refused
    immutable = False  # read as an immutable snapshot (a SQLite file without its WAL)
    commits_grouped = False  # group_commit=True (see oncewire.storage.grouping)

    def __init__(self, url: str) -> None:
        self.url = url
        self.queries: Queries = queries(self.dialect)
        self._local = threading.local()
        self._all: list[Any] = []
        self._all_lock = threading.Lock()
        self._pid = _process
        # The connections a forked child inherited: never used, closed or freed there.
        self._inherited: list[Any] = []
        # Connections lent to threads that have none of their own (see borrowed()), idle.
        self._spare: list[Any] = []
        self.closed = False  # close() was called (a later call would open a connection again)
        # Called first thing by close(): what runs on this store in threads of its own stops
        # there, before the connections those threads use are closed under them.
        self._close_hooks: list[Callable[[], None]] = []

    # -- opening -----------------------------------------------------------------------------
    @abc.abstractmethod
    def open(self, *, create: bool, adopt: bool = True) -> None:
        """Check the database and migrate it (one attempt; the store retries a transient
        failure). Without ``create``, a database without oncewire's schema is refused
        unchanged; without ``adopt``, so is one that holds other tables; a schema newer than
        this oncewire is always refused. A read-only driver checks and never migrates."""

    @abc.abstractmethod
    def health(self, schema_version: int) -> dict[str, Any]:
        """Facts an operator checks: backend, versions, durability settings, server time."""

    @abc.abstractmethod
    def inspect(self) -> Inspection:
        """For ``oncewire doctor``: a write probe (always rolled back), the backend's integrity
        check, and the schema's objects compared with the packaged ``schema.sql``."""

    # -- connections -------------------------------------------------------------------------
    @abc.abstractmethod
    def connect(self) -> Any:
        """A new connection with oncewire's settings."""

    def broken(self, conn: Any) -> bool:
        """Whether ``conn`` can no longer be used (closed, or dropped by the server)."""
        return False

    def check_fork(self) -> None:
        """In a process forked after this driver opened connections, start afresh: the
        parent's connections are the parent's (its SQLite handles and locks, its PostgreSQL
        sessions), so the child never runs a statement on them and never closes them (closing
        a psycopg connection sends the server a Terminate on the parent's socket). They are
        kept referenced, so that collecting them cannot close them either, and this process
        opens its own at the next call. Cheap: the pid compared is kept up to date by a fork
        hook (``os.register_at_fork``), so the check is one comparison."""
        if self._pid == _process:
            return
        self._pid = _process
        self._all_lock = threading.Lock()  # another thread of the parent may have held it
        self._inherited.extend(self._all)
        self._all = []
        self._spare = []
        self._local = threading.local()
        self._close_hooks = []  # the parent's threads did not come along
        self.forked()

    def forked(self) -> None:
        """What else a backend starts afresh in a forked child (after :meth:`check_fork`);
        by default nothing."""
        return None

    def conn(self) -> Any:
        """This thread's connection (opened on first use, replaced when broken, new in a
        forked child)."""
        self.check_fork()
        conn = getattr(self._local, "conn", None)
        if conn is not None and self.broken(conn):
            self.forget(conn)
            conn = None
        if conn is None:
            conn = self.connect()
            self.use(conn)
        return conn

    def use(self, conn: Any) -> None:
        """Make ``conn`` this thread's connection, closed with the driver."""
        self._local.conn = conn
        self.track(conn)

    def track(self, conn: Any) -> None:
        """Close ``conn`` with the driver (and leave it alone in a forked child)."""
        with self._all_lock:
            self._all.append(conn)

    def own_conn(self) -> Any:
        """This thread's connection if it has one (None: it opens one at its next call)."""
        return getattr(self._local, "conn", None)

    def lend(self, conn: Any) -> Any:
        """Make ``conn`` (one the driver tracks) this thread's connection until it is lent
        back; returns the one it replaces, which is neither closed nor forgotten."""
        previous = getattr(self._local, "conn", None)
        self._local.conn = conn
        return previous

    @contextlib.contextmanager
    def borrowed(self) -> Iterator[None]:
        """Inside the block, a thread that has no connection of its own runs on an idle one
        the driver keeps for such threads (or on one opened for it), which goes back to them
        when the block ends; a thread with its own connection keeps using it.

        For work done on threads that live for one job (an executor's, made anew for each
        graph run): each would otherwise open a connection of its own and leave it open
        until the driver closes, one more for every thread. A connection goes back only idle
        (no transaction open on it) and usable; the block is one thread's at a time."""
        self.check_fork()
        local = self._local
        if getattr(local, "conn", None) is not None or getattr(local, "borrowing", False):
            yield
            return
        with self._all_lock:
            local.conn = self._spare.pop() if self._spare else None
        local.borrowing = True
        try:
            yield
        finally:
            local.borrowing = False
            conn = getattr(local, "conn", None)
            local.conn = None
            if conn is not None:
                usable = not self.broken(conn) and not self.in_transaction(conn)
                with self._all_lock:
                    if usable and self._pid == _process and any(c is conn for c in self._all):
                        self._spare.append(conn)

    def forget(self, conn: Any) -> None:
        """Close this thread's ``conn`` and open a new one at the next call."""
        with self._all_lock:
            if conn in self._all:
                self._all.remove(conn)
        try:
            conn.close()
        except Exception:
            pass  # already unusable: nothing more to release
        self._local.conn = None

    def on_close(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call ``hook()`` when :meth:`close` begins, before any connection is closed (a
        connection closed while another thread runs a statement on it can crash the process);
        returns a function that takes the hook back."""
        with self._all_lock:
            self._close_hooks.append(hook)

        def remove() -> None:
            with self._all_lock:
                if hook in self._close_hooks:
                    self._close_hooks.remove(hook)

        return remove

    def close(self) -> None:
        self.check_fork()  # a forked child closes its own connections, never its parent's
        self.closed = True
        with self._all_lock:
            hooks, self._close_hooks = self._close_hooks, []
        for hook in hooks:
            try:
                hook()
            except Exception:  # a hook that fails must not keep the connections open
                logging.getLogger("oncewire.storage").warning(
                    "a close hook of the store failed", exc_info=True
                )
        with self._all_lock:
            conns, self._all = self._all, []
            self._spare = []
        for conn in conns:
            try:
                conn.close()
            except Exception:
                pass  # one another thread already closed, or the server already dropped
        self._local = threading.local()

    # -- transactions ------------------------------------------------------------------------
    @abc.abstractmethod
    def transaction(self) -> AbstractContextManager[GuardedTransaction]:
        """A write transaction: committed on normal exit, rolled back on an exception."""

    @abc.abstractmethod
    def write(self, what: str) -> AbstractContextManager[Any]:
        """A transaction of its own, yielding its connection: committed on normal exit, rolled
        back on an exception; driver errors become :class:`StorageError` naming ``what``."""

    @abc.abstractmethod
    def translate_errors(self, what: str) -> ErrorTranslation:
        """Inside the block, a driver error becomes a :class:`StorageError` naming ``what``."""

    @abc.abstractmethod
    def caller_transaction(self, conn: Any) -> GuardedTransaction:
        """The caller's own driver connection, inside the caller's own open transaction, as a
        transaction oncewire's ``_in_tx`` verbs write through; committing stays the caller's.
        Anything else is :class:`InvalidState` before anything is written."""

    def awaited_caller_transaction(
        self, conn: Any, run: Callable[[Any], Any]
    ) -> GuardedTransaction:
        """The caller's asyncio connection inside its open transaction, its statements awaited
        through ``run`` (PostgreSQL only: no other backend has one to give)."""
        raise InvalidState(
            f"this ledger's store is {self.name}: an awaited accept_in needs a PostgreSQL "
            "store and a psycopg.AsyncConnection (on SQLite, accept in ledger.transaction()); "
            "nothing was written"
        )

    def shared_commits(self) -> dict[str, int] | None:
        """With ``group_commit=True``, how many commits this process made and how many write
        transactions they carried; None where transactions commit one by one."""
        return None

    @abc.abstractmethod
    def in_transaction(self, conn: Any) -> bool:
        """Whether ``conn`` has a transaction open."""

    def tx_conn(self, tx: Transaction) -> Any:
        """The connection of the caller's open transaction ``tx`` (refused if it is not open,
        or not one of this store's: a verb ending in ``_in_tx`` never writes outside the
        caller's transaction)."""
        tx = store_transaction(tx)
        if not isinstance(tx, self.transaction_type):
            raise InvalidState(
                f"this store is {self.name}: {type(tx).__name__} is not one of its "
                "transactions; nothing was written"
            )
        tx.check_open()  # never write outside the caller's transaction (autocommit)
        return tx.conn

    def in_tx(self, tx: Transaction, what: str) -> ErrorTranslation:
        """``with db.in_tx(tx, what) as conn``: the connection of the caller's open transaction
        (:meth:`tx_conn`), with driver errors inside the block translated as
        :meth:`translate_errors` does; the opening of almost every ``_in_tx`` verb."""
        block = self.translate_errors(what)
        block.conn = self.tx_conn(tx)
        return block

    def group_commit(self) -> AbstractContextManager[None]:
        """See :meth:`oncewire.storage.store.Store.group_commit`; by default every commit is
        flushed on its own."""
        return contextlib.nullcontext()

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """See :meth:`oncewire.storage.store.Store.subscribe`; by default nothing tells."""
        return lambda: None

    def subscribe_settled(self, wake: Callable[[], None]) -> Callable[[], None]:
        """See :meth:`oncewire.storage.store.Store.subscribe_settled`; by default nothing
        tells."""
        return lambda: None

    def subscribe_inbound(self, wake: Callable[[], None]) -> Callable[[], None]:
        """See :meth:`oncewire.storage.store.Store.subscribe_inbound`; by default nothing
        tells."""
        return lambda: None

    def subscribe_replies(self, wake: Callable[[], None]) -> Callable[[], None]:
        """See :meth:`oncewire.storage.store.Store.subscribe_replies`; by default nothing
        tells."""
        return lambda: None

    def announce_inbound(self, conn: Any) -> None:
        """Tell other processes' :meth:`subscribe_inbound` that an inbox change is about to
        commit on ``conn``, where the backend needs telling (SQLite's commits tell by
        themselves)."""
        return None

    def announce_settled(self, conn: Any) -> None:
        """Tell other processes' :meth:`subscribe_settled` that settlements are about to
        commit on ``conn``, where the backend needs telling (SQLite's commits tell by
        themselves)."""
        return None

    # -- statements --------------------------------------------------------------------------
    def announce_settled_in(self, statements: Pipeline) -> None:
        """:meth:`announce_settled`, sent through ``statements`` (:meth:`pipelined_write`)."""
        return None

    @abc.abstractmethod
    def read_sql(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Every row of ``sql`` outside a transaction, with the backend's recovery."""

    def reading(self, read: Callable[[Any], T], what: str = "reading") -> T:
        """``read(conn)`` on this thread's connection, errors translated as ``what``."""
        with self.translate_errors(what):
            return read(self.conn())

    def read(self, q: Query, /, **params: Any) -> list[Row]:
        """Every row of ``q`` outside a transaction (a dropped idle connection is replaced and
        the read run again; a text that is not UTF-8 is read as undecodable, not an error)."""
        return self.read_sql(*q.render(params))

    def run(self, conn: Any, q: Query, /, **params: Any) -> int:
        """Run ``q`` on ``conn``; the number of rows it changed."""
        return int(conn.execute(*q.render(params)).rowcount)

    def one(self, conn: Any, q: Query, /, **params: Any) -> Row | None:
        """The first row of ``q`` on ``conn``, or None."""
        row: Row | None = conn.execute(*q.render(params)).fetchone()
        return row

    def all(self, conn: Any, q: Query, /, **params: Any) -> list[Row]:
        """Every row of ``q`` on ``conn``."""
        rows: list[Row] = conn.execute(*q.render(params)).fetchall()  # a list on both drivers
        return rows

    def batch(self, conn: Any, q: Query, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run ``q`` once per parameter set (``executemany``)."""
        if not rows:
            return
        text, _ = q.render(rows[0])
        cursor = conn.cursor()
        try:
            cursor.executemany(text, [q.render(row)[1] for row in rows])
        finally:
            cursor.close()

    @abc.abstractmethod
    def one_alone(
        self, what: str, q: Query, /, *, before_commit: Callable[[], None], **params: Any
    ) -> Row | None:
        """Run ``q``, one idempotent writing statement, in a transaction of its own and commit
        it: its first row, or None. ``before_commit()`` is called where nothing of it is
        durable yet. Inside this thread's open transaction it is :class:`InvalidState`, as
        :meth:`write` is. Both backends run it as one autocommit statement, ``before_commit()``
        before it (PostgreSQL: one round trip)."""

    # -- execution strategy ------------------------------------------------------------------
    @contextlib.contextmanager
    def pipeline(self, conn: Any) -> Iterator[Pipeline]:
        """The statements sent through the yielded :class:`Pipeline` travel together and are
        answered at the end of the block (PostgreSQL: one round trip); the first error among
        them is the one raised, not the aborts it caused after it. By default (SQLite, whose
        statements do not travel) each runs when it is sent."""
        statements = Pipeline(conn, defer=False)
        try:
            yield statements
        finally:
            statements.close()

    def pipelined_write(self, what: str, fill: Callable[[Pipeline], T]) -> T:
        """``fill(statements)`` sends a transaction's statements through a :class:`Pipeline`;
        they commit together, in a transaction of their own, or not at all; what ``fill``
        returns (its :class:`Pending` rows are read when this returns). PostgreSQL sends the
        ``BEGIN``, the statements and the ``COMMIT`` in one round trip, and sends them all
        again, once, on a fresh connection when the server had dropped this one: ``fill``'s
        statements must be safe to run twice (a compare and set that a first run, if it
        committed, makes fail). ``fill`` cannot read a row before the end (nothing is
        answered before the ``COMMIT`` is sent): a statement that must not run unless an
        earlier one did is made conditional in SQL. By default (SQLite) each runs as it is
        sent, in :meth:`write`'s transaction."""
        with self.write(what) as conn, self.pipeline(conn) as statements:
            return fill(statements)

    @abc.abstractmethod
    def snapshot(self) -> AbstractContextManager[Any]:
        """Yields this thread's connection, on which every read of the block sees one moment of
        the store: a read-only transaction ended with the block, or the transaction already
        open on it, which adds nothing."""

    def constraint_refusal(
        self, constraint: str, refusal: Callable[[], Exception]
    ) -> AbstractContextManager[None]:
        """Inside the block, the database's refusal naming ``constraint`` (an index or a
        trigger's ``CONSTRAINT``, never recognised by its message) raises ``refusal()`` instead.
        By default (SQLite, whose errors name no constraint) the block changes nothing."""
        return contextlib.nullcontext()

    def tolerant(self, step: Callable[[], T]) -> T:
        """``step()``, run again where the backend can read a stored text that is not UTF-8
        (written around oncewire) as undecodable when the first run failed on one."""
        return step()
