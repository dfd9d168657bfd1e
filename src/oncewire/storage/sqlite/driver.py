"""SQLiteDriver: WAL, synchronous=FULL, ``BEGIN IMMEDIATE`` writers, one connection per thread.

The SQLite backend (:mod:`oncewire.storage.driver`): connecting and the pragmas every connection
runs with, opening a file (checked before anything changes it: its header, its tables, its
integrity, :mod:`~oncewire.storage.sqlite.files`; then migrated,
:mod:`~oncewire.storage.sqlite.schema`, in its own journal mode and only then switched to WAL;
or opened read-only, never migrated), the transaction
the caller shares with oncewire (:class:`SQLiteTransaction`, guarded by
:mod:`oncewire.storage.sqlguard`), errors translated by SQLite's result code
(:mod:`~oncewire.storage.sqlite.errors`), reads that survive a stored text which is not UTF-8,
and the group commit that flushes many commits with one fsync.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from oncewire.core.errors import (
    ConfigurationError,
    InvalidState,
    SchemaError,
    StorageError,
    StoreUnusable,
)
from oncewire.storage import migrate as runner
from oncewire.storage.driver import Driver, ErrorTranslation, Row
from oncewire.storage.inspection import Inspection
from oncewire.storage.records import UndecodableText
from oncewire.storage.sql import Query
from oncewire.storage.sqlguard import caller_statement
from oncewire.storage.sqlite import files, forkgate
from oncewire.storage.sqlite.errors import translate_errors, translated
from oncewire.storage.sqlite.files import path_from_url
from oncewire.storage.sqlite.group import GroupCommit
from oncewire.storage.sqlite.guard import CallerGuard
from oncewire.storage.sqlite.inspect import inspect as inspect_store
from oncewire.storage.sqlite.schema import (
    DIALECT,
    SCHEMA_TABLE,
    current_version,
    fresh_schema,
    migrate,
    migrations,
    split_statements,
    version_and_tables,
)
from oncewire.storage.sqlite.wake import watch as wake_watch
from oncewire.storage.transaction import GuardedTransaction

# The schema's names are the schema module's (migrations, inspection), here for the callers
# that reach them through the driver.
__all__ = [
    "SCHEMA_TABLE",
    "SQLiteDriver",
    "SQLiteTransaction",
    "fresh_schema",
    "migrate",
    "migrations",
    "path_from_url",
    "split_statements",
]

T = TypeVar("T")

log = logging.getLogger("oncewire.storage")

SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


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


# -- transactions ------------------------------------------------------------------------------
class SQLiteTransaction(GuardedTransaction):
    """An open SQLite write transaction (``BEGIN IMMEDIATE``), and the caller's view of it.

    ``execute`` takes ``:name`` placeholders with a dict. Used as a context manager it commits on
    normal exit and rolls back on an exception; the commit first checks that the transaction is
    still open. A class rather than a generator: every accept and every dispatcher step goes
    through it.
    """

    __slots__ = ("guard", "store", "what")

    dialect = "sqlite"

    # SQLite rolls a transaction back by itself on some errors (a full disk, an I/O error): a
    # statement run after that would commit on its own, outside of it.
    ended_by_database = (
        "the transaction is no longer open (the database rolled it back after an error); "
        "nothing more was written and nothing will be committed"
    )

    def __init__(
        self,
        conn: sqlite3.Connection,
        what: str = "running a transaction",
        *,
        is_open: bool = False,
        store: str | None = None,
        guard: CallerGuard | None = None,
    ) -> None:
        super().__init__(conn, is_open=is_open)
        self.what = what
        self.store = store  # the file's path, named by a disk-full error
        self.guard = guard  # the connection's authorizer, for the caller's statements

    def open_on_connection(self) -> bool:
        return bool(self.conn.in_transaction)

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        """The caller's statement: refused by the lexer, then by SQLite's authorizer from what
        SQLite itself parsed (:mod:`.guard`). ``:name`` placeholders with a dict: positional
        values and SQLite's other placeholders are refused first (:func:`caller_statement`)."""
        self.check_open()
        sql, values = caller_statement(sql, params, "sqlite")
        guard = self.guard
        if guard is None:
            guard = CallerGuard(self.conn, scoped=True)  # not oncewire's own connection
        return guard.run(sql, () if values is None else dict(values), self.savepoints)

    def check_open(self) -> None:
        if not (self.is_open and self.conn.in_transaction):  # every verb's check: inlined
            super().check_open()

    def begin(self) -> None:
        if self.conn.in_transaction:
            raise InvalidState("a transaction is already open on this thread")
        forkgate.enter()  # no fork copies this process while it holds the write lock
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            forkgate.leave()
            if isinstance(exc, sqlite3.Error):
                raise translated(f"{self.what}: beginning", exc, self.store) from exc
            raise
        self.is_open = True

    def end(self, failed: bool) -> None:
        conn = self.conn
        self.is_open = False
        try:
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
                    raise translated(f"{self.what}: committing", exc, self.store) from exc
                raise
        finally:
            forkgate.leave()

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
            raise translated(self.what, exc, self.store) from exc


