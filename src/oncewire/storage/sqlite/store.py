"""SQLiteStore: WAL, synchronous=FULL, BEGIN IMMEDIATE writers, one connection per thread."""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from oncewire.core.errors import (
    ConfigurationError,
    EffectNotFound,
    InvalidState,
    StorageError,
)
from oncewire.storage.base import Store
from oncewire.storage.inspection import Inspection
from oncewire.storage.opening import (
    DEFAULT_OPEN_TIMEOUT_SECONDS,
    check_open_timeout,
    open_with_retries,
)
from oncewire.storage.records import (
    ATTEMPT_COLUMNS,
    EFFECT_COLUMNS,
    RECEIPT_COLUMNS,
    AttemptRecord,
    Backlog,
    Claim,
    Effect,
    EffectState,
    Receipt,
    Settlement,
    UndecodableText,
    attempt_outcome,
    cancelled_attempt,
)
from oncewire.storage.sqlguard import SavepointStack, check_statement
from oncewire.storage.sqlite.connection import (
    check_version,
    configure,
    connect,
    current_version,
    migrate,
    open_connection,
    path_from_url,
    translate_errors,
    translated,
)
from oncewire.storage.sqlite.replies import SQLiteReplyVerbs
from oncewire.storage.sqlite.runs import SQLiteRunVerbs

__all__ = ["SQLiteStore", "SQLiteTransaction"]

_EFFECT_COLUMNS = EFFECT_COLUMNS
_RECEIPT_COLUMNS = RECEIPT_COLUMNS
_WAITING = "('pending', 'uncertain')"
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")

# Settlements are written a chunk at a time, one statement over a VALUES list per chunk. The
# list is padded to a power of two with rows of NULLs (which match no effect), so a handful of
# statement texts, each prepared once and cached, serve every number of settlements.
_SETTLE_CHUNK = 128
_NULLS = (None,) * (9 * _SETTLE_CHUNK)


@functools.cache
def _values(rows: int, width: int) -> str:
    row = f"({', '.join('?' * width)})"
    return ", ".join([row] * rows)


def _chunks(items: Sequence[Settlement]) -> Iterator[tuple[Sequence[Settlement], int]]:
    """``items`` in chunks of at most ``_SETTLE_CHUNK``, each with its padded size."""
    for start in range(0, len(items), _SETTLE_CHUNK):
        chunk = items[start : start + _SETTLE_CHUNK]
        size = 1
        while size < len(chunk):
            size *= 2
        yield chunk, size


_effect = Effect.from_row


def _lenient_text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        # Shown with replacement characters, and led by one so that no JSON decoder takes
        # the repaired text for the payload that was stored.
        return UndecodableText("\ufffd" + data.decode("utf-8", "replace"))


def _undecodable_text(exc: BaseException | None) -> bool:
    """The driver's own failure to decode a stored text as UTF-8 (it has no result code)."""
    return isinstance(exc, sqlite3.OperationalError) and not hasattr(exc, "sqlite_errorcode")


# What releasing a claim sets, as SQL over the claimed row (each takes one ``now`` parameter,
# the error two): shared by the update and the attempt-history row written with it.
_RELEASED_STATE = (
    "CASE WHEN attempts >= max_attempts OR (deadline IS NOT NULL AND deadline < ?) "
    "THEN 'dead' ELSE 'uncertain' END"
)
_RELEASED_ERROR = (
    "CASE WHEN attempts >= max_attempts THEN 'out of attempts (' || attempts || "
    "'); the outcome of the last attempt is unknown' "
    "WHEN deadline IS NOT NULL AND deadline < ? THEN "
    "'deadline passed; the outcome of the last attempt is unknown' "
    "WHEN lease_expires_at < ? THEN 'lease of ' || lease_owner || "
    "' expired during attempt ' || attempts "
    "ELSE 'owner ' || lease_owner || ' died during attempt ' || attempts END"
)
_receipt = Receipt.from_row


def _kind_filter(kinds: Sequence[str] | None) -> tuple[str, list[str]]:
    if kinds is None:
        return "", []
    if not kinds:
        return " AND 0", []
    return f" AND kind IN ({', '.join('?' * len(kinds))})", list(kinds)


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
    """A store verb's own transaction: yields the connection, translates errors as ``what``."""

    __slots__ = ()

    def __enter__(self) -> sqlite3.Connection:  # type: ignore[override]
        self.begin()
        return self.conn


