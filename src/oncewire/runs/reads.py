"""Reading the run ledger: runs verified in full, their phases, events and the store's list."""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from oncewire.core.errors import RunNotFound
from oncewire.runs import append
from oncewire.runs.append import RunContext
from oncewire.runs.records import Run, RunEvent, Verification
from oncewire.runs.verify import Audit
from oncewire.runs.views import event_view as _event
from oncewire.runs.views import run_view
from oncewire.storage import RunStore
from oncewire.storage.runs import RunRow

__all__ = ["RunReads"]


class RunReads:
    """The reading half of :class:`~oncewire.runs.service.Runs`, over its context."""

    context: RunContext

    @property
    def store(self) -> RunStore:
        return self.context.store

    def snapshot(self) -> AbstractContextManager[None]:
        """Reads inside the block see one moment of the store (``with runs.snapshot(): ...``),
        so that a run, its events and its phases shown together agree."""
        return self.store.read_snapshot()

    def get(self, run_id: str) -> Run:
        """The run, verified in full (a failed history shows as failed / safety_boundary)."""
        row, result = self._audit_run(run_id)
        return run_view(row, result.state, result.verification.reason)

    def phases(self, run_id: str) -> list[dict[str, Any]]:
        """The run's reviews and repairs as stored (verify with :meth:`get` to rely on them)."""
        phases, findings, _ = self.store.run_projections(run_id)
        return [
            {
                "phase_id": p.phase_id,
                "kind": p.kind,
                "status": p.status,
                "verdict": p.verdict,
                "candidate_id": p.candidate_id,
                "body": json.loads(p.body_json),
                "result": None if p.result_json is None else json.loads(p.result_json),
                "actions_bound": p.actions_bound,
                "findings": [json.loads(f.body_json) for f in findings if f.phase_id == p.phase_id],
                "opened_at": p.opened_at,
                "closed_at": p.closed_at,
            }
            for p in phases
        ]

    def events(self, run_id: str) -> list[RunEvent]:
        return [_event(row) for row in self.store.run_events(run_id)]

    def list(
        self,
        *,
        scope: str | None = None,
        status: Sequence[str] = (),
        limit: int = 100,
        after_run_id: str = "",
    ) -> builtins.list[RunRow]:
        """Stored run rows (unverified: use :meth:`get` or :meth:`verify` to rely on one).

        Raises :class:`ConfigurationError` when this ledger's key does not fit a listed run,
        as :meth:`get` and :meth:`verify` would: every reader agrees on such a run."""
        with self.store.read_snapshot():
            rows = self.store.list_runs(
                scope=scope, statuses=list(status), limit=limit, after_run_id=after_run_id
            )
            for row in rows:
                append.chain_key(self.context, row)
        return rows

    def verify(self, run_id: str | None = None, *, page: int = 500) -> builtins.list[Verification]:
        """Verify one run, or every run in the store."""
        if run_id is not None:
            return [self._audit_run(run_id)[1].verification]
        # Every run's key is checked before any verdict: a key that does not fit is the
        # caller's configuration, not a history to judge.
        after = ""
        while True:
            rows = self.list(limit=page, after_run_id=after)
            if len(rows) < page:
                break
            after = rows[-1].run_id
        results: builtins.list[Verification] = [
            Verification(run_id, False, events, 1, "events of a run that has no run row")
            for run_id, events in self.store.orphan_event_runs()
        ]
        after = ""
        while True:
            rows = self.store.list_runs(limit=page, after_run_id=after)
            for row in rows:
                # The listed row may be older than the run's newest event: each run is read
                # again, whole, in a snapshot of its own.
                results.append(self._audit_run(row.run_id)[1].verification)
            if len(rows) < page:
                return results
            after = rows[-1].run_id

    def _audit_run(self, run_id: str) -> tuple[RunRow, Audit]:
        """Read the run row, its events and its projections in one snapshot, and audit them."""
        with self.store.read_snapshot():
            row = self.store.get_run(run_id)
            if row is None:
                raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
            return row, append.audit(self.context, row)
