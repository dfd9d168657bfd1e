"""The run ledger's verbs on PostgreSQL. Mixed into :class:`PostgresStore`.

The same statements as the SQLite verbs, in PostgreSQL's dialect. SQLite's single writer made
every check-then-write path serial; here transactions run concurrently at READ COMMITTED, so a
verb that reads what its caller decides on locks it: a run's row (``FOR UPDATE``) before a
command reads its context, a branch before it is created, forked or reverted, a scope before a
barrier is taken or its cursor is read (advisory locks, see migration 0002). A transaction
takes them in one order, branch, then run rows, then scope, so that waits cannot form a cycle.
The invariants themselves are held by the schema's constraints and triggers, whatever the caller
does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from oncewire.core.errors import RevertBarrierHeld
from oncewire.storage.postgres.connection import psycopg, translate_errors
from oncewire.storage.postgres.run_scopes import PostgresRunScopeVerbs, one
from oncewire.storage.run_rows import (
    ACTION,
    ACTIVE,
    BARRIER,
    EVENT,
    FINDING,
    KEY_PIN,
    PHASE,
    RUN,
    action_values,
    event_row,
    phase_row,
    phase_values,
    run_row,
    run_values,
    used_ids_query,
)
from oncewire.storage.runs import (
    ActionRow,
    BarrierRow,
    CommandContext,
    EventRow,
    FindingRow,
    KeyPinRow,
    PhaseRow,
    RunAppend,
    RunRow,
    RunVerbs,
)

__all__ = ["PostgresRunVerbs"]


def _columns(alias: str, names: str) -> str:
    return ", ".join(f"{alias}.{name.strip()}" for name in names.split(","))


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


# A command's reads in one round trip, once the run's row is locked: the run, its head event,
# the event already stored under the command's key, and the barrier held on its scope.
_CONTEXT = (
    f"SELECT {_columns('r', RUN)}, {_columns('h', EVENT)}, {_columns('p', EVENT)}, "
    f"{_columns('b', BARRIER)} FROM oncewire_runs r "
    "LEFT JOIN oncewire_run_events h ON h.run_id = r.run_id AND h.seq = r.head_seq "
    "LEFT JOIN oncewire_run_events p ON p.run_id = r.run_id AND p.idempotency_key = %s "
    "LEFT JOIN oncewire_run_barriers b ON b.scope = r.scope AND b.state <> 'resolved' "
    "WHERE r.run_id = %s"
)
_INSERT_EVENT = (
    "INSERT INTO oncewire_run_events (run_id, scope, branch, seq, type, idempotency_key, "
    f"request_digest, terminal, payload, prev_hash, hash, at) VALUES ({_marks(12)}) "
    "RETURNING id"
)
_UPDATE_RUN = (
    "UPDATE oncewire_runs SET status = %s, terminal_reason = %s, state = %s, head_seq = %s, "
    "head_hash = %s, owner = %s, fence = %s, lease_expires_at = %s, updated_at = %s, "
    "finished_at = %s WHERE run_id = %s"
)
_INSERT_PHASE = f"INSERT INTO oncewire_run_phases ({PHASE}) VALUES ({_marks(13)})"
_UPSERT_PHASE = (
    f"{_INSERT_PHASE} ON CONFLICT (run_id, phase_id) DO UPDATE SET status = excluded.status, "
    "verdict = excluded.verdict, result = excluded.result, "
    "actions_bound = excluded.actions_bound, closed_seq = excluded.closed_seq, "
    "closed_at = excluded.closed_at"
)
_INSERT_ACTION = f"INSERT INTO oncewire_run_actions ({ACTION}) VALUES ({_marks(13)})"
_UPSERT_ACTION = (
    f"{_INSERT_ACTION} ON CONFLICT (run_id, action_id) DO UPDATE SET status = excluded.status, "
    "result = excluded.result, resolved_seq = excluded.resolved_seq"
)


def _head_current(row: Sequence[Any]) -> bool:
    """Whether a context row's head event is the one its run row points at."""
    head_seq, head_hash, event_seq, event_hash = row[9], row[10], row[25], row[32]
    if row[21] is None:
        return bool(head_seq == 0)
    return bool(event_seq == head_seq and event_hash == head_hash)


