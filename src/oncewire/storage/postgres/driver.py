"""PostgresDriver: per-thread autocommit connections, explicit transactions, LISTEN/NOTIFY.

The PostgreSQL backend (:mod:`oncewire.storage.driver`, psycopg 3). Each thread gets its own
autocommit connection; a transaction is an explicit ``BEGIN``, sent with its first statement.
A connection the server dropped (restart, ``pg_terminate_backend``) is discarded and replaced at
the next call; the error of the call that found it broken reaches the caller as a
:class:`StorageError`, because a commit whose answer was lost is not known to have failed. A
read outside a transaction is run again once on a fresh connection; inside one (a read snapshot)
it is not, because the answer would come from another moment. Errors are translated by SQLSTATE
(:mod:`~oncewire.storage.postgres.errors`), migrations run under an advisory lock, a caller's
own connection is read through :mod:`~oncewire.storage.postgres.caller`, and the
PostgreSQL-only forms of statements are in ``storage/sql/postgresql.sql`` (SKIP LOCKED, FILTER,
``unnest``, the locks concurrent writers need).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from oncewire.core.errors import (
    ConfigurationError,
    InvalidState,
    SchemaError,
)
from oncewire.storage import migrate as runner
from oncewire.storage.driver import Driver, Pipeline, Row
from oncewire.storage.grouping import AFTER_SHARED_COMMIT, BEFORE_SHARED_COMMIT
from oncewire.storage.inspection import Inspection
from oncewire.storage.postgres.caller import AwaitedRows, TupleRows
from oncewire.storage.postgres.errors import psycopg, require_driver, translate_errors, translated
from oncewire.storage.postgres.guard import pipelined
from oncewire.storage.postgres.inspect import inspect as inspect_store
from oncewire.storage.postgres.listen import INBOUND, REPLIES, SETTLED, listener
from oncewire.storage.postgres.schema import (
    DIALECT,
    current_version,
    fresh_schema,
    migrate,
    migrations,
)
from oncewire.storage.postgres.transaction import (
    IDLE,
    INERROR,
    INTRANS,
    UNKNOWN,
    Begun,
    FirstStatementBegins,
    PostgresTransaction,
)
from oncewire.storage.sql import Query

# The schema's names are the schema module's (migrations, inspection), here for the callers
# that reach them through the driver.
__all__ = [
    "CHANNEL",
    "PostgresDriver",
    "PostgresTransaction",
    "fresh_schema",
    "migrate",
    "migrations",
]

T = TypeVar("T")

CHANNEL = "oncewire_effects"

DEFAULT_CONNECT_TIMEOUT_SECONDS = 10


def connect_timeout_seconds(url: str) -> int:
    """The URL's ``connect_timeout`` when it has one (it wins over our default)."""
    driver = require_driver()
    try:
        value = driver.conninfo.conninfo_to_dict(url).get("connect_timeout")
    except driver.ProgrammingError as exc:
        raise ConfigurationError(f"invalid PostgreSQL URL: {exc}") from exc
    if value is None or str(value).strip() == "":
        return DEFAULT_CONNECT_TIMEOUT_SECONDS
    try:
        return int(str(value))
    except ValueError:
        raise ConfigurationError(
            f"connect_timeout must be a whole number of seconds, not {value!r}"
        ) from None


def connect(url: str, *, timeout_seconds: int | None = None) -> Any:
    driver = require_driver()
    timeout = connect_timeout_seconds(url) if timeout_seconds is None else timeout_seconds
    with translate_errors("connecting to PostgreSQL"):
        return driver.connect(url, autocommit=True, connect_timeout=timeout)


_ANNOUNCE_SETTLED = f"SELECT pg_notify('{SETTLED}', '')"


