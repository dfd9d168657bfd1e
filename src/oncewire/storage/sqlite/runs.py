"""The run ledger's verbs on SQLite. Mixed into :class:`SQLiteStore`."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from oncewire.storage.runs import (
    ActionRow,
    BarrierRow,
    BranchRow,
    CheckpointRow,
    CommandContext,
    DeliveryRow,
    EventRow,
    FindingRow,
    PhaseRow,
    ReportRow,
    RunAppend,
    RunRow,
)
from oncewire.storage.sqlite.connection import translate_errors

__all__ = ["SQLiteRunVerbs"]

_RUN = (
    "run_id, scope, branch, turn, workflow, chain, status, terminal_reason, state, head_seq, "
    "head_hash, owner, fence, lease_expires_at, created_at, updated_at, finished_at, "
    "abandoned_at, abandon_reason, hidden"
)
_EVENT = (
    "id, run_id, scope, branch, seq, type, idempotency_key, request_digest, terminal, payload, "
    "prev_hash, hash, at"
)
_PHASE = (
    "run_id, phase_id, kind, status, verdict, candidate_id, body, result, actions_bound, "
    "opened_seq, closed_seq, opened_at, closed_at"
)
_FINDING = "run_id, finding_id, phase_id, candidate_id, severity, body"
_ACTION = (
    "run_id, action_id, phase_id, kind, arguments, arguments_digest, side_effect_class, "
    "resource_keys, effect_key, status, result, proposed_seq, resolved_seq"
)
_BRANCH = "scope, branch, parent, view, created_at"
_CHECKPOINT = "checkpoint_id, scope, branch, cursor, view, reason, metadata, created_at"
_BARRIER = "scope, operation_id, branch, state, created_at, updated_at"
_DELIVERY = (
    "delivery_id, idempotency_key, request_digest, scope, branch, turn, run_id, content, "
    "content_sha256, manifest, manifest_sha256, review_status, status, recovery, owner, "
    "lease_expires_at, created_at, published_at"
)
_REPORT = (
    "id, pass_id, subject, subject_id, run_id, owner, outcome, status, reason, error, created_at"
)
_ACTIVE = "finished_at IS NULL AND abandoned_at IS NULL"


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _run(row: Sequence[Any]) -> RunRow:
    return RunRow(*[*row[:19], bool(row[19])])


def _event(row: Sequence[Any]) -> EventRow:
    return EventRow(*[*row[:8], bool(row[8]), *row[9:]])


def _phase(row: Sequence[Any]) -> PhaseRow:
    return PhaseRow(*[*row[:8], bool(row[8]), *row[9:]])


def _run_values(r: RunRow) -> tuple[Any, ...]:
    return (
        r.run_id,
        r.scope,
        r.branch,
        r.turn,
        r.workflow,
        r.chain,
        r.status,
        r.terminal_reason,
        r.state_json,
        r.head_seq,
        r.head_hash,
        r.owner,
        r.fence,
        r.lease_expires_at,
        r.created_at,
        r.updated_at,
        r.finished_at,
        r.abandoned_at,
        r.abandon_reason,
        int(r.hidden),
    )


def _phase_values(p: PhaseRow) -> tuple[Any, ...]:
    return (
        p.run_id,
        p.phase_id,
        p.kind,
        p.status,
        p.verdict,
        p.candidate_id,
        p.body_json,
        p.result_json,
        int(p.actions_bound),
        p.opened_seq,
        p.closed_seq,
        p.opened_at,
        p.closed_at,
    )


def _action_values(a: ActionRow) -> tuple[Any, ...]:
    return (
        a.run_id,
        a.action_id,
        a.phase_id,
        a.kind,
        a.arguments_json,
        a.arguments_digest,
        a.side_effect_class,
        a.resource_keys_json,
        a.effect_key,
        a.status,
        a.result_json,
        a.proposed_seq,
        a.resolved_seq,
    )


def _delivery_values(d: DeliveryRow) -> tuple[Any, ...]:
    return (
        d.delivery_id,
        d.idempotency_key,
        d.request_digest,
        d.scope,
        d.branch,
        d.turn,
        d.run_id,
        d.content,
        d.content_sha256,
        d.manifest_json,
        d.manifest_sha256,
        d.review_status,
        d.status,
        d.recovery_json,
        d.owner,
        d.lease_expires_at,
        d.created_at,
        d.published_at,
    )


def _one(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> Any:
    rows = conn.execute(sql, params).fetchall()
    return rows[0] if rows else None


class SQLiteRunVerbs:
    """Implements :class:`oncewire.storage.runs.RunVerbs` with SQLiteStore's helpers."""

    if TYPE_CHECKING:

        def _conn(self) -> sqlite3.Connection: ...
        def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...
        def _write(self, what: str) -> AbstractContextManager[sqlite3.Connection]: ...

    # -- runs and their chains ---------------------------------------------------------------
    def insert_run_in_tx(self, tx: Any, row: RunRow) -> bool:
        with translate_errors("starting a run"):
            inserted = tx.conn.execute(
                f"INSERT INTO oncewire_runs ({_RUN}) VALUES ({_marks(20)}) ON CONFLICT DO NOTHING",
                _run_values(row),
            ).rowcount
        return bool(inserted)

    def get_run_in_tx(self, tx: Any, run_id: str) -> RunRow | None:
        with translate_errors("reading a run"):
            row = _one(tx.conn, f"SELECT {_RUN} FROM oncewire_runs WHERE run_id = ?", (run_id,))
        return None if row is None else _run(row)

    def command_context_in_tx(self, tx: Any, run_id: str, key: str) -> CommandContext | None:
        def cols(alias: str, names: str) -> str:
            return ", ".join(f"{alias}.{name.strip()}" for name in names.split(","))

        with translate_errors("reading a run"):
            row = _one(
                tx.conn,
                f"SELECT {cols('r', _RUN)}, {cols('h', _EVENT)}, {cols('p', _EVENT)}, "
                f"{cols('b', _BARRIER)} FROM oncewire_runs r "
                "LEFT JOIN oncewire_run_events h ON h.run_id = r.run_id AND h.seq = r.head_seq "
                "LEFT JOIN oncewire_run_events p ON p.run_id = r.run_id "
                "  AND p.idempotency_key = ? "
                "LEFT JOIN oncewire_run_barriers b ON b.scope = r.scope AND b.state != 'resolved' "
                "WHERE r.run_id = ?",
                (key, run_id),
            )
        if row is None:
            return None
        head, prior, barrier = row[20:33], row[33:46], row[46:52]
        return CommandContext(
            run=_run(row[:20]),
            head=None if head[0] is None else _event(head),
            prior=None if prior[0] is None else _event(prior),
            barrier=None if barrier[0] is None else BarrierRow(*barrier),
        )

    def active_run_on_branch_in_tx(self, tx: Any, scope: str, branch: str) -> RunRow | None:
        with translate_errors("reading a branch's active run"):
            row = _one(
                tx.conn,
                f"SELECT {_RUN} FROM oncewire_runs WHERE scope = ? AND branch = ? AND {_ACTIVE}",
                (scope, branch),
            )
        return None if row is None else _run(row)

    def event_by_key_in_tx(self, tx: Any, run_id: str, key: str) -> EventRow | None:
        with translate_errors("reading a run event"):
            row = _one(
                tx.conn,
                f"SELECT {_EVENT} FROM oncewire_run_events "
                "WHERE run_id = ? AND idempotency_key = ?",
                (run_id, key),
            )
        return None if row is None else _event(row)

    def event_at_in_tx(self, tx: Any, run_id: str, seq: int) -> EventRow | None:
        with translate_errors("reading a run event"):
            row = _one(
                tx.conn,
                f"SELECT {_EVENT} FROM oncewire_run_events WHERE run_id = ? AND seq = ?",
                (run_id, seq),
            )
        return None if row is None else _event(row)

    def append_run_event_in_tx(self, tx: Any, change: RunAppend) -> EventRow:
        conn: sqlite3.Connection = tx.conn
        e, r = change.event, change.run
        with translate_errors("appending a run event"):
            for phase in change.phases:
                conn.execute(
                    f"INSERT OR REPLACE INTO oncewire_run_phases ({_PHASE}) VALUES ({_marks(13)})",
                    _phase_values(phase),
                )
            cursor = conn.execute(
                "INSERT INTO oncewire_run_events (run_id, scope, branch, seq, type, "
                "idempotency_key, request_digest, terminal, payload, prev_hash, hash, at) "
                f"VALUES ({_marks(12)})",
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
                    f"INSERT INTO oncewire_run_findings ({_FINDING}) VALUES ({_marks(6)})",
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
                # A resolution only fills in how the proposed action ended.
                conn.execute(
                    f"INSERT INTO oncewire_run_actions ({_ACTION}) VALUES ({_marks(13)}) "
                    "ON CONFLICT (run_id, action_id) DO UPDATE SET status = excluded.status, "
                    "result = excluded.result, resolved_seq = excluded.resolved_seq",
                    _action_values(action),
                )
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
                    f"WHERE run_id = ? AND {_ACTIVE}",
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
            row = _one(
                tx.conn,
                f"SELECT {_BARRIER} FROM oncewire_run_barriers "
                "WHERE scope = ? AND state != 'resolved'",
                (scope,),
            )
        return None if row is None else BarrierRow(*row)

    def actions_in_tx(self, tx: Any, run_id: str) -> list[ActionRow]:
        with translate_errors("reading actions"):
            rows = tx.conn.execute(
                f"SELECT {_ACTION} FROM oncewire_run_actions WHERE run_id = ? "
                "ORDER BY proposed_seq",
                (run_id,),
            ).fetchall()
        return [ActionRow(*row) for row in rows]

    def get_run(self, run_id: str) -> RunRow | None:
        rows = self._read(f"SELECT {_RUN} FROM oncewire_runs WHERE run_id = ?", (run_id,))
        return _run(rows[0]) if rows else None

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
            where.append(f"status IN ({_marks(len(statuses))})")
            params.extend(statuses)
        rows = self._read(
            f"SELECT {_RUN} FROM oncewire_runs WHERE {' AND '.join(where)} ORDER BY run_id LIMIT ?",
            (*params, limit),
        )
        return [_run(row) for row in rows]

    def run_events(self, run_id: str) -> list[EventRow]:
        rows = self._read(
            f"SELECT {_EVENT} FROM oncewire_run_events WHERE run_id = ? ORDER BY seq, id",
            (run_id,),
        )
        return [_event(row) for row in rows]

    def run_chain(
        self, run_id: str, *, after_seq: int = 0
    ) -> list[tuple[int, int, str, str, str, str]]:
        return self._read(
            "SELECT id, seq, type, prev_hash, hash, payload FROM oncewire_run_events "
            "WHERE run_id = ? AND seq > ? ORDER BY seq, id",
            (run_id, after_seq),
        )

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
                    f"SELECT {_PHASE} FROM oncewire_run_phases WHERE run_id = ? "
                    "ORDER BY opened_seq",
                    (run_id,),
                ).fetchall()
                findings = conn.execute(
                    f"SELECT {_FINDING} FROM oncewire_run_findings WHERE run_id = ? "
                    "ORDER BY finding_id",
                    (run_id,),
                ).fetchall()
                actions = conn.execute(
                    f"SELECT {_ACTION} FROM oncewire_run_actions WHERE run_id = ? "
                    "ORDER BY proposed_seq",
                    (run_id,),
                ).fetchall()
            finally:
                if began:
                    conn.execute("COMMIT")
        return (
            [_phase(r) for r in phases],
            [FindingRow(*r) for r in findings],
            [ActionRow(*r) for r in actions],
        )

    def expired_runs(self, *, now: float, limit: int) -> list[RunRow]:
        rows = self._read(
            f"SELECT {_RUN} FROM oncewire_runs WHERE {_ACTIVE} "
            "AND (lease_expires_at IS NULL OR lease_expires_at < ?) "
            "ORDER BY created_at, run_id LIMIT ?",
            (now, limit),
        )
        return [_run(row) for row in rows]

    def branch_runs_in_tx(self, tx: Any, scope: str, branch: str) -> list[RunRow]:
        with translate_errors("reading a branch's runs"):
            rows = tx.conn.execute(
                f"SELECT {_RUN} FROM oncewire_runs WHERE scope = ? AND branch = ? ORDER BY run_id",
                (scope, branch),
            ).fetchall()
        return [_run(row) for row in rows]

    # -- branches, checkpoints, barriers -----------------------------------------------------
    def get_branch_in_tx(self, tx: Any, scope: str, branch: str) -> BranchRow | None:
        with translate_errors("reading a branch"):
            row = _one(
                tx.conn,
                f"SELECT {_BRANCH} FROM oncewire_run_branches WHERE scope = ? AND branch = ?",
                (scope, branch),
            )
        return None if row is None else BranchRow(*row)

    def put_branch_in_tx(self, tx: Any, row: BranchRow) -> None:
        with translate_errors("writing a branch"):
            tx.conn.execute(
                f"INSERT INTO oncewire_run_branches ({_BRANCH}) VALUES ({_marks(5)}) "
                "ON CONFLICT (scope, branch) DO UPDATE SET view = excluded.view",
                (row.scope, row.branch, row.parent, row.view_json, row.created_at),
            )

    def get_branch(self, scope: str, branch: str) -> BranchRow | None:
        rows = self._read(
            f"SELECT {_BRANCH} FROM oncewire_run_branches WHERE scope = ? AND branch = ?",
            (scope, branch),
        )
        return BranchRow(*rows[0]) if rows else None

    def insert_checkpoint_in_tx(self, tx: Any, row: CheckpointRow) -> bool:
        with translate_errors("writing a checkpoint"):
            return bool(
                tx.conn.execute(
                    f"INSERT INTO oncewire_run_checkpoints ({_CHECKPOINT}) VALUES ({_marks(8)}) "
                    "ON CONFLICT DO NOTHING",
                    (
                        row.checkpoint_id,
                        row.scope,
                        row.branch,
                        row.cursor,
                        row.view_json,
                        row.reason,
                        row.metadata_json,
                        row.created_at,
                    ),
                ).rowcount
            )

    def get_checkpoint_in_tx(self, tx: Any, checkpoint_id: str) -> CheckpointRow | None:
        with translate_errors("reading a checkpoint"):
            row = _one(
                tx.conn,
                f"SELECT {_CHECKPOINT} FROM oncewire_run_checkpoints WHERE checkpoint_id = ?",
                (checkpoint_id,),
            )
        return None if row is None else CheckpointRow(*row)

    def scope_cursor_in_tx(self, tx: Any, scope: str) -> int:
        with translate_errors("reading a cursor"):
            row = _one(tx.conn, "SELECT MAX(id) FROM oncewire_run_events WHERE scope = ?", (scope,))
        return int(row[0] or 0)

    def max_cursor_in_tx(self, tx: Any) -> int:
        with translate_errors("reading a cursor"):
            row = _one(tx.conn, "SELECT MAX(id) FROM oncewire_run_events", ())
        return int(row[0] or 0)

    def latest_event_in_view(
        self, scope: str, segments: Sequence[tuple[str, int, int | None]], upto: int | None
    ) -> EventRow | None:
        best: Any = None
        for branch, after, until in segments:
            limit = until if until is not None else upto
            if upto is not None and limit is not None:
                limit = min(limit, upto)
            sql = (
                f"SELECT {_EVENT} FROM oncewire_run_events "
                "WHERE scope = ? AND branch = ? AND id > ?"
            )
            params: list[Any] = [scope, branch, after]
            if limit is not None:
                sql += " AND id <= ?"
                params.append(limit)
            rows = self._read(sql + " ORDER BY id DESC LIMIT 1", params)
            if rows and (best is None or rows[0][0] > best[0]):
                best = rows[0]
        return None if best is None else _event(best)

    def insert_revert_in_tx(
        self,
        tx: Any,
        *,
        scope: str,
        branch: str,
        checkpoint_id: str,
        hidden_after: int,
        hidden_upto: int,
        abandoned: Sequence[str],
        now: float,
    ) -> None:
        import json

        with translate_errors("recording a revert"):
            tx.conn.execute(
                "INSERT INTO oncewire_run_reverts (scope, branch, checkpoint_id, hidden_after, "
                "hidden_upto, abandoned, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    scope,
                    branch,
                    checkpoint_id,
                    hidden_after,
                    hidden_upto,
                    json.dumps(sorted(abandoned)),
                    now,
                ),
            )

    def put_barrier_in_tx(self, tx: Any, row: BarrierRow) -> None:
        with translate_errors("writing a barrier"):
            tx.conn.execute(
                f"INSERT INTO oncewire_run_barriers ({_BARRIER}) VALUES ({_marks(6)}) "
                "ON CONFLICT (scope, operation_id) DO UPDATE SET state = excluded.state, "
                "updated_at = excluded.updated_at",
                (
                    row.scope,
                    row.operation_id,
                    row.branch,
                    row.state,
                    row.created_at,
                    row.updated_at,
                ),
            )

    def get_barrier_in_tx(self, tx: Any, scope: str, operation_id: str) -> BarrierRow | None:
        with translate_errors("reading a barrier"):
            row = _one(
                tx.conn,
                f"SELECT {_BARRIER} FROM oncewire_run_barriers "
                "WHERE scope = ? AND operation_id = ?",
                (scope, operation_id),
            )
        return None if row is None else BarrierRow(*row)

    # -- deliveries --------------------------------------------------------------------------
    def insert_delivery_in_tx(self, tx: Any, row: DeliveryRow) -> DeliveryRow:
        with translate_errors("committing a delivery"):
            tx.conn.execute(
                f"INSERT INTO oncewire_run_deliveries ({_DELIVERY}) VALUES ({_marks(18)}) "
                "ON CONFLICT (idempotency_key) DO NOTHING",
                _delivery_values(row),
            )
            stored = _one(
                tx.conn,
                f"SELECT {_DELIVERY} FROM oncewire_run_deliveries WHERE idempotency_key = ?",
                (row.idempotency_key,),
            )
        return DeliveryRow(*stored)

    def get_delivery_in_tx(self, tx: Any, delivery_id: str) -> DeliveryRow | None:
        with translate_errors("reading a delivery"):
            row = _one(
                tx.conn,
                f"SELECT {_DELIVERY} FROM oncewire_run_deliveries WHERE delivery_id = ?",
                (delivery_id,),
            )
        return None if row is None else DeliveryRow(*row)

    def settle_delivery_in_tx(
        self,
        tx: Any,
        delivery_id: str,
        *,
        review_status: str,
        recovery_json: str | None,
        published_at: float,
    ) -> bool:
        with translate_errors("publishing a delivery"):
            return bool(
                tx.conn.execute(
                    "UPDATE oncewire_run_deliveries SET status = 'published', review_status = ?, "
                    "recovery = ?, published_at = ?, lease_expires_at = NULL "
                    "WHERE delivery_id = ? AND status = 'committed'",
                    (review_status, recovery_json, published_at, delivery_id),
                ).rowcount
            )

    def get_delivery(self, delivery_id: str) -> DeliveryRow | None:
        rows = self._read(
            f"SELECT {_DELIVERY} FROM oncewire_run_deliveries WHERE delivery_id = ?",
            (delivery_id,),
        )
        return DeliveryRow(*rows[0]) if rows else None

    def committed_deliveries(self, *, now: float, limit: int) -> list[DeliveryRow]:
        rows = self._read(
            f"SELECT {_DELIVERY} FROM oncewire_run_deliveries WHERE status = 'committed' "
            "AND (lease_expires_at IS NULL OR lease_expires_at < ?) "
            "ORDER BY created_at, delivery_id LIMIT ?",
            (now, limit),
        )
        return [DeliveryRow(*row) for row in rows]

    def runs_for_turn_in_tx(
        self, tx: Any, scope: str, branch: str, turn: str | None
    ) -> list[RunRow]:
        with translate_errors("reading a turn's runs"):
            rows = tx.conn.execute(
                f"SELECT {_RUN} FROM oncewire_runs WHERE scope = ? AND branch = ? AND turn IS ? "
                "ORDER BY created_at, run_id",
                (scope, branch, turn),
            ).fetchall()
        return [_run(row) for row in rows]

    # -- reports -----------------------------------------------------------------------------
    def insert_report_in_tx(self, tx: Any, row: ReportRow) -> None:
        with translate_errors("writing a reconciliation report"):
            tx.conn.execute(
                "INSERT INTO oncewire_run_reports (pass_id, subject, subject_id, run_id, owner, "
                "outcome, status, reason, error, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.pass_id,
                    row.subject,
                    row.subject_id,
                    row.run_id,
                    row.owner,
                    row.outcome,
                    row.status,
                    row.reason,
                    row.error,
                    row.created_at,
                ),
            )

    def list_reports(self, *, limit: int = 100, subject_id: str | None = None) -> list[ReportRow]:
        where, params = "", []
        if subject_id is not None:
            where, params = " WHERE subject_id = ?", [subject_id]
        rows = self._read(
            f"SELECT {_REPORT} FROM oncewire_run_reports{where} ORDER BY id DESC LIMIT ?",
            (*params, limit),
        )
        return [ReportRow(*row) for row in rows]