@contextmanager
def _pipeline(conn: Any) -> Iterator[None]:
    """Statements sent together, their results read at the end. The first error is the one
    raised (not the pipeline's own abort that follows it)."""
    if not psycopg.Pipeline.is_supported():
        yield
        return
    failed: BaseException | None = None
    try:
        with conn.pipeline():
            try:
                yield
            except psycopg.Error as exc:
                failed = exc
    except psycopg.Error:
        if failed is None:
            raise
    if failed is not None:
        raise failed


@contextmanager
def _barrier_refusal(event: EventRow) -> Iterator[None]:
    """A barrier taken after the command checked for one is refused by the append trigger:
    the caller gets the same typed refusal as when the command saw it first."""
    try:
        yield
    except psycopg.IntegrityError as exc:
        if exc.diag.constraint_name != "oncewire_run_barriers_one_held":
            raise
        raise RevertBarrierHeld(
            f"cannot append to run {event.run_id!r}: a revert barrier took scope "
            f"{event.scope!r} while the command was being decided; it requires recovery first",
            scope=event.scope,
            run_id=event.run_id,
        ) from None


class PostgresRunVerbs(PostgresRunScopeVerbs, RunVerbs):
    """Implements :class:`oncewire.storage.runs.RunVerbs` with PostgresStore's helpers."""

    if TYPE_CHECKING:

        def _conn(self) -> Any: ...
        def _forget(self, conn: Any) -> None: ...
        def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...
        def _write(self, what: str) -> AbstractContextManager[Any]: ...

    # -- runs and their chains ---------------------------------------------------------------
    def insert_run_in_tx(self, tx: Any, row: RunRow) -> bool:
        with translate_errors("starting a run"):
            inserted = tx.conn.execute(
                f"INSERT INTO oncewire_runs ({RUN}) VALUES ({_marks(21)}) ON CONFLICT DO NOTHING",
                run_values(row),
            ).rowcount
        return bool(inserted)

    def get_run_in_tx(self, tx: Any, run_id: str) -> RunRow | None:
        # Locked: what the caller decides on (a renewal's fence, a replay) stays true until
        # it commits.
        with translate_errors("reading a run"):
            row = one(
                tx.conn, f"SELECT {RUN} FROM oncewire_runs WHERE run_id = %s FOR UPDATE", (run_id,)
            )
        return None if row is None else run_row(row)

    def command_context_in_tx(self, tx: Any, run_id: str, key: str) -> CommandContext | None:
        with translate_errors("reading a run"):
            # Read and lock in one statement. If the run changed while this waited for its
            # lock, the joined rows are from before the change (READ COMMITTED rechecks only the
            # locked row): lock it alone, then read the context in a statement of its own.
            row = one(tx.conn, _CONTEXT + " FOR UPDATE OF r", (key, run_id))
            if row is None or not _head_current(row):
                locked = one(
                    tx.conn, "SELECT 1 FROM oncewire_runs WHERE run_id = %s FOR UPDATE", (run_id,)
                )
                row = one(tx.conn, _CONTEXT, (key, run_id)) if locked else None
        if row is None:
            return None
        head, prior, barrier = row[21:34], row[34:47], row[47:53]
        return CommandContext(
            run=run_row(row[:21]),
            head=None if head[0] is None else event_row(head),
            prior=None if prior[0] is None else event_row(prior),
            barrier=None if barrier[0] is None else BarrierRow(*barrier),
        )

    def active_run_on_branch_in_tx(self, tx: Any, scope: str, branch: str) -> RunRow | None:
        with translate_errors("reading a branch's active run"):
            row = one(
                tx.conn,
                f"SELECT {RUN} FROM oncewire_runs WHERE scope = %s AND branch = %s AND {ACTIVE}",
                (scope, branch),
            )
        return None if row is None else run_row(row)

    def event_by_key_in_tx(self, tx: Any, run_id: str, key: str) -> EventRow | None:
        with translate_errors("reading a run event"):
            row = one(
                tx.conn,
                f"SELECT {EVENT} FROM oncewire_run_events "
                "WHERE run_id = %s AND idempotency_key = %s",
                (run_id, key),
            )
        return None if row is None else event_row(row)

    def event_at_in_tx(self, tx: Any, run_id: str, seq: int) -> EventRow | None:
        with translate_errors("reading a run event"):
            row = one(
                tx.conn,
                f"SELECT {EVENT} FROM oncewire_run_events WHERE run_id = %s AND seq = %s",
                (run_id, seq),
            )
        return None if row is None else event_row(row)

    def append_run_event_in_tx(self, tx: Any, change: RunAppend) -> EventRow:
        conn = tx.conn
        e, r = change.event, change.run
        # Every write of the command in one round trip (a pipeline): an error, such as the
        # append trigger's refusal, surfaces when it is synced and aborts the rest.
        with (
            translate_errors("appending a run event"),
            _barrier_refusal(e),
            conn.cursor() as writes,
            conn.cursor() as event,
        ):
            with _pipeline(conn):
                for phase in change.phases:
                    # A phase this event opens is inserted (its id used twice fails loudly);
                    # a later event only fills in how it went on.
                    opens = phase.status == "open" and phase.opened_seq == e.seq
                    writes.execute(_INSERT_PHASE if opens else _UPSERT_PHASE, phase_values(phase))
                event.execute(
                    _INSERT_EVENT,
                    (
                        e.run_id, e.scope, e.branch, e.seq, e.type, e.idempotency_key,
                        e.request_digest, bool(e.terminal), e.payload_json, e.prev_hash, e.hash,
                        e.at,
                    ),
                )  # fmt: skip
                writes.execute(
                    _UPDATE_RUN,
                    (
                        r.status, r.terminal_reason, r.state_json, r.head_seq, r.head_hash,
                        r.owner, r.fence, r.lease_expires_at, r.updated_at, r.finished_at,
                        r.run_id,
                    ),
                )  # fmt: skip
                if change.findings:
                    writes.executemany(
                        f"INSERT INTO oncewire_run_findings ({FINDING}) VALUES ({_marks(6)})",
                        [
                            (f.run_id, f.finding_id, f.phase_id, f.candidate_id, f.severity,
                             f.body_json)
                            for f in change.findings
                        ],
                    )  # fmt: skip
                for action in change.actions:
                    # A proposal is inserted; a resolution only fills in how it ended.
                    proposes = action.proposed_seq == e.seq
                    writes.execute(
                        _INSERT_ACTION if proposes else _UPSERT_ACTION, action_values(action)
                    )
            event_id = int(event.fetchone()[0])
        return EventRow(
            event_id, e.run_id, e.scope, e.branch, e.seq, e.type, e.idempotency_key,
            e.request_digest, e.terminal, e.payload_json, e.prev_hash, e.hash, e.at,
        )  # fmt: skip

    def used_ids_in_tx(
        self,
        tx: Any,
        run_id: str,
        *,
        phases: Sequence[str] = (),
        findings: Sequence[str] = (),
        actions: Sequence[str] = (),
    ) -> list[tuple[str, str, int]]:
        sql, params = used_ids_query("%s", run_id, phases, findings, actions)
        if not sql:
            return []
        with translate_errors("reading a run's ids"):
            rows = tx.conn.execute(sql, params).fetchall()
        return [(str(kind), str(name), int(seq or 0)) for kind, name, seq in rows]

    def update_run_lease_in_tx(
        self,
        tx: Any,
        run_id: str,
        *,
        owner: str | None,
        fence: int,
        lease_expires_at: float | None,
        now: float,
    ) -> None:
        with translate_errors("updating a run's lease"):
            tx.conn.execute(
                "UPDATE oncewire_runs SET owner = %s, fence = %s, lease_expires_at = %s, "
                "updated_at = %s WHERE run_id = %s",
                (owner, fence, lease_expires_at, now, run_id),
            )

    def abandon_run_in_tx(self, tx: Any, run_id: str, *, reason: str, now: float) -> bool:
        with translate_errors("abandoning a run"):
            return bool(
                tx.conn.execute(
                    "UPDATE oncewire_runs SET abandoned_at = %s, abandon_reason = %s, "
                    "lease_expires_at = NULL, updated_at = %s "
                    f"WHERE run_id = %s AND {ACTIVE}",
                    (now, reason, now, run_id),
                ).rowcount
            )

    def set_runs_hidden_in_tx(self, tx: Any, hidden: dict[str, bool]) -> None:
        if not hidden:
            return
        with translate_errors("marking hidden runs"):
            tx.conn.execute(
                "UPDATE oncewire_runs AS r SET hidden = v.hidden "
                "FROM unnest(%s::text[], %s::boolean[]) AS v(run_id, hidden) "
                "WHERE r.run_id = v.run_id",
                (list(hidden), [bool(flag) for flag in hidden.values()]),
            )

    def held_barrier_in_tx(self, tx: Any, scope: str) -> BarrierRow | None:
        with translate_errors("reading barriers"):
            row = one(
                tx.conn,
                f"SELECT {BARRIER} FROM oncewire_run_barriers "
                "WHERE scope = %s AND state <> 'resolved'",
                (scope,),
            )
        return None if row is None else BarrierRow(*row)

    @contextmanager
    def read_snapshot(self) -> Iterator[None]:
        conn = self._conn()
        if conn.info.transaction_status != 0:  # not idle: the caller's transaction reads
            yield
            return
        try:
            with conn.transaction():
                with translate_errors("beginning a read"):
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                yield
        finally:
            if conn.broken:
                self._forget(conn)

    def get_run(self, run_id: str) -> RunRow | None:
        rows = self._read(f"SELECT {RUN} FROM oncewire_runs WHERE run_id = %s", (run_id,))
        return run_row(rows[0]) if rows else None

    def run_key_pin(self, run_id: str) -> KeyPinRow | None:
        rows = self._read(
            f"SELECT {KEY_PIN} FROM oncewire_run_key_pins WHERE run_id = %s", (run_id,)
        )
        return KeyPinRow(*rows[0]) if rows else None

    def unpinned_keyless_runs_in_tx(self, tx: Any) -> list[RunRow]:
        with translate_errors("reading keyless runs"):
            # Adopters take turns (the mode conflicts with itself, not with readers), and the
            # query below is a statement of its own, so a second adopter sees the first one's
            # pins instead of pinning the same runs again and failing on the primary key.
            tx.conn.execute("LOCK TABLE oncewire_run_key_pins IN SHARE ROW EXCLUSIVE MODE")
            rows = tx.conn.execute(
                f"SELECT {RUN} FROM oncewire_runs r WHERE chain = 'sha256' AND NOT EXISTS "
                "(SELECT 1 FROM oncewire_run_key_pins p WHERE p.run_id = r.run_id) "
                "ORDER BY run_id FOR UPDATE"
            ).fetchall()
        return [run_row(row) for row in rows]

    def insert_key_pins_in_tx(self, tx: Any, rows: Sequence[KeyPinRow]) -> None:
        if not rows:
            return
        with translate_errors("pinning keyless runs"):
            tx.conn.cursor().executemany(
                f"INSERT INTO oncewire_run_key_pins ({KEY_PIN}) VALUES ({_marks(6)})",
                [(p.run_id, p.key_id, p.head_seq, p.head_hash, p.mac, p.created_at) for p in rows],
            )

    def list_runs(
        self,
        *,
        scope: str | None = None,
        statuses: Sequence[str] = (),
        limit: int = 100,
        after_run_id: str = "",
    ) -> list[RunRow]:
        where, params = ["run_id > %s"], [after_run_id]
        if scope is not None:
            where.append("scope = %s")
            params.append(scope)
        if statuses:
            where.append("status = ANY(%s)")
            params.append(list(statuses))  # type: ignore[arg-type]
        rows = self._read(
            f"SELECT {RUN} FROM oncewire_runs WHERE {' AND '.join(where)} ORDER BY run_id LIMIT %s",
            (*params, limit),
        )
        return [run_row(row) for row in rows]

    def run_events(self, run_id: str) -> list[EventRow]:
        rows = self._read(
            f"SELECT {EVENT} FROM oncewire_run_events WHERE run_id = %s ORDER BY seq, id",
            (run_id,),
        )
        return [event_row(row) for row in rows]

    def run_chain(
        self, run_id: str, *, after_seq: int = 0
    ) -> list[tuple[int, int, str, str, str, str]]:
        return self._read(
            "SELECT id, seq, type, prev_hash, hash, payload FROM oncewire_run_events "
            "WHERE run_id = %s AND seq > %s ORDER BY seq, id",
            (run_id, after_seq),
        )

    def orphan_event_runs(self) -> list[tuple[str, int]]:
        rows = self._read(
            "SELECT e.run_id, COUNT(*) FROM oncewire_run_events e WHERE NOT EXISTS "
            "(SELECT 1 FROM oncewire_runs r WHERE r.run_id = e.run_id) "
            "GROUP BY e.run_id ORDER BY e.run_id"
        )
        return [(str(run_id), int(n)) for run_id, n in rows]

    def run_projections(
        self, run_id: str
    ) -> tuple[list[PhaseRow], list[FindingRow], list[ActionRow]]:
        statements = (
            f"SELECT {PHASE} FROM oncewire_run_phases WHERE run_id = %s ORDER BY opened_seq",
            f"SELECT {FINDING} FROM oncewire_run_findings WHERE run_id = %s ORDER BY finding_id",
            f"SELECT {ACTION} FROM oncewire_run_actions WHERE run_id = %s ORDER BY proposed_seq",
        )
        conn = self._conn()

        def read() -> list[list[Any]]:
            # The three reads in one round trip.
            with conn.cursor() as c1, conn.cursor() as c2, conn.cursor() as c3:
                cursors = (c1, c2, c3)
                with _pipeline(conn):
                    for cursor, sql in zip(cursors, statements, strict=True):
                        cursor.execute(sql, (run_id,))
                return [cursor.fetchall() for cursor in cursors]

        try:
            with translate_errors("reading a run's projections"):
                if conn.info.transaction_status == 0:  # idle: one snapshot for the three reads
                    with conn.transaction():
                        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                        phases, findings, actions = read()
                else:
                    phases, findings, actions = read()
        finally:
            if conn.broken:
                self._forget(conn)
        return (
            [phase_row(r) for r in phases],
            [FindingRow(*r) for r in findings],
            [ActionRow(*r) for r in actions],
        )

    def expired_runs(
        self, *, now: float, limit: int, dead_owners: Sequence[str] = ()
    ) -> list[RunRow]:
        rows = self._read(
            f"SELECT {RUN} FROM oncewire_runs WHERE {ACTIVE} "
            "AND (lease_expires_at IS NULL OR lease_expires_at < %s OR owner = ANY(%s)) "
            "ORDER BY created_at, run_id LIMIT %s",
            (now, list(dead_owners), limit),
        )
        return [run_row(row) for row in rows]

    def active_run_owners(self) -> list[str]:
        rows = self._read(
            f"SELECT DISTINCT owner FROM oncewire_runs WHERE {ACTIVE} AND owner IS NOT NULL"
        )
        return [str(row[0]) for row in rows]

    def branch_runs_in_tx(self, tx: Any, scope: str, branch: str) -> list[RunRow]:
        # Locked, in one order: a revert decides which of them it abandons and hides.
        with translate_errors("reading a branch's runs"):
            rows = tx.conn.execute(
                f"SELECT {RUN} FROM oncewire_runs WHERE scope = %s AND branch = %s "
                "ORDER BY run_id FOR UPDATE",
                (scope, branch),
            ).fetchall()
        return [run_row(row) for row in rows]