# -- the driver --------------------------------------------------------------------------------
class PostgresDriver(Driver):
    """The :class:`~oncewire.storage.driver.Driver` of one PostgreSQL database (or schema)."""

    dialect = "postgresql"
    name = "PostgreSQL"
    label = "the PostgreSQL store"
    # Settlements and renewals travel as one array per column (unnest): one statement for all.
    values_chunk = 1_000_000
    transaction_type = PostgresTransaction
    schema = DIALECT
    translate_errors = staticmethod(translate_errors)

    def __init__(self, url: str, *, read_only: bool = False, group_commit: bool = False) -> None:
        require_driver()
        super().__init__(url)
        self.read_only = read_only
        # group_commit=True: each thread still commits on its own connection, and the server
        # flushes concurrent commits together (oncewire.storage.grouping); what changes is that
        # the lab's crash points at the shared commit are reached at each commit.
        self.commits_grouped = group_commit and not read_only
        self._connect_timeout = connect_timeout_seconds(url)

    # -- opening -----------------------------------------------------------------------------
    def open(self, *, create: bool, adopt: bool = True) -> None:
        conn = self.conn()
        try:
            with translate_errors("reading the schema"):
                schema, tables = conn.execute(
                    "SELECT current_schema(), ARRAY(SELECT tablename::text FROM "
                    "pg_catalog.pg_tables WHERE schemaname = current_schema() ORDER BY 1)"
                ).fetchone()
                version = current_version(conn) if "oncewire_schema" in tables else None
            where = f"the PostgreSQL schema {schema}"
            if version is None:
                if not create or self.read_only:
                    raise SchemaError(
                        "this database holds no oncewire schema (oncewire_schema missing)"
                    )
                runner.check_adoptable(where, list(tables), adopt=adopt)
            elif self.read_only:
                runner.check_current(conn, DIALECT, where, version)
                return
            migrate(conn)
        finally:
            if conn.broken:
                self.forget(conn)

    def health(self, schema_version: int) -> dict[str, Any]:
        row = self.read_sql(
            "SELECT current_setting('server_version'), current_database(), current_user, "
            "current_schema(), extract(epoch FROM clock_timestamp())::float8"
        )[0]
        return {
            "backend": "postgresql",
            "server_version": row[0],
            "database": row[1],
            "user": row[2],
            "schema": row[3],
            "schema_version": schema_version,
            "server_time": float(row[4]),
        }

    def inspect(self) -> Inspection:
        with translate_errors("inspecting the store"):
            return inspect_store(self.conn())

    # -- connections -------------------------------------------------------------------------
    def connect(self) -> Any:
        conn = connect(self.url, timeout_seconds=self._connect_timeout)
        if self.read_only:  # every transaction of this connection refuses to write
            with translate_errors("opening a read-only session"):
                conn.execute("SET default_transaction_read_only = on")
        return conn

    def broken(self, conn: Any) -> bool:
        return bool(conn.closed or conn.broken)

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` whenever new effects commit (LISTEN on a connection shared by this
        process's subscribers: listen.py)."""
        return listener(self.url, lambda: connect(self.url)).add(CHANNEL, wake)

    def subscribe_settled(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` whenever a dispatcher's settlements commit (:meth:`announce_settled`)."""
        return listener(self.url, lambda: connect(self.url)).add(SETTLED, wake)

    def subscribe_inbound(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` whenever the inbox changes (a trigger on its table, 0013) or a change
        is announced (:meth:`announce_inbound`)."""
        return listener(self.url, lambda: connect(self.url)).add(INBOUND, wake)

    def subscribe_replies(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` whenever a reply becomes deliverable by anyone (committed with no
        lease: a trigger on its table, 0013)."""
        return listener(self.url, lambda: connect(self.url)).add(REPLIES, wake)

    def announce_settled(self, conn: Any) -> None:
        conn.execute(_ANNOUNCE_SETTLED)

    def announce_settled_in(self, statements: Pipeline) -> None:
        statements.sql(_ANNOUNCE_SETTLED)

    def announce_inbound(self, conn: Any) -> None:
        conn.execute(f"SELECT pg_notify('{INBOUND}', '')")

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

    # -- transactions ------------------------------------------------------------------------
    def conn(self) -> Any:
        """This thread's connection; a transaction of this thread whose ``BEGIN`` waits for its
        first statement is begun first, so that nothing runs on it outside the transaction (in
        a forked child, never the parent's: see :meth:`Driver.check_fork`)."""
        self.check_fork()
        waiting: FirstStatementBegins | None = getattr(self._local, "waiting", None)
        if waiting is not None and not waiting.begun:
            with translate_errors("running a transaction: beginning"):
                waiting.begin()
        return super().conn()

    def fresh_conn(self) -> Any:
        """This thread's connection, without beginning a waiting transaction (its own use)."""
        return super().conn()

    @contextmanager
    def transaction(self) -> Iterator[PostgresTransaction]:
        if getattr(self._local, "waiting", None) is not None:
            raise InvalidState("a transaction is already open on this thread")
        conn = self.fresh_conn()
        if conn.info.transaction_status != IDLE:
            raise InvalidState("a transaction is already open on this thread")
        waiting = FirstStatementBegins(self, conn)
        self._local.waiting = waiting
        tx = PostgresTransaction(waiting, is_open=True)
        try:
            with translate_errors("running a transaction"):
                try:
                    yield tx
                except BaseException as exc:
                    if waiting.block is not None and waiting.block.__exit__(
                        type(exc), exc, exc.__traceback__
                    ):
                        return  # psycopg's Rollback, swallowed as psycopg's block does
                    raise
                if waiting.block is None:
                    return  # no statement ran: nothing was begun, nothing to commit
                # psycopg's commit of a transaction that is no longer open, or that an earlier
                # statement aborted, returns quietly (the server answers COMMIT with ROLLBACK):
                # the caller would believe its rows and effects were committed.
                status = waiting.raw.info.transaction_status
                failure: InvalidState | None = None
                watch = tx.settings
                if watch.failure is None and watch.baseline is not None and status == INTRANS:
                    try:
                        watch.check_at_commit(waiting.raw)
                    except InvalidState:
                        pass  # watch.failure says what, below
                    except BaseException as exc:
                        waiting.block.__exit__(type(exc), exc, exc.__traceback__)
                        raise
                if watch.failure is not None:
                    failure = watch.refusal()
                elif status == INERROR:
                    failure = InvalidState(
                        "a statement in this transaction failed earlier, so the database "
                        "aborted it: nothing was committed"
                    )
                elif status != INTRANS:
                    failure = InvalidState(
                        "the transaction ended before its with block did; nothing more was "
                        "committed"
                    )
                if failure is not None:
                    waiting.block.__exit__(InvalidState, failure, None)
                    raise failure
                if self.commits_grouped:
                    BEFORE_SHARED_COMMIT.hit()
                waiting.block.__exit__(None, None, None)
                if self.commits_grouped:
                    AFTER_SHARED_COMMIT.hit()
        finally:
            tx.is_open = False
            self._local.waiting = None
            if waiting.raw.broken:
                self.forget(waiting.raw)

    def one_alone(
        self, what: str, q: Query, /, *, before_commit: Callable[[], None], **params: Any
    ) -> Row | None:
        """One autocommit statement: the server commits it as it runs, in one round trip (a
        transaction block would add its ``COMMIT``'s). ``before_commit()`` runs before it is
        sent. A connection the server dropped while it sat idle is replaced and the statement
        sent again, once: it is idempotent, so if the first did commit the second changes
        nothing."""
        if getattr(self._local, "waiting", None) is not None:
            raise InvalidState("a transaction is already open on this thread")
        before_commit()
        for retry in (False, True):
            conn = self.fresh_conn()
            if conn.info.transaction_status != IDLE:
                raise InvalidState("a transaction is already open on this thread")
            try:
                return self.one(conn, q, **params)
            except psycopg.Error as exc:
                if conn.broken:
                    self.forget(conn)
                    if not retry:
                        continue
                raise translated(what, exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    @contextmanager
    def write(self, what: str) -> Iterator[Any]:
        with translate_errors(what), self.transaction() as tx:
            yield tx.conn

    def in_transaction(self, conn: Any) -> bool:
        return bool(conn.info.transaction_status != IDLE)

    def caller_transaction(self, conn: Any) -> PostgresTransaction:
        if psycopg is None or not isinstance(conn, psycopg.Connection):
            raise InvalidState(
                f"this ledger's store is PostgreSQL: accept_in takes a psycopg connection, not "
                f"{type(conn).__name__}; nothing was written"
            )
        if conn.closed or conn.info.transaction_status != INTRANS:
            raise InvalidState(
                "accept_in needs a connection inside an open transaction (run a statement or "
                "enter conn.transaction() first; a failed transaction cannot take the effect); "
                "nothing was written"
            )
        return PostgresTransaction(TupleRows(conn), is_open=True)

    def awaited_caller_transaction(
        self, conn: Any, run: Callable[[Any], Any]
    ) -> PostgresTransaction:
        """The caller's ``psycopg.AsyncConnection``, inside its open transaction, as a
        transaction oncewire's ``_in_tx`` verbs write through from a thread that is not the
        connection's event loop: ``run(coroutine)`` awaits each statement on that loop and
        returns its answer. The same checks as :meth:`caller_transaction`, and the same
        statements; committing stays the caller's."""
        if psycopg is None or not isinstance(conn, psycopg.AsyncConnection):
            raise InvalidState(
                f"this ledger's store is PostgreSQL: an awaited accept_in takes a "
                f"psycopg.AsyncConnection, not {type(conn).__name__}; nothing was written"
            )
        if conn.closed or conn.info.transaction_status != INTRANS:
            raise InvalidState(
                "accept_in needs a connection inside an open transaction (run a statement or "
                "enter conn.transaction() first; a failed transaction cannot take the effect); "
                "nothing was written"
            )
        return PostgresTransaction(AwaitedRows(conn, run), is_open=True)

    # -- statements --------------------------------------------------------------------------
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
            idle = conn.info.transaction_status == IDLE
            try:
                return read(conn)
            except psycopg.Error as exc:
                if conn.broken and idle:
                    self.forget(conn)
                    if not retry:
                        continue
                raise translated(what, exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

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

    def pipelined_write(self, what: str, fill: Callable[[Pipeline], T]) -> T:
        """One round trip: ``BEGIN``, ``fill``'s statements and ``COMMIT`` in one pipeline with
        one ``Sync``. The first error among them is raised and nothing is committed (the
        server skips the rest, the ``COMMIT`` too, and the transaction is rolled back). A
        connection the server dropped is replaced and everything sent again, once (see
        :meth:`Driver.pipelined_write`). Grouped commits, and a libpq without pipeline mode,
        take the general path."""
        if getattr(self._local, "waiting", None) is not None:
            raise InvalidState("a transaction is already open on this thread")
        if self.commits_grouped or not psycopg.Pipeline.is_supported():
            return super().pipelined_write(what, fill)
        for retry in (False, True):
            conn = self.fresh_conn()
            if conn.info.transaction_status in (INERROR, UNKNOWN):
                # This driver's own connection, left failed or bad by an error it raised (a
                # server's FATAL before the socket closed is read before psycopg sees the
                # close): nothing of it can commit, so a new connection takes its place.
                self.forget(conn)
                conn = self.fresh_conn()
            if conn.info.transaction_status != IDLE:
                raise InvalidState("a transaction is already open on this thread")
            statements = Pipeline(conn, defer=True)

            def block(raw: Any, statements: Pipeline = statements) -> T:
                # BEGIN and COMMIT are queued as statements: psycopg's transaction block
                # would sync the pipeline on entering and on leaving it (two more waits).
                ends = raw.cursor()
                try:
                    ends.execute(b"BEGIN")
                    try:
                        result = fill(statements)
                    except BaseException:
                        ends.execute(b"ROLLBACK")
                        raise
                    ends.execute(b"COMMIT")
                    return result
                finally:
                    ends.close()

            try:
                try:
                    result = pipelined(conn, block)
                    statements.collect()
                    return result
                finally:
                    statements.close()
            except psycopg.Error as exc:
                if conn.broken:
                    self.forget(conn)
                    if not retry:
                        continue
                elif conn.info.transaction_status != IDLE:
                    with contextlib.suppress(psycopg.Error):
                        conn.rollback()  # the failed transaction the skipped COMMIT left open
                    if conn.broken or conn.info.transaction_status != IDLE:
                        self.forget(conn)  # never handed out again in that state
                raise translated(what, exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    @contextmanager
    def snapshot(self) -> Iterator[Any]:
        """A ``REPEATABLE READ, READ ONLY`` transaction.

        It begins like a write (:class:`FirstStatementBegins`, the ``BEGIN`` and the isolation
        level in one round trip): a connection the server dropped while idle is replaced once,
        since nothing was read yet, and a server that is gone is a :class:`StoreUnreachable`,
        never psycopg's own error. Once the snapshot's moment is taken, a dropped connection is
        an error (see :meth:`reading`).
        """
        conn = self.conn()
        if conn.info.transaction_status != IDLE:
            yield conn  # the caller's transaction reads
            return
        opening = FirstStatementBegins(self, conn)
        try:
            with translate_errors("reading a snapshot"):
                try:
                    opening.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                except BaseException as exc:
                    if opening.block is not None:
                        opening.block.__exit__(type(exc), exc, exc.__traceback__)
                    raise
                with Begun(opening.block):
                    yield opening.raw
        finally:
            if opening.raw.broken:
                self.forget(opening.raw)

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
