"""PostgresStore: SKIP LOCKED claims, LISTEN/NOTIFY wake-ups, fenced settlements.

Each thread gets its own autocommit connection; a transaction is an explicit ``BEGIN`` through
``conn.transaction()``. A connection the server dropped (restart, ``pg_terminate_backend``) is
discarded and replaced at the next call; the error of the call that found it broken reaches the
caller as a :class:`StorageError`, because a commit whose answer was lost is not known to have
failed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from oncewire.core.errors import ConfigurationError, EffectNotFound, InvalidState, SchemaError
from oncewire.storage.base import Store
from oncewire.storage.inspection import Inspection
from oncewire.storage.opening import (
    DEFAULT_OPEN_TIMEOUT_SECONDS,
    check_open_timeout,
    open_with_retries,
)
from oncewire.storage.postgres.connection import (
    connect,
    connect_timeout_seconds,
    current_version,
    migrate,
    psycopg,
    require_driver,
    translate_errors,
    translated,
)
from oncewire.storage.postgres.replies import PostgresReplyVerbs
from oncewire.storage.postgres.runs import PostgresRunVerbs
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
    attempt_outcome,
    cancelled_attempt,
)
from oncewire.storage.sqlguard import SavepointStack, check_statement

__all__ = ["PostgresStore", "PostgresTransaction"]

_EFFECT_COLUMNS = EFFECT_COLUMNS
_RECEIPT_COLUMNS = RECEIPT_COLUMNS
_WAITING = "('pending', 'uncertain')"
CHANNEL = "oncewire_effects"


_effect = Effect.from_row
_receipt = Receipt.from_row


def _kind_filter(kinds: Sequence[str] | None) -> tuple[str, list[Any]]:
    if kinds is None:
        return "", []
    return " AND kind = ANY(%s)", [list(kinds)]


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


class PostgresTransaction:
    """The caller's view of an open PostgreSQL transaction (``%s`` placeholders).

    ``execute`` refuses what would end the transaction or change the connection
    (:mod:`oncewire.storage.sqlguard`), and several statements in one string.
    """

    __slots__ = ("conn", "is_open", "savepoints")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.is_open = True
        self.savepoints = SavepointStack()

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        self.check_open()
        check_statement(sql, self.savepoints)
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


class PostgresStore(PostgresRunVerbs, PostgresReplyVerbs, Store):
    dialect = "postgresql"

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        open_timeout_seconds: float = DEFAULT_OPEN_TIMEOUT_SECONDS,
    ) -> None:
        require_driver()
        self.url = url
        self._connect_timeout = connect_timeout_seconds(url)
        self._local = threading.local()
        self._all: list[Any] = []
        self._all_lock = threading.Lock()
        # A dropped connection or a restarting server while opening is waited out (bounded).
        open_with_retries(
            lambda: self._open(create),
            what="opening the PostgreSQL store",
            timeout_seconds=check_open_timeout(open_timeout_seconds),
            cleanup=self.close,
        )

    def _open(self, create: bool) -> None:
        conn = self._conn()
        try:
            with translate_errors("reading the schema"):
                version = current_version(conn)
            if version is None and not create:
                raise SchemaError(
                    "this database holds no oncewire schema (oncewire_schema missing)"
                )
            migrate(conn)
        finally:
            if conn.broken:
                self._forget(conn)

    # -- connections -------------------------------------------------------------------------
    def _conn(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is not None and (conn.closed or conn.broken):
            self._forget(conn)
            conn = None
        if conn is None:
            conn = connect(self.url, timeout_seconds=self._connect_timeout)
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _forget(self, conn: Any) -> None:
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

    def schema_version(self) -> int:
        return self._reading(lambda conn: current_version(conn) or 0, "reading the schema version")

    def inspect(self) -> Inspection:
        from oncewire.storage.postgres.inspect import inspect

        with translate_errors("inspecting the store"):
            return inspect(self._conn())

    def health(self) -> dict[str, Any]:
        row = self._read(
            "SELECT current_setting('server_version'), current_database(), current_user, "
            "current_schema(), extract(epoch FROM clock_timestamp())::float8"
        )[0]
        return {
            "backend": "postgresql",
            "server_version": row[0],
            "database": row[1],
            "user": row[2],
            "schema": row[3],
            "schema_version": self.schema_version(),
            "server_time": float(row[4]),
        }

    @contextmanager
    def group_commit(self) -> Iterator[None]:
        # Commits inside skip waiting for their WAL flush; the synchronous commit at the end
        # (a transaction that takes an xid, so its commit record must reach the disk) flushes
        # the WAL up to and including every one of them.
        conn = self._conn()
        with translate_errors("relaxing the flush for a group of commits"):
            conn.execute("SET synchronous_commit = off")
        try:
            yield
        finally:
            conn = self._conn()
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
            conn = self._conn()
            if conn.info.transaction_status != _IDLE:
                raise InvalidState("a transaction is already open on this thread")
            block = conn.transaction()
            try:
                block.__enter__()
            except psycopg.Error as exc:
                if conn.broken:
                    self._forget(conn)
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
                self._forget(conn)

    @contextmanager
    def _write(self, what: str) -> Iterator[Any]:
        with translate_errors(what), self.transaction() as tx:
            yield tx.conn

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._reading(lambda conn: list(conn.execute(sql, params or None).fetchall()))

    def _reading(self, read: Callable[[Any], T], what: str = "reading") -> T:
        """``read(conn)`` outside any transaction. A connection the server dropped while it sat
        idle is replaced and the read run again, once: reading twice changes nothing.

        Inside a transaction (a read snapshot, say) a dropped connection took the transaction
        with it: running the read again on a fresh connection would answer from another moment,
        so the error is raised instead.
        """
        for retry in (False, True):
            conn = self._conn()
            idle = conn.info.transaction_status == _IDLE
            try:
                return read(conn)
            except psycopg.Error as exc:
                if conn.broken and idle:
                    self._forget(conn)
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
        conn = tx.conn
        tx.check_open()  # never write outside the caller's transaction (autocommit)
        with translate_errors("accepting an effect"):
            row = conn.execute(
                f"INSERT INTO oncewire_effects (key, kind, payload, digest, max_attempts, "
                f"not_before, deadline, created_at, updated_at) "
                f"VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
                f"ON CONFLICT (key) DO NOTHING RETURNING {_EFFECT_COLUMNS}",
                (key, kind, payload_json, digest, max_attempts, not_before, deadline, now, now),
            ).fetchone()
            if row is not None:
                return _effect(row), True
            row = conn.execute(
                f"SELECT {_EFFECT_COLUMNS} FROM oncewire_effects WHERE key = %s", (key,)
            ).fetchone()
        return _effect(row), False

    def get_effect(self, key: str) -> Effect | None:
        rows = self._read(f"SELECT {_EFFECT_COLUMNS} FROM oncewire_effects WHERE key = %s", (key,))
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
        where: list[str] = ["id > %s"]
        params: list[Any] = [after_id]
        if before_id is not None:
            where.append("id < %s")
            params.append(before_id)
        if states:
            where.append("state = ANY(%s)")
            params.append([str(s) for s in states])
        if kind is not None:
            where.append("kind = %s")
            params.append(kind)
        rows = self._read(
            f"SELECT {_EFFECT_COLUMNS} FROM oncewire_effects WHERE {' AND '.join(where)} "
            f"ORDER BY id {'DESC' if newest_first else 'ASC'} LIMIT %s",
            (*params, limit),
        )
        return [_effect(row) for row in rows]

    def count_effects(self, *, kind: str | None = None) -> dict[EffectState, int]:
        counts = dict.fromkeys(EffectState, 0)
        for state, count in self._read(
            "SELECT state, COUNT(*) FROM oncewire_effects "
            + ("WHERE kind = %s " if kind is not None else "")
            + "GROUP BY state",
            (kind,) if kind is not None else (),
        ):
            counts[EffectState(state)] = count
        return counts

    def _record_attempts_in_tx(self, conn: Any, items: Sequence[Settlement], now: float) -> None:
        """One attempt-history row per settlement that will apply, in one statement.

        Read from the claim before the settlement clears its owner; FOR UPDATE keeps the claim
        as read until the settlement (a reaper's release waits, then finds it settled).
        """
        conn.execute(
            f"INSERT INTO oncewire_attempts ({ATTEMPT_COLUMNS}) "
            "SELECT e.id, CASE WHEN v.attempt > 0 THEN v.attempt ELSE e.attempts END, e.fence, "
            "  e.lease_owner, e.maybe_sent OR v.redelivery, v.outcome, v.state, v.error, "
            "  v.started_at, v.finished_at "
            "FROM unnest(%s::bigint[], %s::bigint[], %s::int[], %s::boolean[], %s::text[], "
            "            %s::text[], %s::text[], %s::float8[], %s::float8[]) "
            "     AS v(id, fence, attempt, redelivery, outcome, state, error, started_at, "
            "          finished_at) "
            "JOIN oncewire_effects AS e ON e.id = v.id AND e.fence = v.fence "
            "WHERE e.state = 'claimed' "
            "FOR UPDATE OF e "
            "ON CONFLICT (effect_id, fence) DO NOTHING",
            (
                [i.id for i in items],
                [i.fence for i in items],
                [i.attempt for i in items],
                [i.redelivery for i in items],
                [attempt_outcome(i) for i in items],
                [str(i.state) for i in items],
                [i.last_error for i in items],
                [i.started_at for i in items],
                [now if i.finished_at is None else i.finished_at for i in items],
            ),
        )

    def list_attempts(self, effect_id: int) -> list[AttemptRecord]:
        rows = self._read(
            f"SELECT {ATTEMPT_COLUMNS} FROM oncewire_attempts WHERE effect_id = %s ORDER BY fence",
            (effect_id,),
        )
        return [AttemptRecord.from_row(row) for row in rows]

    def _settle_in_tx(self, conn: Any, items: Sequence[Settlement], now: float) -> list[bool]:
        if not items:
            return []
        rows = conn.execute(
            "UPDATE oncewire_effects AS e SET state = v.state, result = v.result, "
            "  last_error = v.last_error, not_before = COALESCE(v.not_before, e.not_before), "
            "  maybe_sent = e.maybe_sent OR v.maybe_sent, lease_owner = NULL, "
            "  attempts = e.attempts - v.refund, "  # a refunded (not-sent) attempt does not count
            # not-sent attempts in a row: a charged attempt ends the run
            "  not_sent = CASE WHEN v.refund = 1 THEN e.not_sent + 1 ELSE 0 END, "
            "  lease_expires_at = NULL, updated_at = %s "
            "FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::text[], %s::text[], "
            "            %s::float8[], %s::boolean[], %s::int[]) "
            "     AS v(id, fence, state, result, last_error, not_before, maybe_sent, refund) "
            "WHERE e.id = v.id AND e.fence = v.fence AND e.state = 'claimed' "
            "RETURNING e.id, v.fence",
            (
                now,
                [i.id for i in items],
                [i.fence for i in items],
                [str(i.state) for i in items],
                [i.result_json for i in items],
                [i.last_error for i in items],
                [i.not_before for i in items],
                [i.maybe_sent for i in items],
                [int(i.refund_attempt) for i in items],
            ),
        ).fetchall()
        applied = {(row[0], row[1]) for row in rows}
        return [(i.id, i.fence) in applied for i in items]

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
        expires = now + lease_seconds
        clause, params = _kind_filter(kinds)
        with self._write("settling and claiming effects") as conn:
            if settlements:
                self._record_attempts_in_tx(conn, settlements, now)
            applied = self._settle_in_tx(conn, settlements, now)
            if limit <= 0:
                return applied, []
            rows = conn.execute(
                "WITH due AS ("
                "  SELECT id FROM oncewire_effects "
                f"  WHERE state IN {_WAITING} AND not_before <= %s "
                f"  AND (deadline IS NULL OR deadline >= %s){clause} "
                "  ORDER BY not_before, id LIMIT %s FOR UPDATE SKIP LOCKED) "
                "UPDATE oncewire_effects AS e SET state = 'claimed', attempts = e.attempts + 1, "
                "  fence = e.fence + 1, lease_owner = %s, lease_expires_at = %s, updated_at = %s "
                "FROM due WHERE e.id = due.id "
                "RETURNING e.id, e.key, e.kind, e.payload, e.attempts, e.max_attempts, e.fence, "
                "  e.maybe_sent, e.deadline, e.not_sent",
                (now, now, *params, limit, owner, expires, now),
            ).fetchall()
        claims = [Claim.from_row(row, expires) for row in rows]
        claims.sort(key=lambda claim: claim.id)
        return applied, claims

    def renew_leases(
        self, owner: str, fences: Sequence[tuple[int, int]], expires_at: float, now: float
    ) -> int:
        if not fences:
            return 0
        with self._write("renewing leases") as conn:
            rows = conn.execute(
                "UPDATE oncewire_effects AS e SET lease_expires_at = %s, updated_at = %s "
                "FROM unnest(%s::bigint[], %s::bigint[]) AS v(id, fence) "
                "WHERE e.id = v.id AND e.fence = v.fence AND e.state = 'claimed' "
                "AND e.lease_owner = %s RETURNING e.id",
                (expires_at, now, [f[0] for f in fences], [f[1] for f in fences], owner),
            ).fetchall()
        return len(rows)

    def lease_holders(self) -> list[str]:
        return [
            row[0]
            for row in self._read(
                "SELECT DISTINCT lease_owner FROM oncewire_effects WHERE state = 'claimed'"
            )
        ]

    def release_claims(self, *, now: float, dead_owners: Sequence[str] = ()) -> int:
        with self._write("releasing claims") as conn:
            # One statement: lock the claims to release (as they are: owner, attempt), release
            # them, and write each one's attempt-history row from both.
            row = conn.execute(
                "WITH old AS ("
                "  SELECT id, attempts, fence, lease_owner, maybe_sent, lease_expires_at "
                "  FROM oncewire_effects WHERE state = 'claimed' "
                "  AND (lease_expires_at < %(now)s OR lease_owner = ANY(%(owners)s)) "
                "  FOR UPDATE), "
                "released AS ("
                "  UPDATE oncewire_effects AS e SET "
                "  state = CASE WHEN e.attempts >= e.max_attempts "
                "               OR (e.deadline IS NOT NULL AND e.deadline < %(now)s) "
                "          THEN 'dead' ELSE 'uncertain' END, "
                "  last_error = CASE "
                "    WHEN e.attempts >= e.max_attempts THEN 'out of attempts (' || e.attempts || "
                "         '); the outcome of the last attempt is unknown' "
                "    WHEN e.deadline IS NOT NULL AND e.deadline < %(now)s THEN "
                "         'deadline passed; the outcome of the last attempt is unknown' "
                "    WHEN e.lease_expires_at < %(now)s THEN 'lease of ' || e.lease_owner || "
                "         ' expired during attempt ' || e.attempts "
                "    ELSE 'owner ' || e.lease_owner || ' died during attempt ' || e.attempts END, "
                "  maybe_sent = TRUE, lease_owner = NULL, lease_expires_at = NULL, "
                # not_before is kept: the effect was due then, so it goes back to the head of
                # the line instead of behind everything accepted while it was claimed.
                "  updated_at = %(now)s "
                "  FROM old WHERE e.id = old.id AND e.fence = old.fence AND e.state = 'claimed' "
                "  RETURNING e.id, e.state, e.last_error), "
                "history AS ("
                f"  INSERT INTO oncewire_attempts ({ATTEMPT_COLUMNS}) "
                "  SELECT old.id, old.attempts, old.fence, old.lease_owner, old.maybe_sent, "
                "    CASE WHEN old.lease_expires_at < %(now)s THEN 'lease_expired' "
                "         ELSE 'owner_died' END, "
                "    released.state, released.last_error, NULL, %(now)s "
                "  FROM released JOIN old ON old.id = released.id "
                "  ON CONFLICT (effect_id, fence) DO NOTHING) "
                "SELECT COUNT(*) FROM released",
                {"now": now, "owners": list(dead_owners)},
            ).fetchone()
            return int(row[0])

    def expire_deadlines(self, now: float) -> int:
        with self._write("expiring deadlines") as conn:
            cursor = conn.execute(
                "UPDATE oncewire_effects SET state = 'dead', updated_at = %s, last_error = "
                "  CASE WHEN maybe_sent THEN 'deadline passed; an earlier attempt may have "
                "landed' ELSE 'deadline passed before delivery' END "
                f"WHERE state IN {_WAITING} AND deadline IS NOT NULL AND deadline < %s",
                (now, now),
            )
            return int(cursor.rowcount)

    def backlog(self, kinds: Sequence[str] | None = None) -> Backlog:
        clause, params = _kind_filter(kinds)
        row = self._read(
            "SELECT MIN(not_before) FILTER (WHERE state IN ('pending', 'uncertain')), "
            "       COUNT(*) FILTER (WHERE state = 'uncertain'), "
            "       COUNT(*) FILTER (WHERE state = 'claimed'), "
            # fence, not attempts: a not-sent attempt gives its charge back but was a claim
            "       COUNT(*) FILTER (WHERE state = 'pending' AND fence > 0) "
            f"FROM oncewire_effects WHERE state IN ('pending', 'uncertain', 'claimed'){clause}",
            params,
        )[0]
        return Backlog(next_due=row[0], uncertain=row[1], claimed=row[2], retrying=row[3])

    def waiting_kinds(self) -> dict[str, tuple[int, float]]:
        rows = self._read(
            "SELECT kind, COUNT(*), MIN(created_at) FROM oncewire_effects "
            "WHERE state IN ('pending', 'uncertain') GROUP BY kind"
        )
        return {kind: (int(count), float(oldest)) for kind, count, oldest in rows}

    def _locked_effect(self, conn: Any, key: str) -> Effect:
        row = conn.execute(
            f"SELECT {_EFFECT_COLUMNS} FROM oncewire_effects WHERE key = %s FOR UPDATE", (key,)
        ).fetchone()
        if row is None:
            raise EffectNotFound(f"no effect with key {key!r}", key=key)
        return _effect(row)

    def cancel_effect(self, key: str, *, now: float, reason: str) -> Effect:
        with self._write("cancelling an effect") as conn:
            effect = self._locked_effect(conn, key)
            effect.check_cancellable()
            in_flight = effect.state is EffectState.CLAIMED
            if in_flight:
                reason += f" (while attempt {effect.attempts} was in flight: it may have landed)"
                conn.execute(
                    f"INSERT INTO oncewire_attempts ({ATTEMPT_COLUMNS}) "
                    "VALUES (%s, %s, %s, %s, %s, 'cancelled', 'cancelled', %s, NULL, %s) "
                    "ON CONFLICT (effect_id, fence) DO NOTHING",
                    cancelled_attempt(effect, reason, now),
                )
            # An attempt in flight may land: a later retry must go out flagged as a redelivery.
            row = conn.execute(
                "UPDATE oncewire_effects SET state = 'cancelled', last_error = %s, "
                "lease_owner = NULL, lease_expires_at = NULL, fence = fence + 1, updated_at = %s, "
                f"maybe_sent = %s WHERE id = %s RETURNING {_EFFECT_COLUMNS}",
                (reason, now, in_flight or effect.maybe_sent, effect.id),
            ).fetchone()
        return _effect(row)

    def retry_effect(self, key: str, *, now: float) -> Effect:
        with self._write("retrying an effect") as conn:
            effect = self._locked_effect(conn, key)
            effect.check_retryable()
            row = conn.execute(
                "UPDATE oncewire_effects SET state = 'pending', attempts = 0, not_sent = 0, "
                "not_before = %s, "
                # A deadline that has passed would kill the retry at once: the operator's retry
                # lifts it. A deadline still ahead stays.
                f"deadline = CASE WHEN deadline < %s THEN NULL ELSE deadline END, "
                f"last_error = NULL, updated_at = %s WHERE id = %s RETURNING {_EFFECT_COLUMNS}",
                (now, now, now, effect.id),
            ).fetchone()
        return _effect(row)

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
        conn = tx.conn
        tx.check_open()  # never write outside the caller's transaction (autocommit)
        with translate_errors("reserving a receipt"):
            inserted = conn.execute(
                "INSERT INTO oncewire_receipts (key, digest, payload, created_at, expires_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (key) DO NOTHING",
                (key, digest, payload_json, now, expires_at),
            ).rowcount
            if inserted:
                return None
            row = conn.execute(
                f"SELECT {_RECEIPT_COLUMNS} FROM oncewire_receipts WHERE key = %s", (key,)
            ).fetchone()
        return _receipt(row)

    def complete_receipt_in_tx(self, tx: Any, *, key: str, result_json: str) -> None:
        tx.check_open()  # never write outside the caller's transaction (autocommit)
        with translate_errors("completing a receipt"):
            tx.conn.execute(
                "UPDATE oncewire_receipts SET result = %s WHERE key = %s", (result_json, key)
            )

    def get_receipt(self, key: str) -> Receipt | None:
        rows = self._read(
            f"SELECT {_RECEIPT_COLUMNS} FROM oncewire_receipts WHERE key = %s", (key,)
        )
        return _receipt(rows[0]) if rows else None

    def list_receipts(self, *, limit: int = 100, after_key: str = "") -> list[Receipt]:
        rows = self._read(
            f"SELECT {_RECEIPT_COLUMNS} FROM oncewire_receipts WHERE key > %s "
            "ORDER BY key LIMIT %s",
            (after_key, limit),
        )
        return [_receipt(row) for row in rows]

    def purge_receipts(self, *, expired_before: float) -> int:
        with self._write("purging receipts") as conn:
            cursor = conn.execute(
                "DELETE FROM oncewire_receipts WHERE expires_at IS NOT NULL AND expires_at < %s",
                (expired_before,),
            )
            return int(cursor.rowcount)


def _unavailable(name: str, verbs: str) -> Callable[..., Any]:
    def method(self: PostgresStore, *args: Any, **kwargs: Any) -> Any:
        raise ConfigurationError(
            f"{verbs}.{name} is not available on the PostgreSQL backend yet; use SQLite for it"
        )

    method.__name__ = name
    return method


def _fill_unavailable(cls: type) -> None:
    """Ledgers not yet ported to PostgreSQL fail loudly, by name, when first used."""
    for name in sorted(getattr(cls, "__abstractmethods__", ())):
        owner = next(base.__name__ for base in cls.__mro__ if name in vars(base))
        setattr(cls, name, _unavailable(name, owner))
    setattr(cls, "__abstractmethods__", frozenset())  # noqa: B010 - what makes it concrete


_fill_unavailable(PostgresStore)
