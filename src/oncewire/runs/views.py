"""How stored rows are shown: a run (or its failure) and its events."""

from __future__ import annotations

import json
from typing import Any

from oncewire.runs.records import Run, RunEvent
from oncewire.storage.runs import EventRow, RunRow

__all__ = ["event_view", "run_view"]


def event_view(row: EventRow) -> RunEvent:
    return RunEvent(
        cursor=row.id,
        run_id=row.run_id,
        seq=row.seq,
        type=row.type,
        key=row.idempotency_key,
        request_digest=row.request_digest,
        terminal=row.terminal,
        payload=json.loads(row.payload_json),
        prev_hash=row.prev_hash,
        hash=row.hash,
        at=row.at,
    )


def run_view(row: RunRow, state: dict[str, Any] | None, fault: str | None = None) -> Run:
    """The run as shown: the folded ``state`` (None: the history failed verification)."""
    if state is None or fault is not None:
        return Run(
            run_id=row.run_id,
            scope=row.scope,
            branch=row.branch,
            turn=row.turn,
            workflow=row.workflow,
            status="failed",
            terminal_reason="safety_boundary",
            created_at=row.created_at,
            finished_at=None,
            abandoned_at=row.abandoned_at,
            abandon_reason=row.abandon_reason,
            owner=row.owner,
            fence=row.fence,
            lease_expires_at=row.lease_expires_at,
            head_seq=row.head_seq,
            state={},
            hidden=row.hidden,
            claimed_status=row.status,
            fault=fault or "the history failed verification",
        )
    terminal = state.get("finished_at") is not None
    return Run(
        run_id=row.run_id,
        scope=row.scope,
        branch=row.branch,
        turn=row.turn,
        workflow=row.workflow,
        status=str(state.get("status")),
        terminal_reason=state.get("reason") if terminal else None,
        created_at=state.get("created_at"),
        finished_at=state.get("finished_at"),
        abandoned_at=row.abandoned_at,
        abandon_reason=row.abandon_reason,
        owner=row.owner,
        fence=row.fence,
        lease_expires_at=row.lease_expires_at,
        head_seq=row.head_seq,
        state=state,
        hidden=row.hidden,
    )