class SQLiteStore(SQLiteReplyVerbs, SQLiteRunVerbs, Store):
    dialect = "sqlite"

    def __init__(
        self,
        url_or_path: str,
        *,
        create: bool = True,
        busy_timeout_ms: int = 10_000,
        synchronous: str = "FULL",
        open_timeout_seconds: float = DEFAULT_OPEN_TIMEOUT_SECONDS,
    ) -> None:
        if synchronous.upper() not in _SYNCHRONOUS:
            raise ConfigurationError(f"synchronous must be one of {', '.join(_SYNCHRONOUS)}")
        self.url = url_or_path
        self.path = path_from_url(url_or_path)
        self._create = create
        self._busy_timeout_ms = busy_timeout_ms
        self._synchronous = synchronous.upper()
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        # A store that failed to open must not leak its connection: close() after each failure.
        open_with_retries(
            self._open,
            what=f"opening {self.path}",
            timeout_seconds=check_open_timeout(open_timeout_seconds),
            cleanup=self.close,
        )

    def _open(self) -> None:
        conn = open_connection(
            self.path, create=self._create, busy_timeout_ms=self._busy_timeout_ms
        )
        with self._all_lock:
            self._all.append(conn)
        # Check before configuring: a file oncewire refuses keeps its journal mode and bytes.
        with translate_errors(f"reading the schema of {self.path}"):
            version = current_version(conn)
        check_version(version, create=self._create, path=self.path)
        configure(conn, self.path, synchronous=self._synchronous)
        self._local.conn = conn
        migrate(conn)

    # -- connections -------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(
                self.path,
                create=self._create,
                busy_timeout_ms=self._busy_timeout_ms,
                synchronous=self._synchronous,
            )
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
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

    def schema_version(self) -> int:
        with translate_errors("reading the schema version"):
            return current_version(self._conn()) or 0

    def inspect(self) -> Inspection:
        from oncewire.storage.sqlite.inspect import inspect

        with translate_errors("inspecting the store"):
            return inspect(self._conn())

    def health(self) -> dict[str, Any]:
        conn = self._conn()
        with translate_errors("reading settings"):
            journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
            synchronous = conn.execute("PRAGMA synchronous").fetchone()[0]
            busy = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        return {
            "backend": "sqlite",
            "path": self.path,
            "sqlite_version": sqlite3.sqlite_version,
            "schema_version": self.schema_version(),
            "journal_mode": str(journal).lower(),
            "synchronous": _SYNCHRONOUS[int(synchronous)] if int(synchronous) < 4 else synchronous,
            "busy_timeout_ms": int(busy),
            "server_time": None,
        }

    def transaction(self) -> SQLiteTransaction:
        return SQLiteTransaction(self._conn())

    @contextlib.contextmanager
    def group_commit(self) -> Iterator[None]:
        conn = self._conn()
        if self._synchronous not in ("FULL", "EXTRA") or self.path == ":memory:":
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
                conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            try:
                fd = os.open(f"{self.path}-wal", os.O_RDONLY)
            except FileNotFoundError:
                pass  # checkpointed and removed: everything is in the database file
            else:
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def _write(self, what: str) -> _Write:
        return _Write(self._conn(), what)

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        conn = self._conn()
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if not _undecodable_text(exc):
                raise translated("reading", exc) from exc
            # The driver could not decode a stored text as UTF-8 (written around oncewire):
            # read again with that text marked undecodable, so one bad row cannot make every
            # reader of the store fail.
            conn.text_factory = _lenient_text
            try:
                with translate_errors("reading"):
                    return conn.execute(sql, params).fetchall()
            finally:
                conn.text_factory = str
        except sqlite3.Error as exc:
            raise translated("reading", exc) from exc

    # -- effects -----------------------------------------------------------------------------
    def insert_effect_in_tx(
        self,
        tx: Any,
        *,
        key: str,
        kind: str,
        payload_json: str,
        digest: str,
        max_attempts: int,
        not_before: float,
        deadline: float | None,
        now: float,
    ) -> tuple[Effect, bool]:
        conn: sqlite3.Connection = tx.conn
        tx.check_open()  # never write outside the caller's transaction (autocommit)
        with translate_errors("accepting an effect"):
            inserted = conn.execute(
                "INSERT INTO oncewire_effects (key, kind, payload, digest, max_attempts, "
                "not_before, deadline, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (key) DO NOTHING RETURNING id",
                (key, kind, payload_json, digest, max_attempts, not_before, deadline, now, now),
            ).fetchall()
            if inserted:
                # Every other column is its default: build the record instead of reading it.
                return Effect(
                    id=inserted[0][0],
                    key=key,
                    kind=kind,
                    payload_json=payload_json,
                    digest=digest,
                    state=EffectState.PENDING,
                    attempts=0,
                    max_attempts=max_attempts,
                    not_before=not_before,
                    deadline=deadline,
                    fence=0,
                    lease_owner=None,
                    lease_expires_at=None,
                    maybe_sent=False,
                    result_json=None,
                    last_error=None,
                    created_at=now,
                    updated_at=now,
                ), True
            rows = conn.execute(
                f"SELECT {_EFFECT_COLUMNS} FROM oncewire_effects WHERE key = ?", (key,)
            ).fetchall()
        return _effect(rows[0]), False

    def get_effect(self, key: str) -> Effect | None:
        rows = self._read(f"SELECT {_EFFECT_COLUMNS} FROM oncewire_effects WHERE key = ?", (key,))
        return _effect(rows[0]) if rows else None

    def list_effects(
        self,
        *,
        states: Sequence[EffectState] = (),
        kind: str | None = None,
        limit: int = 100,
        after_id: int = 0,
        newest_first: bool = False,
        before_id: int | None = None,
    ) -> list[Effect]:
        where: list[str] = ["id > ?"]
        params: list[Any] = [after_id]
        if before_id is not None:
            where.append("id < ?")
            params.append(before_id)
        if states:
            where.append(f"state IN ({', '.join('?' * len(states))})")
            params.extend(str(s) for s in states)
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        rows = self._read(
            f"SELECT {_EFFECT_COLUMNS} FROM oncewire_effects WHERE {' AND '.join(where)} "
            f"ORDER BY id {'DESC' if newest_first else 'ASC'} LIMIT ?",
            (*params, limit),
        )
        return [_effect(row) for row in rows]

    def count_effects(self, *, kind: str | None = None) -> dict[EffectState, int]:
        counts = dict.fromkeys(EffectState, 0)
        for state, count in self._read(
            "SELECT state, COUNT(*) FROM oncewire_effects "
            + ("WHERE kind = ? " if kind is not None else "")
            + "GROUP BY state",
            (kind,) if kind is not None else (),
        ):
            counts[EffectState(state)] = count
        return counts

    def _record_attempts_in_tx(
        self, conn: sqlite3.Connection, items: Sequence[Settlement], now: float
    ) -> None:
        """One attempt-history row per settlement that will apply (still claimed under its
        fence), read from the claim before the settlement clears its owner: one statement per
        chunk of settlements (see :func:`_chunks`)."""
        for chunk, size in _chunks(items):
            params: list[Any] = []
            for item in chunk:
                params += (
                    item.id,
                    item.fence,
                    item.attempt,
                    int(item.redelivery),
                    attempt_outcome(item),
                    str(item.state),
                    item.last_error,
                    item.started_at,
                    now if item.finished_at is None else item.finished_at,
                )
            params += _NULLS[: 9 * (size - len(chunk))]
            conn.execute(
                f"WITH v (id, fence, attempt, redelivery, outcome, state, error, started_at, "
                f"  finished_at) AS (VALUES {_values(size, 9)}) "
                f"INSERT INTO oncewire_attempts ({ATTEMPT_COLUMNS}) "
                "SELECT e.id, CASE WHEN v.attempt > 0 THEN v.attempt ELSE e.attempts END, "
                "  e.fence, e.lease_owner, MAX(e.maybe_sent, v.redelivery), v.outcome, v.state, "
                "  v.error, v.started_at, v.finished_at "
                "FROM v JOIN oncewire_effects AS e ON e.id = v.id AND e.fence = v.fence "
                "WHERE e.state = 'claimed' "
                "ON CONFLICT (effect_id, fence) DO NOTHING",
                params,
            )

    def list_attempts(self, effect_id: int) -> list[AttemptRecord]:
        rows = self._read(
            f"SELECT {ATTEMPT_COLUMNS} FROM oncewire_attempts WHERE effect_id = ? ORDER BY fence",
            (effect_id,),
        )
        return [AttemptRecord.from_row(row) for row in rows]

    def _settle_in_tx(
        self, conn: sqlite3.Connection, items: Sequence[Settlement], now: float
    ) -> list[bool]:
        """Apply each settlement whose effect is still claimed under its fence; which did."""
        applied: set[tuple[int, int]] = set()
        for chunk, size in _chunks(items):
            params: list[Any] = []
            for item in chunk:
                params += (
                    item.id,
                    item.fence,
                    str(item.state),
                    item.result_json,
                    item.last_error,
                    item.not_before,
                    int(item.maybe_sent),
                    int(item.refund_attempt),  # a refunded (not-sent) attempt does not count
                )
            params += _NULLS[: 8 * (size - len(chunk))]
            params.append(now)
            rows = conn.execute(
                "WITH v (id, fence, state, result, last_error, not_before, maybe_sent, refund) "
                f"  AS (VALUES {_values(size, 8)}) "
                "UPDATE oncewire_effects AS e SET state = v.state, result = v.result, "
                "  last_error = v.last_error, not_before = COALESCE(v.not_before, e.not_before), "
                "  maybe_sent = MAX(e.maybe_sent, v.maybe_sent), attempts = e.attempts - v.refund, "
                # not-sent attempts in a row: a charged attempt ends the run
                "  not_sent = CASE WHEN v.refund = 1 THEN e.not_sent + 1 ELSE 0 END, "
                "  lease_owner = NULL, lease_expires_at = NULL, updated_at = ? "
                "FROM v WHERE e.id = v.id AND e.fence = v.fence AND e.state = 'claimed' "
                "RETURNING id, fence",
                params,
            ).fetchall()
            applied.update((row[0], row[1]) for row in rows)
        return [(item.id, item.fence) in applied for item in items]

    def settle_and_claim(
        self,
        settlements: Sequence[Settlement],
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int,
        kinds: Sequence[str] | None = None,
    ) -> tuple[list[bool], list[Claim]]:
        args = (settlements, owner, now, lease_seconds, limit, kinds)
        try:
            return self._settle_and_claim(*args)
        except StorageError as exc:
            if not _undecodable_text(exc.__cause__):
                raise
        # A claimed payload that is not valid UTF-8 (written around oncewire) failed the whole
        # transaction, which rolled back: claim again with such text marked, so the dispatcher
        # gets it as an undecodable payload instead of failing on every step.
        conn = self._conn()
        conn.text_factory = _lenient_text
        try:
            return self._settle_and_claim(*args)
        finally:
            conn.text_factory = str

    def _settle_and_claim(
        self,
        settlements: Sequence[Settlement],
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int,
        kinds: Sequence[str] | None,
    ) -> tuple[list[bool], list[Claim]]:
        expires = now + lease_seconds
        kind_clause, kind_params = _kind_filter(kinds)
        with self._write("settling and claiming effects") as conn:
            if settlements:
                self._record_attempts_in_tx(conn, settlements, now)
            applied = self._settle_in_tx(conn, settlements, now)
            if limit <= 0:
                return applied, []
            rows = conn.execute(
                "UPDATE oncewire_effects SET state = 'claimed', attempts = attempts + 1, "
                "fence = fence + 1, lease_owner = ?, lease_expires_at = ?, updated_at = ? "
                "WHERE id IN (SELECT id FROM oncewire_effects "
                f"  WHERE state IN {_WAITING} AND not_before <= ? "
                f"  AND (deadline IS NULL OR deadline >= ?){kind_clause} "
                "  ORDER BY not_before, id LIMIT ?) "
                "RETURNING id, key, kind, payload, attempts, max_attempts, fence, maybe_sent, "
                "deadline, not_sent",
                (owner, expires, now, now, now, *kind_params, limit),
            ).fetchall()
        claims = [Claim.from_row(row, expires) for row in rows]
        claims.sort(key=lambda claim: claim.id)
        return applied, claims

    def renew_leases(
        self, owner: str, fences: Sequence[tuple[int, int]], expires_at: float, now: float
    ) -> int:
        if not fences:
            return 0
        renewed = 0
        with self._write("renewing leases") as conn:
            for effect_id, fence in fences:
                renewed += conn.execute(
                    "UPDATE oncewire_effects SET lease_expires_at = ?, updated_at = ? "
                    "WHERE id = ? AND fence = ? AND state = 'claimed' AND lease_owner = ?",
                    (expires_at, now, effect_id, fence, owner),
                ).rowcount
        return renewed

    def lease_holders(self) -> list[str]:
        return [
            row[0]
            for row in self._read(
                "SELECT DISTINCT lease_owner FROM oncewire_effects WHERE state = 'claimed'"
            )
        ]

    def release_claims(self, *, now: float, dead_owners: Sequence[str] = ()) -> int:
        owners = list(dead_owners)
        owner_clause = f" OR lease_owner IN ({', '.join('?' * len(owners))})" if owners else ""
        with self._write("releasing claims") as conn:
            # The attempt history first, while the claim still names its owner.
            conn.execute(
                f"INSERT INTO oncewire_attempts ({ATTEMPT_COLUMNS}) "
                "SELECT id, attempts, fence, lease_owner, maybe_sent, "
                "  CASE WHEN lease_expires_at < ? THEN 'lease_expired' ELSE 'owner_died' END, "
                f"  {_RELEASED_STATE}, {_RELEASED_ERROR}, NULL, ? FROM oncewire_effects "
                f"WHERE state = 'claimed' AND (lease_expires_at < ?{owner_clause}) "
                "ON CONFLICT (effect_id, fence) DO NOTHING",
                (now, now, now, now, now, now, *owners),
            )
            cursor = conn.execute(
                "UPDATE oncewire_effects SET "
                f"  state = {_RELEASED_STATE}, last_error = {_RELEASED_ERROR}, "
                "  maybe_sent = 1, lease_owner = NULL, lease_expires_at = NULL, "
                # not_before is kept: the effect was due then, so it goes back to the head of
                # the line instead of behind everything accepted while it was claimed.
                "  updated_at = ? "
                f"WHERE state = 'claimed' AND (lease_expires_at < ?{owner_clause})",
                (now, now, now, now, now, *owners),
            )
            return cursor.rowcount

    def expire_deadlines(self, now: float) -> int:
        with self._write("expiring deadlines") as conn:
            return conn.execute(
                "UPDATE oncewire_effects SET state = 'dead', updated_at = ?, last_error = "
                "  CASE WHEN maybe_sent = 1 THEN 'deadline passed; an earlier attempt may have "
                "landed' ELSE 'deadline passed before delivery' END "
                f"WHERE state IN {_WAITING} AND deadline IS NOT NULL AND deadline < ?",
                (now, now),
            ).rowcount

    def backlog(self, kinds: Sequence[str] | None = None) -> Backlog:
        clause, params = _kind_filter(kinds)
        row = self._read(
            "SELECT (SELECT MIN(not_before) FROM oncewire_effects "
            f"        WHERE state IN {_WAITING}{clause}), "
            f"       (SELECT COUNT(*) FROM oncewire_effects WHERE state = 'uncertain'{clause}), "
            f"       (SELECT COUNT(*) FROM oncewire_effects WHERE state = 'claimed'{clause}), "
            "       (SELECT COUNT(*) FROM oncewire_effects "
            # fence, not attempts: a not-sent attempt gives its charge back but was a claim
            f"        WHERE state = 'pending' AND fence > 0{clause})",
            (*params, *params, *params, *params),
        )[0]
        return Backlog(next_due=row[0], uncertain=row[1], claimed=row[2], retrying=row[3])

    def waiting_kinds(self) -> dict[str, tuple[int, float]]:
        rows = self._read(
            "SELECT kind, COUNT(*), MIN(created_at) FROM oncewire_effects "
            "WHERE state IN ('pending', 'uncertain') GROUP BY kind"
        )
        return {kind: (int(count), float(oldest)) for kind, count, oldest in rows}

    def _locked_effect(self, conn: sqlite3.Connection, key: str) -> Effect:
        rows = conn.execute(
            f"SELECT {_EFFECT_COLUMNS} FROM oncewire_effects WHERE key = ?", (key,)
        ).fetchall()
        if not rows:
            raise EffectNotFound(f"no effect with key {key!r}", key=key)
        return _effect(rows[0])

    def cancel_effect(self, key: str, *, now: float, reason: str) -> Effect:
        with self._write("cancelling an effect") as conn:
            effect = self._locked_effect(conn, key)
            effect.check_cancellable()
            in_flight = effect.state is EffectState.CLAIMED
            if in_flight:
                reason += f" (while attempt {effect.attempts} was in flight: it may have landed)"
                conn.execute(
                    f"INSERT INTO oncewire_attempts ({ATTEMPT_COLUMNS}) "
                    "VALUES (?, ?, ?, ?, ?, 'cancelled', 'cancelled', ?, NULL, ?) "
                    "ON CONFLICT (effect_id, fence) DO NOTHING",
                    cancelled_attempt(effect, reason, now),
                )
            # An attempt in flight may land: a later retry must go out flagged as a redelivery.
            rows = conn.execute(
                "UPDATE oncewire_effects SET state = 'cancelled', last_error = ?, "
                "lease_owner = NULL, lease_expires_at = NULL, fence = fence + 1, updated_at = ?, "
                f"maybe_sent = ? WHERE id = ? RETURNING {_EFFECT_COLUMNS}",
                (reason, now, int(in_flight or effect.maybe_sent), effect.id),
            ).fetchall()
        return _effect(rows[0])

    def retry_effect(self, key: str, *, now: float) -> Effect:
        with self._write("retrying an effect") as conn:
            effect = self._locked_effect(conn, key)
            effect.check_retryable()
            rows = conn.execute(
                "UPDATE oncewire_effects SET state = 'pending', attempts = 0, not_sent = 0, "
                "not_before = ?, "
                # A deadline that has passed would kill the retry at once: the operator's retry
                # lifts it. A deadline still ahead stays.
                f"deadline = CASE WHEN deadline < ? THEN NULL ELSE deadline END, "
                f"last_error = NULL, updated_at = ? WHERE id = ? RETURNING {_EFFECT_COLUMNS}",
                (now, now, now, effect.id),
            ).fetchall()
        return _effect(rows[0])

    # -- receipts ----------------------------------------------------------------------------
    def reserve_receipt_in_tx(
        self,
        tx: Any,
        *,
        key: str,
        digest: str,
        payload_json: str,
        now: float,
        expires_at: float | None,
    ) -> Receipt | None:
        conn: sqlite3.Connection = tx.conn
        tx.check_open()  # never write outside the caller's transaction (autocommit)
        with translate_errors("reserving a receipt"):
            inserted = conn.execute(
                "INSERT INTO oncewire_receipts (key, digest, payload, created_at, expires_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING",
                (key, digest, payload_json, now, expires_at),
            ).rowcount
            if inserted:
                return None
            rows = conn.execute(
                f"SELECT {_RECEIPT_COLUMNS} FROM oncewire_receipts WHERE key = ?", (key,)
            ).fetchall()
        return _receipt(rows[0])

    def complete_receipt_in_tx(self, tx: Any, *, key: str, result_json: str) -> None:
        conn: sqlite3.Connection = tx.conn
        tx.check_open()  # never write outside the caller's transaction (autocommit)
        with translate_errors("completing a receipt"):
            conn.execute(
                "UPDATE oncewire_receipts SET result = ? WHERE key = ?", (result_json, key)
            )

    def get_receipt(self, key: str) -> Receipt | None:
        rows = self._read(f"SELECT {_RECEIPT_COLUMNS} FROM oncewire_receipts WHERE key = ?", (key,))
        return _receipt(rows[0]) if rows else None

    def list_receipts(self, *, limit: int = 100, after_key: str = "") -> list[Receipt]:
        rows = self._read(
            f"SELECT {_RECEIPT_COLUMNS} FROM oncewire_receipts WHERE key > ? ORDER BY key LIMIT ?",
            (after_key, limit),
        )
        return [_receipt(row) for row in rows]

    def purge_receipts(self, *, expired_before: float) -> int:
        with self._write("purging receipts") as conn:
            return conn.execute(
                "DELETE FROM oncewire_receipts WHERE expires_at IS NOT NULL AND expires_at < ?",
                (expired_before,),
            ).rowcount
