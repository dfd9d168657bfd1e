"""The run ledger's verbs, written once (statements in ``storage/sql/runs.sql``).

Runs, their event chains and projections, leases, key pins, and the reads that verification
and recovery need; the scope-level verbs (branches, checkpoints, barriers, deliveries, reports)
are :mod:`oncewire.storage.verbs.run_scopes`. What differs per dialect is in the SQL
(``postgresql.sql``: the advisory and table locks that SQLite's single writer does not need) or
in the driver: a command's writes travel as one pipeline on PostgreSQL, a read snapshot is
``REPEATABLE READ, READ ONLY`` there, and only there can the append meet a barrier taken after
the command read its context, which the driver turns into :class:`RevertBarrierHeld`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from oncewire.core.errors import RevertBarrierHeld
from oncewire.storage.driver import Driver, Row, Transaction
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
from oncewire.storage.verbs.run_scopes import RunScopeVerbs, record_params

__all__ = ["RunLedgerVerbs"]

# The unique index that holds one barrier per scope; the append trigger names it when it
# refuses an event in a scope a barrier holds.
_BARRIER_HELD = "oncewire_run_barriers_one_held"


def _head_current(row: Row) -> bool:
    """Whether a context row's head event is the one its run row points at."""
    head_seq, head_hash, event_seq, event_hash = row[9], row[10], row[25], row[32]
    if row[21] is None:
        return bool(head_seq == 0)
    return bool(event_seq == head_seq and event_hash == head_hash)


def _context(row: Row) -> CommandContext:
    head, prior, barrier = row[21:34], row[34:47], row[47:53]
    return CommandContext(
        run=RunRow.from_row(row[:21]),
        head=None if head[0] is None else EventRow.from_row(head),
        prior=None if prior[0] is None else EventRow.from_row(prior),
        barrier=None if barrier[0] is None else BarrierRow(*barrier),
    )


def _barrier_taken(event: EventRow) -> RevertBarrierHeld:
    """A barrier taken after the command checked for one: the same typed refusal as when the
    command saw it first."""
    return RevertBarrierHeld(
        f"cannot append to run {event.run_id!r}: a revert barrier took scope {event.scope!r} "
        "while the command was being decided; it requires recovery first",
        scope=event.scope,
        run_id=event.run_id,
    )


