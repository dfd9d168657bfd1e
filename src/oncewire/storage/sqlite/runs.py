"""The run ledger's verbs on SQLite. Mixed into :class:`SQLiteStore`."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

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
)
from oncewire.storage.sqlite.connection import translate_errors
from oncewire.storage.sqlite.run_rows import (
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
    marks,
    one,
    phase_row,
    phase_values,
    run_row,
    run_values,
    used_ids_query,
)
from oncewire.storage.sqlite.run_scopes import SQLiteRunScopeVerbs

__all__ = ["SQLiteRunVerbs"]


def _columns(alias: str, names: str) -> str:
    return ", ".join(f"{alias}.{name.strip()}" for name in names.split(","))


# A command's reads in one round trip: the run, its head event, the event already stored under
# the command's key, and the barrier held on its scope.
_CONTEXT = (
    f"SELECT {_columns('r', RUN)}, {_columns('h', EVENT)}, {_columns('p', EVENT)}, "
    f"{_columns('b', BARRIER)} FROM oncewire_runs r "
    "LEFT JOIN oncewire_run_events h ON h.run_id = r.run_id AND h.seq = r.head_seq "
    "LEFT JOIN oncewire_run_events p ON p.run_id = r.run_id AND p.idempotency_key = ? "
    "LEFT JOIN oncewire_run_barriers b ON b.scope = r.scope AND b.state != 'resolved' "
    "WHERE r.run_id = ?"
)

_INSERT_PHASE = f"INSERT INTO oncewire_run_phases ({PHASE}) VALUES ({marks(13)})"
_UPSERT_PHASE = (
    f"{_INSERT_PHASE} ON CONFLICT (run_id, phase_id) DO UPDATE SET status = excluded.status, "
    "verdict = excluded.verdict, result = excluded.result, "
    "actions_bound = excluded.actions_bound, closed_seq = excluded.closed_seq, "
    "closed_at = excluded.closed_at"
)
_INSERT_ACTION = f"INSERT INTO oncewire_run_actions ({ACTION}) VALUES ({marks(13)})"
_UPSERT_ACTION = (
    f"{_INSERT_ACTION} ON CONFLICT (run_id, action_id) DO UPDATE SET status = excluded.status, "
    "result = excluded.result, resolved_seq = excluded.resolved_seq"
)


class SQLiteRunVerbs(SQLiteRunScopeVerbs):
    """Implements :class:`oncewire.storage.runs.RunVerbs` with SQLiteStore's helpers."""

    if TYPE_CHECKING:

        def _conn(self) -> sqlite3.Connection: ...
        def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...
        def _write(self, what: str) -> AbstractContextManager[sqlite3.Connection]: ...

    # -- runs and their chains ---------------------------------------------------------------
    def insert_run_in_tx(self, tx: Any, row: RunRow) -> bool:
        with translate_errors("starting a run"):
            inserted = tx.conn.execute(
                f"INSERT INTO oncewire_runs ({RUN}) VALUES ({marks(21)}) ON CONFLICT DO NOTHING",
                run_values(row),
            ).rowcount
        return bool(inserted)

    def get_run_in_tx(self, tx: Any, run_id: str) -> RunRow | None:
        with translate_errors("reading a run"):
            row = one(tx.conn, f"SELECT {RUN} FROM oncewire_runs WHERE run_id = ?", (run_id,))
        return None if row is None else run_row(row)

    def command_context_in_tx(self, tx: Any, run_id: str, key: str) -> CommandContext | None:
        with translate_errors("reading a run"):
            row = one(tx.conn, _CONTEXT, (key, run_id))
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
                f"SELECT {RUN} FROM oncewire_runs WHERE scope = ? AND branch = ? AND {ACTIVE}",
                (scope, branch),
            )
        return None if row is None else run_row(row)

    def event_by_key_in_tx(self, tx: Any, run_id: str, key: str) -> EventRow | None:
        with translate_errors("reading a run event"):
            row = one(
                tx.conn,
                f"SELECT {EVENT} FROM oncewire_run_events WHERE run_id = ? AND idempotency_key = ?",
                (run_id, key),
            )
        return None if row is None else event_row(row)

    def event_at_in_tx(self, tx: Any, run_id: str, seq: int) -> EventRow | None:
        with translate_errors("reading a run event"):
            row = one(
                tx.conn,
                f"SELECT {EVENT} FROM oncewire_run_events WHERE run_id = ? AND seq = ?",
                (run_id, seq),
            )
        return None if row is None else event_row(row)

    def append_run_event_in_tx(self, tx: Any, change: RunAppend) -> EventRow:
        conn: sqlite3.Connection = tx.conn
        e, r = change.event, change.run
        with translate_errors("appending a run event"):
            for phase in change.phases:
                # A phase this event opens is inserted (its id used twice fails loudly); a
                # later event only fills in how it went on.
                opens = phase.status == "open" and phase.opened_seq == e.seq
                conn.execute(_INSERT_PHASE if opens else _UPSERT_PHASE, phase_values(phase))
            cursor = conn.execute(
                "INSERT INTO oncewire_run_events (run_id, scope, branch, seq, type, "
                "idempotency_key, request_digest, terminal, payload, prev_hash, hash, at) "
                f"VALUES ({marks(12)})",
                (
                    e.run_id,
                    e.scope,
                    e.branch,
                    e.seq,
                    e.type,
                    e.idempotency_key,
                    e.request_digest,
                    int(e.terminal),
                    e.payload_json,
                    e.prev_hash,
                    e.hash,
                    e.at,
                ),
            )
            event_id = int(cursor.lastrowid or 0)
            conn.execute(
                "UPDATE oncewire_runs SET status = ?, terminal_reason = ?, state = ?, "
                "head_seq = ?, head_hash = ?, owner = ?, fence = ?, lease_expires_at = ?, "
                "updated_at = ?, finished_at = ? WHERE run_id = ?",
                (
                    r.status,
                    r.terminal_reason,
                    r.state_json,
                    r.head_seq,
                    r.head_hash,
                    r.owner,
                    r.fence,
                    r.lease_expires_at,
                    r.updated_at,
                    r.finished_at,
                    r.run_id,
                ),
            )
            if change.findings:
                conn.executemany(
                    f"INSERT INTO oncewire_run_findings ({FINDING}) VALUES ({marks(6)})",
                    [
                        (
                            f.run_id,
                            f.finding_id,
                            f.phase_id,
                            f.candidate_id,
                            f.severity,
                            f.body_json,
                        )
                        for f in change.findings
                    ],
                )
            for action in change.actions:
                # A proposal is inserted; a resolution only fills in how it ended.
                proposes = action.proposed_seq == e.seq
                conn.execute(_INSERT_ACTION if proposes else _UPSERT_ACTION, action_values(action))
        return EventRow(
            event_id,
            e.run_id,
            e.scope,
            e.branch,
            e.seq,
            e.type,
            e.idempotency_key,
            e.request_digest,
            e.terminal,
            e.payload_json,
            e.prev_hash,
            e.hash,
            e.at,
        )

    def used_ids_in_tx(
        self,
        tx: Any,
        run_id: str,
        *,
        phases: Sequence[str] = (),
        findings: Sequence[str] = (),
        actions: Sequence[str] = (),
    ) -> list[tuple[str, str, int]]:
        sql, params = used_ids_query("?", run_id, phases, findings, actions)
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
                "UPDATE oncewire_runs SET owner = ?, fence = ?, lease_expires_at = ?, "
                "updated_at = ? WHERE run_id = ?",
                (owner, fence, lease_expires_at, now, run_id),
            )

    def abandon_run_in_tx(self, tx: Any, run_id: str, *, reason: str, now: float) -> bool:
        with translate_errors("abandoning a run"):
            return bool(
                tx.conn.execute(
                    "UPDATE oncewire_runs SET abandoned_at = ?, abandon_reason = ?, "
                    "lease_expires_at = NULL, updated_at = ? "
                    f"WHERE run_id = ? AND {ACTIVE}",
                    (now, reason, now, run_id),
                ).rowcount
            )

    def set_runs_hidden_in_tx(self, tx: Any, hidden: dict[str, bool]) -> None:
        with translate_errors("marking hidden runs"):
            tx.conn.executemany(
                "UPDATE oncewire_runs SET hidden = ? WHERE run_id = ?",
                [(int(flag), run_id) for run_id, flag in hidden.items()],
            )

    def held_barrier_in_tx(self, tx: Any, scope: str) -> BarrierRow | None:
        with translate_errors("reading barriers"):
            row = one(
                tx.conn,
                f"SELECT {BARRIER} FROM oncewire_run_barriers "
                "WHERE scope = ? AND state != 'resolved'",
                (scope,),
            )
        return None if row is None else BarrierRow(*row)

    @contextmanager
    def read_snapshot(self) -> Iterator[None]:
        conn = self._conn()
        if conn.in_transaction:
            yield  # the caller's transaction is the snapshot
            return
        with translate_errors("beginning a read"):
            # Deferred: in WAL mode the first read fixes the snapshot; no lock is taken
            # against writers.
            conn.execute("BEGIN")
        try:
            yield
        finally:
            if conn.in_transaction:
                with translate_errors("ending a read"):
                    conn.execute("ROLLBACK")

    def get_run(self, run_id: str) -> RunRow | None:
        rows = self._read(f"SELECT {RUN} FROM oncewire_runs WHERE run_id = ?", (run_id,))
        return run_row(rows[0]) if rows else None

    def run_key_pin(self, run_id: str) -> KeyPinRow | None:
        rows = self._read(
            f"SELECT {KEY_PIN} FROM oncewire_run_key_pins WHERE run_id = ?", (run_id,)
        )
        return KeyPinRow(*rows[0]) if rows else None

    def unpinned_keyless_runs_in_tx(self, tx: Any) -> list[RunRow]:
        with translate_errors("reading keyless runs"):
            rows = tx.conn.execute(
                f"SELECT {RUN} FROM oncewire_runs r WHERE chain = 'sha256' AND NOT EXISTS "
                "(SELECT 1 FROM oncewire_run_key_pins p WHERE p.run_id = r.run_id) "
                "ORDER BY run_id"
            ).fetchall()
        return [run_row(row) for row in rows]

    def insert_key_pins_in_tx(self, tx: Any, rows: Sequence[KeyPinRow]) -> None:
        if not rows:
            return
        with translate_errors("pinning keyless runs"):
            tx.conn.cursor().executemany(
                f"INSERT INTO oncewire_run_key_pins ({KEY_PIN}) VALUES ({marks(6)})",
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
        where, params = ["run_id > ?"], [after_run_id]
        if scope is not None:
            where.append("scope = ?")
            params.append(scope)
        if statuses:
            where.append(f"status IN ({marks(len(statuses))})")
            params.extend(statuses)
        rows = self._read(
            f"SELECT {RUN} FROM oncewire_runs WHERE {' AND '.join(where)} ORDER BY run_id LIMIT ?",
            (*params, limit),
        )
        return [run_row(row) for row in rows]

    def run_events(self, run_id: str) -> list[EventRow]:
        rows = self._read(
            f"SELECT {EVENT} FROM oncewire_run_events WHERE run_id = ? ORDER BY seq, id",
            (run_id,),
        )
        return [event_row(row) for row in rows]

    def run_chain(
        self, run_id: str, *, after_seq: int = 0
    ) -> list[tuple[int, int, str, str, str, str]]:
        return self._read(
            "SELECT id, seq, type, prev_hash, hash, payload FROM oncewire_run_events "
            "WHERE run_id = ? AND seq > ? ORDER BY seq, id",
            (run_id, after_seq),
        )

    def orphan_event_runs(self) -> list[tuple[str, int]]:
        rows = self._read(
            "SELECT run_id, COUNT(*) FROM oncewire_run_events WHERE run_id NOT IN "
            "(SELECT run_id FROM oncewire_runs) GROUP BY run_id ORDER BY run_id"
        )
        return [(str(run_id), int(n)) for run_id, n in rows]

    def run_projections(
        self, run_id: str
    ) -> tuple[list[PhaseRow], list[FindingRow], list[ActionRow]]:
        with translate_errors("reading a run's projections"):
            conn = self._conn()
            began = not conn.in_transaction
            if began:
                conn.execute("BEGIN")  # one snapshot for the three reads
            try:
                phases = conn.execute(
                    f"SELECT {PHASE} FROM oncewire_run_phases WHERE run_id = ? ORDER BY opened_seq",
                    (run_id,),
                ).fetchall()
                findings = conn.execute(
                    f"SELECT {FINDING} FROM oncewire_run_findings WHERE run_id = ? "
                    "ORDER BY finding_id",
                    (run_id,),
                ).fetchall()
                actions = conn.execute(
                    f"SELECT {ACTION} FROM oncewire_run_actions WHERE run_id = ? "
                    "ORDER BY proposed_seq",
                    (run_id,),
                ).fetchall()
            finally:
                if began:
                    conn.execute("COMMIT")
        return (
            [phase_row(r) for r in phases],
            [FindingRow(*r) for r in findings],
            [ActionRow(*r) for r in actions],
        )

    def expired_runs(
        self, *, now: float, limit: int, dead_owners: Sequence[str] = ()
    ) -> list[RunRow]:
        owners = list(dead_owners)
        owner_clause = f" OR owner IN ({marks(len(owners))})" if owners else ""
        rows = self._read(
            f"SELECT {RUN} FROM oncewire_runs WHERE {ACTIVE} "
            f"AND (lease_expires_at IS NULL OR lease_expires_at < ?{owner_clause}) "
            "ORDER BY created_at, run_id LIMIT ?",
            (now, *owners, limit),
        )
        return [run_row(row) for row in rows]

    def active_run_owners(self) -> list[str]:
        rows = self._read(
            f"SELECT DISTINCT owner FROM oncewire_runs WHERE {ACTIVE} AND owner IS NOT NULL"
        )
        return [str(row[0]) for row in rows]

    def branch_runs_in_tx(self, tx: Any, scope: str, branch: str) -> list[RunRow]:
        with translate_errors("reading a branch's runs"):
            rows = tx.conn.execute(
                f"SELECT {RUN} FROM oncewire_runs WHERE scope = ? AND branch = ? ORDER BY run_id",
                (scope, branch),
            ).fetchall()
        return [run_row(row) for row in rows]
