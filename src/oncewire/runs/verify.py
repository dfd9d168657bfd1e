"""Verifying a run's history: the chain, the fold, and the rows that claim to project it.

Three layers, each catching what the one before cannot:

1. the hash chain (an edited byte, a swapped order, a deleted or moved event);
2. the fold through the transition table (an event no command could have produced, even when a
   tamperer recomputed its hash: a changed type, a verdict bound to another candidate);
3. the stored projections against the fold (the run row's status, the review, finding and
   action rows), so an edit to a projection table cannot make a run claim what its events don't.

A failure names the first bad event. Nothing here writes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from oncewire.core.canonical import canonical_json_unchecked, digest_json, digest_unchecked
from oncewire.runs.chain import chain_name, verify_chain
from oncewire.runs.machine import NEW, Refusal, Step, apply_command, workflow
from oncewire.runs.records import Verification
from oncewire.storage.runs import ActionRow, EventRow, FindingRow, PhaseRow, RunRow

__all__ = ["Audit", "audit", "fold"]


@dataclass(frozen=True, slots=True)
class Audit:
    verification: Verification
    state: dict[str, Any] | None  # the folded state (None when the fold failed)
    states: dict[int, dict[str, Any]]  # snapshots after the requested sequence numbers

    @property
    def ok(self) -> bool:
        return self.verification.ok


class _Fault(Exception):
    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(reason)
        self.seq = seq
        self.reason = reason


def _copy(state: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(json.dumps(state))
    return result


def fold(
    row: RunRow,
    events: Sequence[EventRow],
    *,
    snapshots: Sequence[int] = (),
) -> tuple[dict[str, Any], dict[str, list[Any]], dict[int, dict[str, Any]]]:
    """Fold ``events`` through the run's workflow; raise :class:`_Fault` at the first illegal one.

    Returns the state, the projection rows the events imply, and state snapshots after the
    sequence numbers asked for.
    """
    try:
        flow = workflow(row.workflow)
    except Refusal as exc:
        raise _Fault(1, exc.reason) from None
    state: dict[str, Any] = {"status": NEW}
    phases: dict[str, PhaseRow] = {}
    findings: dict[str, FindingRow] = {}
    actions: dict[str, ActionRow] = {}
    taken: dict[int, dict[str, Any]] = {}
    wanted = set(snapshots)
    for event in events:
        seq = event.seq
        if event.run_id != row.run_id or event.scope != row.scope or event.branch != row.branch:
            raise _Fault(seq, "the event is bound to another run, scope or branch")
        try:
            payload = json.loads(event.payload_json)
        except ValueError:
            raise _Fault(seq, "its payload is not JSON") from None
        if not isinstance(payload, dict):
            raise _Fault(seq, "its payload is not an object")
        command, request = payload.get("command"), payload.get("request")
        if (
            payload.get("key") != event.idempotency_key
            or payload.get("digest") != event.request_digest
        ):
            raise _Fault(seq, "its key or request digest columns do not match its payload")
        try:
            if digest_unchecked({"command": command, "request": request}) != event.request_digest:
                raise _Fault(seq, "its request digest does not match its request")
        except (TypeError, ValueError):
            raise _Fault(seq, "its request is not canonical JSON") from None
        transition = flow.by_event.get(event.type)
        if transition is None or transition.command != command:
            raise _Fault(seq, f"event type {event.type!r} is not what {command!r} produces")
        if event.terminal != transition.terminal:
            raise _Fault(seq, "its terminal flag does not match its type")
        if not isinstance(request, dict):
            raise _Fault(seq, "its request is not an object")
        at = payload.get("at")
        if not isinstance(at, (int, float)) or at != event.at:
            raise _Fault(seq, "its timestamp does not match its payload")
        try:
            _, rows = apply_command(
                flow,
                state,
                str(command),
                request,
                Step(row.run_id, seq, float(at), payload.get("by")),
            )
        except Refusal as exc:
            raise _Fault(seq, f"no command could have produced it: {exc.reason}") from None
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise _Fault(seq, f"its request is malformed ({type(exc).__name__}: {exc})") from None
        for phase in rows.phases:
            if phase.opened_seq == seq and phase.phase_id in phases:
                raise _Fault(seq, f"phase id {phase.phase_id!r} is opened twice")
            phases[phase.phase_id] = phase
        for finding in rows.findings:
            if finding.finding_id in findings:
                raise _Fault(seq, f"finding {finding.finding_id!r} is recorded twice")
            findings[finding.finding_id] = finding
        for action in rows.actions:
            old = actions.get(action.action_id)
            if old is not None and action.proposed_seq == seq:
                raise _Fault(seq, f"action id {action.action_id!r} is proposed twice")
            if old is not None:
                # A resolution only fills in how the proposed action ended (as the store does).
                action = replace(
                    old,
                    status=action.status,
                    result_json=action.result_json,
                    resolved_seq=action.resolved_seq,
                )
            actions[action.action_id] = action
        if seq in wanted:
            taken[seq] = _copy(state)
    return (
        state,
        {
            "phases": list(phases.values()),
            "findings": list(findings.values()),
            "actions": list(actions.values()),
        },
        taken,
    )


def _compare_rows(
    expected: dict[str, list[Any]],
    phases: Sequence[PhaseRow],
    findings: Sequence[FindingRow],
    actions: Sequence[ActionRow],
) -> tuple[int, str] | None:
    checks: list[tuple[str, list[Any], Sequence[Any], str]] = [
        ("review/repair phase", expected["phases"], phases, "phase_id"),
        ("finding", expected["findings"], findings, "finding_id"),
        ("action", expected["actions"], actions, "action_id"),
    ]
    for label, wanted, stored, key in checks:
        want = {getattr(item, key): item for item in wanted}
        have = {getattr(item, key): item for item in stored}
        for name in sorted(set(want) | set(have)):
            if want.get(name) != have.get(name):
                source = want.get(name) or have.get(name)
                seq = _seq_of(source)
                return seq, f"the stored {label} {name!r} does not match the history"
    return None


def _seq_of(row: Any) -> int:
    for name in ("closed_seq", "resolved_seq", "opened_seq", "proposed_seq"):
        value = getattr(row, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1


def audit(
    row: RunRow,
    events: Sequence[EventRow],
    projections: tuple[Sequence[PhaseRow], Sequence[FindingRow], Sequence[ActionRow]] | None,
    key: bytes | None,
    *,
    snapshots: Sequence[int] = (),
) -> Audit:
    """Verify one run completely. ``projections`` None skips the projection-table check."""

    def failed(seq: int | None, reason: str) -> Audit:
        return Audit(
            Verification(row.run_id, False, len(events), seq, reason, claimed_status=row.status),
            None,
            {},
        )

    if row.chain != chain_name(key):
        return failed(
            1,
            f"the run's chain is {row.chain} but the ledger was opened "
            + ("with a key" if key else "without a key"),
        )
    fault, last_seq, last_hash, _ = verify_chain(
        row.run_id,
        ((e.id, e.seq, e.type, e.prev_hash, e.hash, e.payload_json) for e in events),
        key,
    )
    if fault is not None:
        return failed(fault.seq, fault.reason)
    if not events:
        return failed(1, "the run has no events")
    if last_seq != row.head_seq or last_hash != row.head_hash:
        return failed(min(last_seq, row.head_seq) + 1, "the run row's head is not the chain's head")
    try:
        state, expected, taken = fold(row, events, snapshots=snapshots)
    except _Fault as exc:
        return failed(exc.seq, exc.reason)
    head = events[-1]
    state_json = canonical_json_unchecked(state)
    problems = []
    if json.loads(head.payload_json).get("state") != digest_json(state_json):
        problems.append("the head event's state digest does not match the folded state")
    try:
        stored_state = json.loads(row.state_json)
    except ValueError:
        stored_state = None
    if stored_state != state:
        problems.append("the run row's state is not the folded state")
    terminal = state["status"] in workflow(row.workflow).terminal_statuses
    if (
        row.status != state["status"]
        or row.terminal_reason != (state["reason"] if terminal else None)
        or row.finished_at != state["finished_at"]
        or (row.scope, row.branch, row.turn, row.workflow)
        != (state["scope"], state["branch"], state["turn"], state["workflow"])
    ):
        problems.append("the run row's columns are not the folded state")
    released = state.get("abandoned") is not None
    if released and row.abandoned_at is None:
        problems.append("the run row hides the release its history records")
    if not released and row.abandoned_at is not None and row.abandon_reason != "safety_boundary":
        problems.append("the run row claims a release its history does not record")
    if problems:
        return failed(head.seq, problems[0])
    if projections is not None:
        mismatch = _compare_rows(expected, *projections)
        if mismatch is not None:
            return failed(*mismatch)
    return Audit(Verification(row.run_id, True, len(events)), state, taken)