class RunLedgerVerbs(RunScopeVerbs):
    """The run ledger's seam: its verbs, written once over ``self.db``; each docstring is the
    contract the runs layer relies on."""

    db: Driver

    # -- runs and their chains ---------------------------------------------------------------
    def insert_run_in_tx(self, tx: Transaction, row: RunRow) -> bool:
        """Insert a new run row (no events yet) unless its id exists or its branch already has
        an active run; return whether it was inserted."""
        db = self.db
        with db.in_tx(tx, "starting a run") as conn:
            return bool(db.run(conn, db.queries.insert_run, **record_params(row)))

    def get_run_in_tx(self, tx: Transaction, run_id: str) -> RunRow | None:
        # Locked: what the caller decides on (a renewal's fence, a replay) stays true until it
        # commits.
        db = self.db
        with db.in_tx(tx, "reading a run") as conn:
            row = db.one(conn, db.queries.lock_run, run_id=run_id)
        return None if row is None else RunRow.from_row(row)

    def command_context_in_tx(
        self, tx: Transaction, run_id: str, key: str
    ) -> CommandContext | None:
        """The run, its head event, the event under ``key`` and its scope's held barrier."""
        db, q = self.db, self.db.queries
        with db.in_tx(tx, "reading a run") as conn:
            # Read and lock in one statement. If the run changed while this waited for its lock
            # (PostgreSQL), the joined rows are from before the change: lock it alone, then
            # read the context in a statement of its own.
            row = db.one(conn, q.command_context_locked, run_id=run_id, key=key)
            if row is None or not _head_current(row):
                locked = db.one(conn, q.lock_run, run_id=run_id)
                row = db.one(conn, q.command_context, run_id=run_id, key=key) if locked else None
        return None if row is None else _context(row)

    def active_run_on_branch_in_tx(self, tx: Transaction, scope: str, branch: str) -> RunRow | None:
        db = self.db
        with db.in_tx(tx, "reading a branch's active run") as conn:
            row = db.one(conn, db.queries.active_run_on_branch, scope=scope, branch=branch)
        return None if row is None else RunRow.from_row(row)

    def event_by_key_in_tx(self, tx: Transaction, run_id: str, key: str) -> EventRow | None:
        db = self.db
        with db.in_tx(tx, "reading a run event") as conn:
            row = db.one(conn, db.queries.event_by_key, run_id=run_id, idempotency_key=key)
        return None if row is None else EventRow.from_row(row)

    def event_at_in_tx(self, tx: Transaction, run_id: str, seq: int) -> EventRow | None:
        db = self.db
        with db.in_tx(tx, "reading a run event") as conn:
            row = db.one(conn, db.queries.event_at, run_id=run_id, seq=seq)
        return None if row is None else EventRow.from_row(row)

    def append_run_event_in_tx(self, tx: Transaction, change: RunAppend) -> EventRow:
        """Insert the event (extending the run's head), then write the run row and the phase,
        finding and action rows. Returns the event with its cursor."""
        db, q = self.db, self.db.queries
        conn = db.tx_conn(tx)
        e = change.event
        # Every write of the command in one round trip where statements travel (a pipeline):
        # an error, such as the append trigger's refusal, surfaces when it is synced and
        # aborts the rest.
        with (
            db.translate_errors("appending a run event"),
            db.constraint_refusal(_BARRIER_HELD, lambda: _barrier_taken(e)),
            db.pipeline(conn) as writes,
        ):
            for phase in change.phases:
                # A phase this event opens is inserted (its id used twice fails loudly); a
                # later event only fills in how it went on.
                opens = phase.status == "open" and phase.opened_seq == e.seq
                writes.run(q.insert_phase if opens else q.upsert_phase, **record_params(phase))
            inserted = writes.rows(q.insert_run_event, **record_params(e))
            writes.run(q.advance_run, **record_params(change.run))
            writes.batch(q.insert_finding, [record_params(f) for f in change.findings])
            for action in change.actions:
                # A proposal is inserted; a resolution only fills in how it ended.
                proposes = action.proposed_seq == e.seq
                writes.run(
                    q.insert_action if proposes else q.upsert_action, **record_params(action)
                )
        row = inserted.one()
        assert row is not None  # INSERT ... RETURNING, which did not fail
        return dataclasses.replace(e, id=int(row[0]))

    def used_ids_in_tx(
        self,
        tx: Transaction,
        run_id: str,
        *,
        phases: Sequence[str] = (),
        findings: Sequence[str] = (),
        actions: Sequence[str] = (),
    ) -> list[tuple[str, str, int]]:
        """Which of these phase, finding and action ids the run already uses: ``(kind, id,
        seq)`` with kind ``review``/``repair``/``finding``/``action`` and the event that first
        used it. A command that would open one again is refused before it writes anything."""
        if not (phases or findings or actions):
            return []
        db = self.db
        with db.in_tx(tx, "reading a run's ids") as conn:
            rows = db.all(
                conn,
                db.queries.used_ids,
                run_id=run_id,
                phases=list(phases),
                findings=list(findings),
                actions=list(actions),
            )
        return [(str(kind), str(name), int(seq or 0)) for kind, name, seq in rows]

    def update_run_lease_in_tx(
        self,
        tx: Transaction,
        run_id: str,
        *,
        owner: str | None,
        fence: int,
        lease_expires_at: float | None,
        now: float,
    ) -> None:
        db = self.db
        with db.in_tx(tx, "updating a run's lease") as conn:
            db.run(
                conn,
                db.queries.update_run_lease,
                owner=owner,
                fence=fence,
                lease_expires_at=lease_expires_at,
                now=now,
                run_id=run_id,
            )

    def abandon_run_in_tx(self, tx: Transaction, run_id: str, *, reason: str, now: float) -> bool:
        """Mark an active run abandoned (no terminal is written); return whether it was."""
        db = self.db
        with db.in_tx(tx, "abandoning a run") as conn:
            return bool(db.run(conn, db.queries.abandon_run, now=now, reason=reason, run_id=run_id))

    def set_runs_hidden_in_tx(self, tx: Transaction, hidden: dict[str, bool]) -> None:
        if not hidden:
            return
        db = self.db
        rows = [(run_id, bool(flag)) for run_id, flag in hidden.items()]
        with db.in_tx(tx, "marking hidden runs") as conn:
            for start in range(0, len(rows), db.values_chunk):
                chunk = rows[start : start + db.values_chunk]
                db.run(conn, db.queries.set_runs_hidden, rows=chunk)

    def held_barrier_in_tx(self, tx: Transaction, scope: str) -> BarrierRow | None:
        db = self.db
        with db.in_tx(tx, "reading barriers") as conn:
            row = db.one(conn, db.queries.held_barrier, scope=scope)
        return None if row is None else BarrierRow(*row)

    @contextmanager
    def read_snapshot(self) -> Iterator[None]:
        """Every read this thread makes inside the block sees one moment of the store (a read
        transaction: deferred ``BEGIN`` on SQLite, ``REPEATABLE READ, READ ONLY`` on
        PostgreSQL). Inside a transaction already open on this thread it adds nothing. A
        verified read takes one, so that it never judges a run from two moments at once."""
        with self.db.snapshot():
            yield

    def get_run(self, run_id: str) -> RunRow | None:
        rows = self.db.read(self.db.queries.get_run, run_id=run_id)
        return RunRow.from_row(rows[0]) if rows else None

    def run_key_pin(self, run_id: str) -> KeyPinRow | None:
        """The key pin of a keyless run (read on this thread's connection, so inside its
        transaction or snapshot)."""
        rows = self.db.read(self.db.queries.get_key_pin, run_id=run_id)
        return KeyPinRow(*rows[0]) if rows else None

    def unpinned_keyless_runs_in_tx(self, tx: Transaction) -> list[RunRow]:
        """Every keyless run without a key pin, locked where the backend locks rows."""
        db, q = self.db, self.db.queries
        with db.in_tx(tx, "reading keyless runs") as conn:
            # Adopters take turns, and the read is a statement of its own after the lock, so
            # that a second adopter sees the first one's pins instead of pinning the same runs
            # again and failing on the primary key.
            db.run(conn, q.lock_key_pins)
            rows = db.all(conn, q.unpinned_keyless_runs)
        return [RunRow.from_row(row) for row in rows]

    def insert_key_pins_in_tx(self, tx: Transaction, rows: Sequence[KeyPinRow]) -> None:
        if not rows:
            return
        db = self.db
        with db.in_tx(tx, "pinning keyless runs") as conn:
            db.batch(conn, db.queries.insert_key_pin, [record_params(pin) for pin in rows])

    def list_runs(
        self,
        *,
        scope: str | None = None,
        statuses: Sequence[str] = (),
        limit: int = 100,
        after_run_id: str = "",
    ) -> list[RunRow]:
        rows = self.db.read(
            self.db.queries.list_runs,
            after_run_id=after_run_id,
            scope=scope,
            any_status=not statuses,
            statuses=list(statuses),
            limit=limit,
        )
        return [RunRow.from_row(row) for row in rows]

    def run_events(self, run_id: str) -> list[EventRow]:
        """Every event of the run's chain, by ``seq``."""
        rows = self.db.read(self.db.queries.run_events, run_id=run_id)
        return [EventRow.from_row(row) for row in rows]

    def run_chain(
        self, run_id: str, *, after_seq: int = 0
    ) -> list[tuple[int, int, str, str, str, str]]:
        """``(cursor, seq, type, prev_hash, hash, payload_json)`` by seq: the lean read that
        verification needs."""
        rows: list[Any] = self.db.read(
            self.db.queries.run_chain, run_id=run_id, after_seq=after_seq
        )
        return rows

    def orphan_event_runs(self) -> list[tuple[str, int]]:
        """``(run_id, events)`` for events whose run row does not exist (an edited store)."""
        rows = self.db.read(self.db.queries.orphan_event_runs)
        return [(str(run_id), int(n)) for run_id, n in rows]

    def run_projections(
        self, run_id: str
    ) -> tuple[list[PhaseRow], list[FindingRow], list[ActionRow]]:
        db, q = self.db, self.db.queries
        # The three reads from one snapshot, in one round trip where statements travel.
        with (
            db.translate_errors("reading a run's projections"),
            db.snapshot() as conn,
            db.pipeline(conn) as reads,
        ):
            phases = reads.rows(q.run_phases, run_id=run_id)
            findings = reads.rows(q.run_findings, run_id=run_id)
            actions = reads.rows(q.run_actions, run_id=run_id)
        return (
            [PhaseRow.from_row(row) for row in phases.rows],
            [FindingRow(*row) for row in findings.rows],
            [ActionRow(*row) for row in actions.rows],
        )

    def expired_runs(
        self, *, now: float, limit: int, dead_owners: Sequence[str] = ()
    ) -> list[RunRow]:
        """Active runs whose lease expired before ``now`` or whose owner is known dead, oldest
        first."""
        rows = self.db.read(
            self.db.queries.expired_runs, now=now, dead_owners=list(dead_owners), limit=limit
        )
        return [RunRow.from_row(row) for row in rows]

    def active_run_owners(self) -> list[str]:
        """The distinct owners of active runs."""
        return [str(row[0]) for row in self.db.read(self.db.queries.active_run_owners)]

    def branch_runs_in_tx(self, tx: Transaction, scope: str, branch: str) -> list[RunRow]:
        # Locked, in one order: a revert decides which of them it abandons and hides.
        """Every run started on this branch (a revert recomputes which are hidden)."""
        db = self.db
        with db.in_tx(tx, "reading a branch's runs") as conn:
            rows = db.all(conn, db.queries.branch_runs, scope=scope, branch=branch)
        return [RunRow.from_row(row) for row in rows]
