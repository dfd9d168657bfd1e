"""The run ledger's scope-level verbs on PostgreSQL: branches, checkpoints, reverts, barriers,
completion deliveries and reconciliation reports."""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from oncewire.storage.postgres.connection import translate_errors
from oncewire.storage.run_rows import (
    BARRIER,
    BRANCH,
    CHECKPOINT,
    DELIVERY,
    EVENT,
    REPORT,
    RUN,
    delivery_values,
    event_row,
    run_row,
)
from oncewire.storage.runs import (
    BarrierRow,
    BranchRow,
    CheckpointRow,
    DeliveryRow,
    EventRow,
    ReportRow,
    RunRow,
)

__all__ = ["PostgresRunScopeVerbs", "one"]


_EVENT_E = ", ".join(f"e.{name.strip()}" for name in EVENT.split(","))


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


def one(conn: Any, sql: str, params: Sequence[Any]) -> Any:
    return conn.execute(sql, params).fetchone()


class PostgresRunScopeVerbs:
    """Branches, checkpoints, barriers, deliveries and reports (mixed into PostgresRunVerbs)."""

    if TYPE_CHECKING:

        def _conn(self) -> Any: ...
        def _forget(self, conn: Any) -> None: ...
        def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...
        def _write(self, what: str) -> AbstractContextManager[Any]: ...

    # -- branches, checkpoints, barriers -----------------------------------------------------
    def get_branch_in_tx(self, tx: Any, scope: str, branch: str) -> BranchRow | None:
        # The branch's lock first: whoever reads a branch inside a transaction may create or
        # replace it (ensure, fork, revert), and two of them must not both see it missing.
        with translate_errors("reading a branch"):
            tx.conn.execute("SELECT oncewire_run_branch_lock(%s, %s)", (scope, branch))
            row = one(
                tx.conn,
                f"SELECT {BRANCH} FROM oncewire_run_branches WHERE scope = %s AND branch = %s",
                (scope, branch),
            )
        return None if row is None else BranchRow(*row)

    def put_branch_in_tx(self, tx: Any, row: BranchRow) -> None:
        with translate_errors("writing a branch"):
            tx.conn.execute(
                f"INSERT INTO oncewire_run_branches ({BRANCH}) VALUES ({_marks(5)}) "
                "ON CONFLICT (scope, branch) DO UPDATE SET view = excluded.view",
                (row.scope, row.branch, row.parent, row.view_json, row.created_at),
            )

    def get_branch(self, scope: str, branch: str) -> BranchRow | None:
        rows = self._read(
            f"SELECT {BRANCH} FROM oncewire_run_branches WHERE scope = %s AND branch = %s",
            (scope, branch),
        )
        return BranchRow(*rows[0]) if rows else None

    def insert_checkpoint_in_tx(self, tx: Any, row: CheckpointRow) -> bool:
        with translate_errors("writing a checkpoint"):
            return bool(
                tx.conn.execute(
                    f"INSERT INTO oncewire_run_checkpoints ({CHECKPOINT}) VALUES ({_marks(8)}) "
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
            row = one(
                tx.conn,
                f"SELECT {CHECKPOINT} FROM oncewire_run_checkpoints WHERE checkpoint_id = %s",
                (checkpoint_id,),
            )
        return None if row is None else CheckpointRow(*row)

    def scope_cursor_in_tx(self, tx: Any, scope: str) -> int:
        # The scope's exclusive lock waits for every append in flight there: no event can
        # commit later under a cursor at or below the one read here.
        with translate_errors("reading a cursor"):
            tx.conn.execute("SELECT oncewire_run_scope_lock(%s, TRUE)", (scope,))
            row = one(
                tx.conn,
                "SELECT MAX(e.id) FROM oncewire_runs r "
                "JOIN oncewire_run_events e ON e.run_id = r.run_id WHERE r.scope = %s",
                (scope,),
            )
        return int(row[0] or 0)

    def max_cursor_in_tx(self, tx: Any) -> int:
        with translate_errors("reading a cursor"):
            row = one(tx.conn, "SELECT MAX(id) FROM oncewire_run_events", ())
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
                f"SELECT {_EVENT_E} FROM oncewire_runs r "
                "JOIN oncewire_run_events e ON e.run_id = r.run_id "
                "WHERE r.scope = %s AND r.branch = %s AND e.id > %s"
            )
            params: list[Any] = [scope, branch, after]
            if limit is not None:
                sql += " AND e.id <= %s"
                params.append(limit)
            rows = self._read(sql + " ORDER BY e.id DESC LIMIT 1", params)
            if rows and (best is None or rows[0][0] > best[0]):
                best = rows[0]
        return None if best is None else event_row(best)

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
        with translate_errors("recording a revert"):
            tx.conn.execute(
                "INSERT INTO oncewire_run_reverts (scope, branch, checkpoint_id, hidden_after, "
                "hidden_upto, abandoned, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
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
                f"INSERT INTO oncewire_run_barriers ({BARRIER}) VALUES ({_marks(6)}) "
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
        # Whoever reads a barrier in a transaction is about to take or move it: the scope's
        # exclusive lock orders it with other holders and with every append in flight.
        with translate_errors("reading a barrier"):
            tx.conn.execute("SELECT oncewire_run_scope_lock(%s, TRUE)", (scope,))
            row = one(
                tx.conn,
                f"SELECT {BARRIER} FROM oncewire_run_barriers "
                "WHERE scope = %s AND operation_id = %s",
                (scope, operation_id),
            )
        return None if row is None else BarrierRow(*row)

    # -- deliveries --------------------------------------------------------------------------
    def insert_delivery_in_tx(self, tx: Any, row: DeliveryRow) -> DeliveryRow:
        with translate_errors("committing a delivery"):
            tx.conn.execute(
                f"INSERT INTO oncewire_run_deliveries ({DELIVERY}) VALUES ({_marks(18)}) "
                "ON CONFLICT (idempotency_key) DO NOTHING",
                delivery_values(row),
            )
            stored = one(
                tx.conn,
                f"SELECT {DELIVERY} FROM oncewire_run_deliveries WHERE idempotency_key = %s",
                (row.idempotency_key,),
            )
        return DeliveryRow(*stored)

    def get_delivery_in_tx(self, tx: Any, delivery_id: str) -> DeliveryRow | None:
        # Locked: publishing and reconciliation decide on its status and lease.
        with translate_errors("reading a delivery"):
            row = one(
                tx.conn,
                f"SELECT {DELIVERY} FROM oncewire_run_deliveries WHERE delivery_id = %s FOR UPDATE",
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
                    "UPDATE oncewire_run_deliveries SET status = 'published', "
                    "review_status = %s, recovery = %s, published_at = %s, "
                    "lease_expires_at = NULL WHERE delivery_id = %s AND status = 'committed'",
                    (review_status, recovery_json, published_at, delivery_id),
                ).rowcount
            )

    def get_delivery(self, delivery_id: str) -> DeliveryRow | None:
        rows = self._read(
            f"SELECT {DELIVERY} FROM oncewire_run_deliveries WHERE delivery_id = %s",
            (delivery_id,),
        )
        return DeliveryRow(*rows[0]) if rows else None

    def committed_deliveries(self, *, now: float, limit: int) -> list[DeliveryRow]:
        rows = self._read(
            f"SELECT {DELIVERY} FROM oncewire_run_deliveries WHERE status = 'committed' "
            "AND (lease_expires_at IS NULL OR lease_expires_at < %s) "
            "ORDER BY created_at, delivery_id LIMIT %s",
            (now, limit),
        )
        return [DeliveryRow(*row) for row in rows]

    def runs_for_turn_in_tx(
        self, tx: Any, scope: str, branch: str, turn: str | None
    ) -> list[RunRow]:
        with translate_errors("reading a turn's runs"):
            rows = tx.conn.execute(
                f"SELECT {RUN} FROM oncewire_runs WHERE scope = %s AND branch = %s "
                "AND turn IS NOT DISTINCT FROM %s::text ORDER BY created_at, run_id",
                (scope, branch, turn),
            ).fetchall()
        return [run_row(row) for row in rows]

    # -- reports -----------------------------------------------------------------------------
    def insert_report_in_tx(self, tx: Any, row: ReportRow) -> None:
        with translate_errors("writing a reconciliation report"):
            tx.conn.execute(
                "INSERT INTO oncewire_run_reports (pass_id, subject, subject_id, run_id, owner, "
                "outcome, status, reason, error, created_at) "
                f"VALUES ({_marks(10)})",
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
            where, params = " WHERE subject_id = %s", [subject_id]
        rows = self._read(
            f"SELECT {REPORT} FROM oncewire_run_reports{where} ORDER BY id DESC LIMIT %s",
            (*params, limit),
        )
        return [ReportRow(*row) for row in rows]
