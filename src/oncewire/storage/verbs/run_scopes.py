"""The run ledger's scope-level verbs, written once (statements in ``storage/sql/runs.sql``):
branches, checkpoints, reverts, barriers, completion deliveries and reconciliation reports.

On PostgreSQL a verb that reads what its caller is about to decide on locks it first: a branch
before it is created, forked or reverted, a scope before its barrier is taken or its cursor is
read (the ``lock_branch`` and ``lock_scope`` statements, advisory locks of migration 0002), a
delivery before it is published. A transaction takes them in one order, branch, then run rows,
then scope, so that waits cannot form a cycle. On SQLite those statements lock nothing: the
caller's ``BEGIN IMMEDIATE`` already made it the only writer.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from oncewire.storage.driver import Driver, Transaction
from oncewire.storage.runs import (
    BarrierRow,
    BranchRow,
    CheckpointRow,
    DeliveryRow,
    EventRow,
    ReportRow,
    RunRow,
)

__all__ = ["RunScopeVerbs", "record_params"]

# The records' boolean fields: written as booleans whatever truthy value a caller built the
# record with (PostgreSQL's boolean columns take no integer; SQLite stores them as 0 and 1).
_BOOLEANS = frozenset({"hidden", "terminal", "actions_bound"})


_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {}


def _fields(cls: type) -> tuple[tuple[str, bool], ...]:
    """``(name, boolean)`` per field of a record class, worked out once per class."""
    fields = _FIELDS.get(cls)
    if fields is None:
        fields = _FIELDS[cls] = tuple(
            (f.name, f.name in _BOOLEANS) for f in dataclasses.fields(cls)
        )
    return fields


def record_params(record: Any) -> dict[str, Any]:
    """A run-ledger record's fields by name: the parameters of the statement that writes it
    (``runs.sql`` names its parameters after the fields)."""
    params: dict[str, Any] = {}
    for name, boolean in _fields(type(record)):
        value = getattr(record, name)
        params[name] = bool(value) if boolean else value
    return params


class RunScopeVerbs:
    """Branches, checkpoints, barriers, deliveries and reports, over ``self.db``."""

    db: Driver

    # -- branches, checkpoints, barriers -----------------------------------------------------
    def get_branch_in_tx(self, tx: Transaction, scope: str, branch: str) -> BranchRow | None:
        # The branch's lock first: whoever reads a branch inside a transaction may create or
        # replace it (ensure, fork, revert), and two of them must not both see it missing.
        db, q = self.db, self.db.queries
        with db.in_tx(tx, "reading a branch") as conn:
            db.run(conn, q.lock_branch, scope=scope, branch=branch)
            row = db.one(conn, q.get_branch, scope=scope, branch=branch)
        return None if row is None else BranchRow(*row)

    def put_branch_in_tx(self, tx: Transaction, row: BranchRow) -> None:
        """Insert the branch or replace its view."""
        db = self.db
        with db.in_tx(tx, "writing a branch") as conn:
            db.run(conn, db.queries.put_branch, **record_params(row))

    def get_branch(self, scope: str, branch: str) -> BranchRow | None:
        rows = self.db.read(self.db.queries.get_branch, scope=scope, branch=branch)
        return BranchRow(*rows[0]) if rows else None

    def list_branches(self, scope: str, *, limit: int = 1000) -> list[BranchRow]:
        """A scope's branches, oldest first (a fork names its parent)."""
        rows = self.db.read(self.db.queries.list_branches, scope=scope, limit=limit)
        return [BranchRow(*row) for row in rows]

    def list_checkpoints(self, scope: str, *, limit: int = 1000) -> list[CheckpointRow]:
        """A scope's checkpoints on every branch, oldest first (by cursor)."""
        rows = self.db.read(self.db.queries.list_checkpoints, scope=scope, limit=limit)
        return [CheckpointRow(*row) for row in rows]

    def insert_checkpoint_in_tx(self, tx: Transaction, row: CheckpointRow) -> bool:
        """Insert unless the id exists; return whether it was inserted."""
        db = self.db
        with db.in_tx(tx, "writing a checkpoint") as conn:
            return bool(db.run(conn, db.queries.insert_checkpoint, **record_params(row)))

    def get_checkpoint_in_tx(self, tx: Transaction, checkpoint_id: str) -> CheckpointRow | None:
        db = self.db
        with db.in_tx(tx, "reading a checkpoint") as conn:
            row = db.one(conn, db.queries.get_checkpoint, checkpoint_id=checkpoint_id)
        return None if row is None else CheckpointRow(*row)

    def scope_cursor_in_tx(self, tx: Transaction, scope: str) -> int:
        # The scope's exclusive lock waits for every append in flight there: no event can
        # commit later under a cursor at or below the one read here.
        """The cursor of the newest event of ``scope`` (0 when it has none)."""
        db, q = self.db, self.db.queries
        with db.in_tx(tx, "reading a cursor") as conn:
            db.run(conn, q.lock_scope, scope=scope)
            row = db.one(conn, q.scope_cursor, scope=scope)
        assert row is not None  # an aggregate without GROUP BY has one row
        return int(row[0] or 0)

    def max_cursor_in_tx(self, tx: Transaction) -> int:
        """The newest cursor in the whole store."""
        db = self.db
        with db.in_tx(tx, "reading a cursor") as conn:
            row = db.one(conn, db.queries.max_cursor)
        assert row is not None  # an aggregate without GROUP BY has one row
        return int(row[0] or 0)

    def latest_event_in_view(
        self, scope: str, segments: Sequence[tuple[str, int, int | None]], upto: int | None
    ) -> EventRow | None:
        """The newest event of ``scope`` inside the visible segments ``(branch, after, upto)``."""
        best: Any = None
        for branch, after, until in segments:
            limit = until if until is not None else upto
            if upto is not None and limit is not None:
                limit = min(limit, upto)
            rows = self.db.read(
                self.db.queries.latest_event_in_segment,
                scope=scope,
                branch=branch,
                after=after,
                upto=limit,
            )
            if rows and (best is None or rows[0][0] > best[0]):
                best = rows[0]
        return None if best is None else EventRow.from_row(best)

    def insert_revert_in_tx(
        self,
        tx: Transaction,
        *,
        scope: str,
        branch: str,
        checkpoint_id: str,
        hidden_after: int,
        hidden_upto: int,
        abandoned: Sequence[str],
        now: float,
    ) -> None:
        db = self.db
        with db.in_tx(tx, "recording a revert") as conn:
            db.run(
                conn,
                db.queries.insert_revert,
                scope=scope,
                branch=branch,
                checkpoint_id=checkpoint_id,
                hidden_after=hidden_after,
                hidden_upto=hidden_upto,
                abandoned_json=json.dumps(sorted(abandoned)),
                now=now,
            )

    def put_barrier_in_tx(self, tx: Transaction, row: BarrierRow) -> None:
        """Insert the barrier or update its state (one held barrier per scope)."""
        db = self.db
        with db.in_tx(tx, "writing a barrier") as conn:
            db.run(conn, db.queries.put_barrier, **record_params(row))

    def get_barrier_in_tx(
        self, tx: Transaction, scope: str, operation_id: str
    ) -> BarrierRow | None:
        # Whoever reads a barrier in a transaction is about to take or move it: the scope's
        # exclusive lock orders it with other holders and with every append in flight.
        db, q = self.db, self.db.queries
        with db.in_tx(tx, "reading a barrier") as conn:
            db.run(conn, q.lock_scope, scope=scope)
            row = db.one(conn, q.get_barrier, scope=scope, operation_id=operation_id)
        return None if row is None else BarrierRow(*row)

    # -- deliveries --------------------------------------------------------------------------
    def insert_delivery_in_tx(self, tx: Transaction, row: DeliveryRow) -> DeliveryRow:
        """Insert unless the idempotency key exists; return the stored row either way."""
        db, q = self.db, self.db.queries
        with db.in_tx(tx, "committing a delivery") as conn:
            db.run(conn, q.insert_delivery, **record_params(row))
            stored = db.one(conn, q.delivery_by_key, idempotency_key=row.idempotency_key)
        assert stored is not None  # inserted, or the conflicting row, in this transaction
        return DeliveryRow(*stored)

    def get_delivery_in_tx(self, tx: Transaction, delivery_id: str) -> DeliveryRow | None:
        # Locked: publishing and reconciliation decide on its status and lease.
        db = self.db
        with db.in_tx(tx, "reading a delivery") as conn:
            row = db.one(conn, db.queries.lock_delivery, delivery_id=delivery_id)
        return None if row is None else DeliveryRow(*row)

    def settle_delivery_in_tx(
        self,
        tx: Transaction,
        delivery_id: str,
        *,
        review_status: str,
        recovery_json: str | None,
        published_at: float,
    ) -> bool:
        """Publish a committed delivery (its bytes untouched); return whether it was."""
        db = self.db
        with db.in_tx(tx, "publishing a delivery") as conn:
            settled = db.run(
                conn,
                db.queries.settle_delivery,
                review_status=review_status,
                recovery_json=recovery_json,
                published_at=published_at,
                delivery_id=delivery_id,
            )
        return bool(settled)

    def get_delivery(self, delivery_id: str) -> DeliveryRow | None:
        rows = self.db.read(self.db.queries.get_delivery, delivery_id=delivery_id)
        return DeliveryRow(*rows[0]) if rows else None

    def committed_deliveries(self, *, now: float, limit: int) -> list[DeliveryRow]:
        """Committed, unpublished deliveries whose owner's lease expired before ``now``."""
        rows = self.db.read(self.db.queries.committed_deliveries, now=now, limit=limit)
        return [DeliveryRow(*row) for row in rows]

    def runs_for_turn_in_tx(
        self, tx: Transaction, scope: str, branch: str, turn: str | None
    ) -> list[RunRow]:
        db = self.db
        with db.in_tx(tx, "reading a turn's runs") as conn:
            rows = db.all(conn, db.queries.runs_for_turn, scope=scope, branch=branch, turn=turn)
        return [RunRow.from_row(row) for row in rows]

    # -- reports -----------------------------------------------------------------------------
    def insert_report_in_tx(self, tx: Transaction, row: ReportRow) -> None:
        db = self.db
        with db.in_tx(tx, "writing a reconciliation report") as conn:
            db.run(conn, db.queries.insert_report, **record_params(row))

    def list_reports(self, *, limit: int = 100, subject_id: str | None = None) -> list[ReportRow]:
        """The newest reports first."""
        rows = self.db.read(self.db.queries.list_reports, subject_id=subject_id, limit=limit)
        return [ReportRow(*row) for row in rows]