class _Write(SQLiteTransaction):
    """A verb's own transaction: yields the connection, translates errors as ``what``."""

    __slots__ = ()

    def __enter__(self) -> sqlite3.Connection:  # type: ignore[override]
        self.begin()
        conn: sqlite3.Connection = self.conn
        return conn


# -- the driver --------------------------------------------------------------------------------
class SQLiteDriver(Driver):
    """The :class:`~oncewire.storage.driver.Driver` of one SQLite file."""

    dialect = "sqlite"
    name = "SQLite"
    # A chunk of settlements is one statement; 128 rows of 9 values stay far below SQLite's
    # limit on bound values and keep the padded statement texts few.
    values_chunk = 128
    transaction_type = SQLiteTransaction
    schema = DIALECT

    def __init__(
        self,
        url_or_path: str,
        *,
        create: bool,
        busy_timeout_ms: int,
        synchronous: str,
        read_only: bool = False,
        group_commit: bool = False,
    ) -> None:
        if synchronous.upper() not in SYNCHRONOUS:
            raise ConfigurationError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}")
        super().__init__(url_or_path)
        self.path = self.label = path_from_url(url_or_path)
        self.synchronous = synchronous.upper()
        self.read_only = read_only
        self.immutable = False  # read-only, as a snapshot: no -shm can be created beside it
        self.integrity: tuple[str, ...] | None = None  # what quick_check found while opening
        self._create = create and not read_only
        self._busy_timeout_ms = busy_timeout_ms
        # group_commit=True: the transactions of this process's threads share commits
        # (group.py). Not where nothing is written (read-only) or nothing is flushed, and
        # where every connection is a database of its own (":memory:").
        grouped = group_commit and not read_only and self.path != ":memory:"
        self.groups: GroupCommit | None = GroupCommit(self) if grouped else None
        self.commits_grouped = grouped

    # -- opening -----------------------------------------------------------------------------
    def open(self, *, create: bool, adopt: bool = True) -> None:
        try:
            if self.read_only:
                self._open_read_only()
            else:
                self._open(create=create and self._create, adopt=adopt)
        except StoreUnusable as exc:
            explained = files.explained(exc, self.path, read_only=self.read_only)
            if explained is None:
                raise
            raise explained from exc

    def _open(self, *, create: bool, adopt: bool) -> None:
        if self.path != ":memory:":
            files.refuse_unless_sqlite(self.path)  # before SQLite writes over a one-byte file
        conn = self._unconfigured()
        self.use(conn)  # closed with the driver if what follows fails
        # Check before changing anything: a file oncewire refuses keeps its journal and bytes.
        with translate_errors(f"reading the schema of {self.path}"):
            version, tables = version_and_tables(conn)
        if version is None and not create:
            raise SchemaError(f"{self.path} is not an oncewire store (no oncewire_schema table)")
        if version is None:
            runner.check_adoptable(self.path, tables, adopt=adopt)
        runner.check_not_newer(version, migrations()[-1][0])
        if self.path != ":memory:":
            self.integrity = files.verify_integrity(conn, self.path)
        self._configure(conn, wal=False)
        # Migrated in the file's own journal mode, then switched to WAL: a migration that fails
        # rolls back and leaves the file as it was, journal mode included.
        migrate(conn)
        self._switch_to_wal(conn)

    def _open_read_only(self) -> None:
        if self.path == ":memory:":
            raise ConfigurationError("an in-memory database cannot be opened read-only")
        files.refuse_unless_sqlite(self.path)
        try:
            version = self._read_only_version()
        except StoreUnusable as exc:
            if not files.needs_snapshot(exc, self.path):
                raise
            # No -shm, and none can be created: read the file as it is, without locking.
            self.close()
            self.immutable = True
            log.warning("%s", files.snapshot_warning(self.path))
            version = self._read_only_version()
        if version is None:
            raise SchemaError(f"{self.path} is not an oncewire store (no oncewire_schema table)")
        runner.check_current(self.conn(), DIALECT, self.path, version)
        self._configure(self.conn())

    def _read_only_version(self) -> int | None:
        conn = self._unconfigured()
        self.use(conn)
        with translate_errors(f"reading the schema of {self.path}"):
            return current_version(conn)

    def health(self, schema_version: int) -> dict[str, Any]:
        conn = self.conn()
        with translate_errors("reading settings"):
            journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
            synchronous = conn.execute("PRAGMA synchronous").fetchone()[0]
            busy = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        if self.immutable:  # read without its WAL: the file's header says what it runs with
            journal = "wal" if files.in_wal_mode(self.path) else journal
        return {
            "backend": "sqlite",
            "path": self.path,
            "sqlite_version": sqlite3.sqlite_version,
            "schema_version": schema_version,
            "journal_mode": str(journal).lower(),
            "synchronous": SYNCHRONOUS[int(synchronous)] if int(synchronous) < 4 else synchronous,
            "busy_timeout_ms": int(busy),
            "server_time": None,
        }

    def inspect(self) -> Inspection:
        with translate_errors("inspecting the store"):
            return inspect_store(self.conn(), self.integrity, self.path)

    # -- connections -------------------------------------------------------------------------
    def connect(self) -> sqlite3.Connection:
        conn = self._unconfigured()
        self._configure(conn)
        return conn

    def conn(self) -> sqlite3.Connection:
        # Every verb asks for it: SQLite's connections do not break under it, so there is
        # nothing to check once this thread has one, but whether this is still the process
        # that opened it (a forked child opens its own).
        self.check_fork()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        return super().conn() if conn is None else conn

    def _unconfigured(self) -> sqlite3.Connection:
        """A connection that has changed nothing yet: :meth:`open` checks the file before
        :meth:`_configure` switches it to WAL, so a file oncewire refuses is left as it was."""
        path, create = self.path, self._create
        if path != ":memory:" and not create and not Path(path).exists():
            raise StoreUnusable(f"no database at {path}")  # a reader never waits for one to appear
        # Without create, an existing file only: SQLite would make a new one of any path.
        existing = not create and path != ":memory:"
        mode = "ro" if self.read_only else "rw"
        immutable = "&immutable=1" if self.immutable else ""
        with translate_errors(f"opening {path}"):
            # check_same_thread=False only so that close() may run on another thread; each
            # connection is used by the one thread that opened it.
            conn = sqlite3.connect(
                f"file:{quote(str(Path(path).resolve()))}?mode={mode}{immutable}"
                if existing
                else path,
                uri=existing,
                isolation_level=None,
                timeout=self._busy_timeout_ms / 1000,
                check_same_thread=False,
            )
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            except BaseException:
                conn.close()
                raise
        return conn

    def _configure(self, conn: sqlite3.Connection, *, wal: bool = True) -> None:
        """WAL, the flush level and foreign keys: the settings every connection runs with (a
        read-only one is made query-only instead of switched to WAL)."""
        try:
            with translate_errors(f"configuring {self.path}"):
                conn.execute(f"PRAGMA synchronous = {self.synchronous}")
                conn.execute("PRAGMA foreign_keys = ON")
                if self.read_only:
                    conn.execute("PRAGMA query_only = ON")
                elif wal:
                    self._switch_to_wal(conn)
        except BaseException:
            conn.close()
            raise

    def _switch_to_wal(self, conn: sqlite3.Connection) -> None:
        with translate_errors(f"switching {self.path} to WAL"):
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if self.path != ":memory:" and str(mode).lower() != "wal":
            raise StorageError(f"{self.path}: could not switch the journal to WAL (got {mode})")

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` within milliseconds of any commit to the file, by any process
        (``PRAGMA data_version``, watched by one thread per file: see wake.py)."""
        if self.path == ":memory:":
            return super().subscribe(wake)
        uri = f"file:{Path(self.path).resolve()}?mode=ro"
        return wake_watch(
            self.path,
            lambda: sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False),
        ).add(wake)

    def subscribe_settled(self, wake: Callable[[], None]) -> Callable[[], None]:
        return self.subscribe(wake)  # any commit: a settlement is one

    def subscribe_inbound(self, wake: Callable[[], None]) -> Callable[[], None]:
        return self.subscribe(wake)  # any commit: an admission is one

    def subscribe_replies(self, wake: Callable[[], None]) -> Callable[[], None]:
        return self.subscribe(wake)  # any commit: a reply committed or given back is one

    def forked(self) -> None:
        if self.groups is not None:  # the parent's shared transaction is the parent's
            self.groups = GroupCommit(self)

    def shared_commits(self) -> dict[str, int] | None:
        groups = self.groups
        if groups is None:
            return None
        return {"commits": groups.commits, "committed": groups.committed}

    # -- transactions ------------------------------------------------------------------------
    def transaction(self) -> AbstractContextManager[SQLiteTransaction]:
        if self.groups is not None:
            self.check_fork()
            groups = self.groups  # after the check: a forked child's own
            return groups.transaction()
        conn = self.conn()
        guard: CallerGuard | None = getattr(self._local, "guard", None)
        if guard is None or guard.conn is not conn:
            guard = self._local.guard = CallerGuard(conn)  # installed at its first statement
        return SQLiteTransaction(conn, store=self.path, guard=guard)

    def shared_transaction(
        self, conn: sqlite3.Connection, guard: CallerGuard | None
    ) -> SQLiteTransaction:
        """A caller's view of the shared transaction open on ``conn`` (group.py)."""
        return SQLiteTransaction(conn, is_open=True, store=self.path, guard=guard)

    def write(self, what: str) -> _Write:
        return _Write(self.conn(), what, store=self.path)

    def one_alone(
        self, what: str, q: Query, /, *, before_commit: Callable[[], None], **params: Any
    ) -> Row | None:
        """One statement in autocommit mode, committed as it completes. A statement that
        writes takes the write lock before it reads anything, as ``BEGIN IMMEDIATE`` does, and
        waits out the busy timeout the same way: a ``BEGIN`` and a ``COMMIT`` of its own would
        add two calls and change nothing. ``before_commit()`` runs before it starts (nothing is
        written yet). Every row is fetched: the commit is the statement's last step."""
        conn = self.conn()
        if conn.in_transaction:
            raise InvalidState("a transaction is already open on this thread")
        text, values = q.render(params)
        before_commit()
        forkgate.enter()  # no fork copies this process while the statement holds the lock
        try:
            rows = conn.execute(text, values).fetchall()
        except sqlite3.Error as exc:
            raise translated(what, exc, self.path) from exc
        finally:
            forkgate.leave()
        return rows[0] if rows else None

    def translate_errors(self, what: str) -> ErrorTranslation:
        return ErrorTranslation(sqlite3.Error, functools.partial(translated, store=self.path), what)

    def in_transaction(self, conn: Any) -> bool:
        return bool(conn.in_transaction)

    def caller_transaction(self, conn: Any) -> SQLiteTransaction:
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
        return SQLiteTransaction(conn, is_open=True, store=self.path)

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

    # -- statements --------------------------------------------------------------------------
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

    def read_sql(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
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

    def tolerant(self, step: Callable[[], T]) -> T:
        try:
            return step()
        except StorageError as exc:
            if not undecodable_text(exc.__cause__):
                raise
        # A stored text that is not valid UTF-8 (a claimed payload written around oncewire)
        # failed the whole transaction, which rolled back: run it again with such text marked,
        # so the dispatcher gets an undecodable payload instead of failing on every step.
        with self.lenient():
            return step()

    # -- execution strategy ------------------------------------------------------------------
    @contextlib.contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A deferred ``BEGIN``: in WAL mode the first read fixes the snapshot, and no lock is
        taken against writers."""
        conn = self.conn()
        if conn.in_transaction:
            yield conn  # the caller's transaction is the snapshot
            return
        with translate_errors("beginning a read"):
            conn.execute("BEGIN")
        try:
            yield conn
        finally:
            if conn.in_transaction:
                with translate_errors("ending a read"):
                    conn.execute("ROLLBACK")

    # constraint_refusal: the default. SQLite names no constraint in its errors (only its
    # message does, which is never read). Nor is there a race to map: BEGIN IMMEDIATE made the
    # transaction the only writer from its first statement, so what it read still holds when it
    # writes.
