"""Branches, checkpoints, forks, reverts and revert barriers.

A branch's *view* is a list of visible segments ``[branch, after_cursor, upto_cursor|None]``
over its scope's events (a cursor is an event's scope-wide id, which only grows):

* a root branch sees its own events: ``[[root, 0, None]]``;
* a checkpoint keeps the view truncated at its cursor;
* a fork starts from a checkpoint's view and adds its own events: ``+ [[child, 0, None]]``;
* a revert shows the checkpoint's view again, then whatever the branch appends after the
  revert: ``+ [[branch, head, None]]``. The hidden tail stays stored; a run whose latest event
  lies in it is hidden (it authorises nothing) and, if it was active, abandoned.

A barrier is a deliberate hold on a scope (``reverting``, ``recovery_required``, then
``resolved``): while held, no run starts and no command but an action's late resolution is
admitted, and reconciliation defers to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from oncewire.core.canonical import canonical_json
from oncewire.core.errors import (
    ConfigurationError,
    HistoryTampered,
    RevertBarrierHeld,
    RunConflict,
    RunNotFound,
    TransitionRefused,
)
from oncewire.runs import append
from oncewire.runs.append import RunContext
from oncewire.runs.records import Projection
from oncewire.runs.verify import fold
from oncewire.runs.views import event_view, run_view
from oncewire.storage import RunStore, Transaction
from oncewire.storage.runs import BarrierRow, BranchRow, CheckpointRow, EventRow, RunRow

__all__ = ["Barrier", "Branch", "Branches", "Checkpoint", "Revert", "visible"]

Segment = tuple[str, int, int | None]
BARRIER_STATES = ("reverting", "recovery_required", "resolved")


@dataclass(frozen=True, slots=True)
class Branch:
    """A branch of a scope: what it shows (``segments``: ``(branch, after, upto)`` cursor
    ranges of the scope's events) and the branch it was forked from."""

    scope: str
    branch: str
    parent: str | None
    segments: list[tuple[str, int, int | None]]
    created_at: float


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A named cursor into a branch's view of its scope's history: forks and reverts start here."""

    checkpoint_id: str
    scope: str
    branch: str
    cursor: int
    reason: str
    metadata: dict[str, Any]
    created_at: float


@dataclass(frozen=True, slots=True)
class Revert:
    """What a revert did: the branch shows the checkpoint's view again; the events after cursor
    ``hidden_after`` up to ``hidden_upto`` stay stored but hidden, the runs active there were
    ``abandoned`` and the runs whose latest event lies there are ``hidden_runs``.
    """

    scope: str
    branch: str
    checkpoint_id: str
    hidden_after: int
    hidden_upto: int
    abandoned: list[str]
    hidden_runs: list[str]


@dataclass(frozen=True, slots=True)
class Barrier:
    """A revert barrier's hold on a scope: ``state`` is reverting, recovery_required or resolved."""

    scope: str
    operation_id: str
    branch: str | None
    state: str


def _segments(view_json: str) -> list[Segment]:
    return [(str(b), int(a), None if u is None else int(u)) for b, a, u in json.loads(view_json)]


def _view_json(segments: list[Segment]) -> str:
    return canonical_json([list(s) for s in segments])


def truncate(segments: list[Segment], cursor: int) -> list[Segment]:
    result: list[Segment] = []
    for branch, after, upto in segments:
        if after >= cursor:
            continue
        result.append((branch, after, cursor if upto is None else min(upto, cursor)))
    return result


def visible(cursor: int, branch: str, segments: list[Segment], upto: int | None = None) -> bool:
    if upto is not None and cursor > upto:
        return False
    return any(
        b == branch and cursor > after and (until is None or cursor <= until)
        for b, after, until in segments
    )


def _checkpoint(row: CheckpointRow) -> Checkpoint:
    return Checkpoint(
        row.checkpoint_id,
        row.scope,
        row.branch,
        row.cursor,
        row.reason,
        json.loads(row.metadata_json),
        row.created_at,
    )


def _branch(row: BranchRow) -> Branch:
    return Branch(row.scope, row.branch, row.parent, _segments(row.view_json), row.created_at)


class Branches:
    """Checkpoints, forks, reverts and barriers of the run ledger: ``ledger.runs.branches``."""

    def __init__(self, context: RunContext) -> None:
        self._ctx = context

    @property
    def store(self) -> RunStore:
        return self._ctx.store

    def ensure_in_tx(self, tx: Transaction, scope: str, branch: str, now: float) -> BranchRow:
        row = self.store.get_branch_in_tx(tx, scope, branch)
        if row is None:
            row = BranchRow(scope, branch, None, _view_json([(branch, 0, None)]), now)
            self.store.put_branch_in_tx(tx, row)
        return row

    def checkpoint(
        self,
        checkpoint_id: str,
        *,
        scope: str,
        branch: str,
        reason: str = "checkpoint",
        cursor: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Checkpoint:
        """A cursor into ``branch``'s history (its current head by default)."""
        now = self._ctx.now()
        with self.store.transaction() as tx:
            view = self.ensure_in_tx(tx, scope, branch, now)
            at = self.store.scope_cursor_in_tx(tx, scope) if cursor is None else cursor
            row = CheckpointRow(
                checkpoint_id,
                scope,
                branch,
                at,
                _view_json(truncate(_segments(view.view_json), at)),
                reason,
                canonical_json(metadata or {}),
                now,
            )
            if not self.store.insert_checkpoint_in_tx(tx, row):
                # The same checkpoint asked for again (a retry that did not hear back) is a
                # replay, even after its branch moved on; any other use of its id is refused.
                stored = self.store.get_checkpoint_in_tx(tx, checkpoint_id)
                if stored is None:  # the insert met a row this transaction cannot read
                    raise RunConflict(
                        f"checkpoint id {checkpoint_id!r} could not be written or read back; "
                        "nothing was written",
                        checkpoint_id=checkpoint_id,
                    )
                same = (stored.scope, stored.branch, stored.reason, stored.metadata_json) == (
                    scope,
                    branch,
                    reason,
                    row.metadata_json,
                ) and (cursor is None or stored.cursor == cursor)
                if not same:
                    raise RunConflict(
                        f"checkpoint id {checkpoint_id!r} already names another checkpoint "
                        f"(scope {stored.scope!r}, branch {stored.branch!r}, cursor "
                        f"{stored.cursor}); nothing was written",
                        checkpoint_id=checkpoint_id,
                    )
                row = stored
        return _checkpoint(row)

    def get_checkpoint(self, checkpoint_id: str) -> Checkpoint:
        with self.store.transaction() as tx:
            row = self.store.get_checkpoint_in_tx(tx, checkpoint_id)
        if row is None:
            raise RunNotFound(f"no checkpoint {checkpoint_id!r}")
        return _checkpoint(row)

    def fork(self, *, scope: str, checkpoint_id: str, branch: str) -> Branch:
        """A new branch that sees the checkpoint's history, then its own events."""
        now = self._ctx.now()
        with self.store.transaction() as tx:
            cp = self.store.get_checkpoint_in_tx(tx, checkpoint_id)
            if cp is None or cp.scope != scope:
                raise RunNotFound(f"no checkpoint {checkpoint_id!r} in scope {scope!r}")
            view = _view_json([*_segments(cp.view_json), (branch, 0, None)])
            existing = self.store.get_branch_in_tx(tx, scope, branch)
            if existing is not None:
                if existing.view_json != view:
                    raise RunConflict(
                        f"branch {branch!r} already exists with another history; "
                        "nothing was written",
                        branch=branch,
                    )
                return _branch(existing)
            row = BranchRow(scope, branch, cp.branch, view, now)
            self.store.put_branch_in_tx(tx, row)
        return _branch(row)

    def revert(self, *, scope: str, branch: str, checkpoint_id: str) -> Revert:
        """Show ``branch`` up to the checkpoint again, in one transaction."""
        now = self._ctx.now()
        with self.store.transaction() as tx:
            cp = self.store.get_checkpoint_in_tx(tx, checkpoint_id)
            if cp is None or cp.scope != scope:
                raise RunNotFound(f"no checkpoint {checkpoint_id!r} in scope {scope!r}")
            if cp.branch != branch:
                raise TransitionRefused(
                    f"checkpoint {checkpoint_id!r} belongs to branch {cp.branch!r}, not {branch!r}"
                )
            self.ensure_in_tx(tx, scope, branch, now)
            shown = [*_segments(cp.view_json), (branch, self.store.max_cursor_in_tx(tx), None)]
            abandoned: list[str] = []
            for run in self.store.branch_runs_in_tx(tx, scope, branch):
                if run.active and not self._head_visible_in_tx(tx, run, branch, shown):
                    append.abandon_in_tx(self._ctx, tx, run, reason="reverted")
                    abandoned.append(run.run_id)
            # The releases just written belong to the hidden tail too: the branch shows its
            # own events again only from here on.
            head = self.store.max_cursor_in_tx(tx)
            segments = [*_segments(cp.view_json), (branch, head, None)]
            self.store.put_branch_in_tx(
                tx, BranchRow(scope, branch, None, _view_json(segments), now)
            )
            hidden = {
                run.run_id: not self._head_visible_in_tx(tx, run, branch, segments)
                for run in self.store.branch_runs_in_tx(tx, scope, branch)
            }
            self.store.set_runs_hidden_in_tx(tx, hidden)
            self.store.insert_revert_in_tx(
                tx,
                scope=scope,
                branch=branch,
                checkpoint_id=checkpoint_id,
                hidden_after=cp.cursor,
                hidden_upto=head,
                abandoned=abandoned,
                now=now,
            )
        return Revert(
            scope,
            branch,
            checkpoint_id,
            cp.cursor,
            head,
            abandoned,
            sorted(r for r, flag in hidden.items() if flag),
        )

    def _head_visible_in_tx(
        self, tx: Transaction, run: RunRow, branch: str, segments: list[Segment]
    ) -> bool:
        head_event = self.store.event_at_in_tx(tx, run.run_id, run.head_seq)
        return head_event is not None and visible(head_event.id, branch, segments)

    def hold(
        self, *, scope: str, operation_id: str, state: str, branch: str | None = None
    ) -> Barrier:
        """Take or move a revert barrier on ``scope`` (one held barrier per scope)."""
        if state not in BARRIER_STATES:
            raise ConfigurationError(f"a barrier's state is one of {', '.join(BARRIER_STATES)}")
        now = self._ctx.now()
        with self.store.transaction() as tx:
            # This barrier first: a backend with concurrent writers orders barrier holders on
            # that read, so the held barrier read next is current.
            current = self.store.get_barrier_in_tx(tx, scope, operation_id)
            held = self.store.held_barrier_in_tx(tx, scope)
            if held is not None and held.operation_id != operation_id:
                raise RevertBarrierHeld(
                    f"scope {scope!r} is already held by revert {held.operation_id!r}",
                    scope=scope,
                    operation_id=held.operation_id,
                )
            if current is not None and current.state == "resolved" and state != "resolved":
                raise TransitionRefused(f"barrier {operation_id!r} is already resolved")
            self.store.put_barrier_in_tx(
                tx,
                BarrierRow(
                    scope,
                    operation_id,
                    branch if current is None else current.branch,
                    state,
                    now if current is None else current.created_at,
                    now,
                ),
            )
        return Barrier(scope, operation_id, branch, state)

    def project(self, scope: str, branch: str, *, upto: int | None = None) -> Projection:
        # One snapshot: the view, the latest event, the run and its audit from one moment.
        with self.store.read_snapshot():
            return self._project(scope, branch, upto)

    def _project(self, scope: str, branch: str, upto: int | None) -> Projection:
        store = self.store
        view = store.get_branch(scope, branch)
        if view is None:
            if branch != scope:
                raise RunNotFound(f"no branch {branch!r} in scope {scope!r}")
            segments: list[Segment] = [(branch, 0, None)]
        else:
            segments = _segments(view.view_json)
        latest: EventRow | None = store.latest_event_in_view(scope, segments, upto)
        if latest is None:
            return Projection(scope, branch, upto, None, [])
        row = store.get_run(latest.run_id)
        if row is None:  # events without their run row: the store was edited
            raise HistoryTampered(
                f"branch {branch!r} shows events of run {latest.run_id!r}, which has no run row",
                run_id=latest.run_id,
            )
        result = append.audit(self._ctx, row)
        events = store.run_events(row.run_id)
        shown = [e for e in events if visible(e.id, e.branch, segments, upto)]
        if not result.ok:
            run = run_view(row, None, result.verification.reason)
        elif len(shown) == len(events):
            run = run_view(row, result.state)
        else:
            state, _, _ = fold(row, shown)
            run = run_view(row, state)
        return Projection(scope, branch, upto, run, [event_view(e) for e in shown])
