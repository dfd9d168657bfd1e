"""Column lists and row conversions of the run ledger, shared by every backend.

Booleans are written as booleans (SQLite stores them as 0 and 1) and read back with ``bool``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oncewire.storage.runs import ActionRow, DeliveryRow, EventRow, PhaseRow, RunRow

__all__ = [
    "ACTION",
    "ACTIVE",
    "BARRIER",
    "BRANCH",
    "CHECKPOINT",
    "DELIVERY",
    "EVENT",
    "FINDING",
    "KEY_PIN",
    "PHASE",
    "REPORT",
    "RUN",
    "action_values",
    "delivery_values",
    "event_row",
    "phase_row",
    "phase_values",
    "run_row",
    "run_values",
    "used_ids_query",
]

RUN = (
    "run_id, scope, branch, turn, workflow, chain, status, terminal_reason, state, head_seq, "
    "head_hash, owner, fence, lease_expires_at, created_at, updated_at, finished_at, "
    "abandoned_at, abandon_reason, hidden, key_id"
)
KEY_PIN = "run_id, key_id, head_seq, head_hash, mac, created_at"
EVENT = (
    "id, run_id, scope, branch, seq, type, idempotency_key, request_digest, terminal, payload, "
    "prev_hash, hash, at"
)
PHASE = (
    "run_id, phase_id, kind, status, verdict, candidate_id, body, result, actions_bound, "
    "opened_seq, closed_seq, opened_at, closed_at"
)
FINDING = "run_id, finding_id, phase_id, candidate_id, severity, body"
ACTION = (
    "run_id, action_id, phase_id, kind, arguments, arguments_digest, side_effect_class, "
    "resource_keys, effect_key, status, result, proposed_seq, resolved_seq"
)
BRANCH = "scope, branch, parent, view, created_at"
CHECKPOINT = "checkpoint_id, scope, branch, cursor, view, reason, metadata, created_at"
BARRIER = "scope, operation_id, branch, state, created_at, updated_at"
DELIVERY = (
    "delivery_id, idempotency_key, request_digest, scope, branch, turn, run_id, content, "
    "content_sha256, manifest, manifest_sha256, review_status, status, recovery, owner, "
    "lease_expires_at, created_at, published_at"
)
REPORT = (
    "id, pass_id, subject, subject_id, run_id, owner, outcome, status, reason, error, created_at"
)
ACTIVE = "finished_at IS NULL AND abandoned_at IS NULL"


def run_row(row: Sequence[Any]) -> RunRow:
    return RunRow(*[*row[:19], bool(row[19]), row[20]])


def event_row(row: Sequence[Any]) -> EventRow:
    return EventRow(*[*row[:8], bool(row[8]), *row[9:]])


def phase_row(row: Sequence[Any]) -> PhaseRow:
    return PhaseRow(*[*row[:8], bool(row[8]), *row[9:]])


def run_values(r: RunRow) -> tuple[Any, ...]:
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
        bool(r.hidden),
        r.key_id,
    )


def phase_values(p: PhaseRow) -> tuple[Any, ...]:
    return (
        p.run_id,
        p.phase_id,
        p.kind,
        p.status,
        p.verdict,
        p.candidate_id,
        p.body_json,
        p.result_json,
        bool(p.actions_bound),
        p.opened_seq,
        p.closed_seq,
        p.opened_at,
        p.closed_at,
    )


def action_values(a: ActionRow) -> tuple[Any, ...]:
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


def delivery_values(d: DeliveryRow) -> tuple[Any, ...]:
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


def used_ids_query(
    mark: str,
    run_id: str,
    phases: Sequence[str],
    findings: Sequence[str],
    actions: Sequence[str],
) -> tuple[str, list[Any]]:
    """One statement that finds which of these ids a run already uses (``kind, id, seq``);
    ``mark`` is the dialect's placeholder. Empty when there is nothing to look up."""
    parts: list[str] = []
    params: list[Any] = []

    def among(ids: Sequence[str]) -> str:
        params.extend(ids)
        return ", ".join([mark] * len(ids))

    if phases:
        params.append(run_id)
        parts.append(
            "SELECT kind, phase_id, opened_seq FROM oncewire_run_phases "
            f"WHERE run_id = {mark} AND phase_id IN ({among(phases)})"
        )
    if findings:
        params.append(run_id)
        parts.append(
            "SELECT 'finding', f.finding_id, p.closed_seq FROM oncewire_run_findings f "
            "LEFT JOIN oncewire_run_phases p ON p.run_id = f.run_id AND p.phase_id = f.phase_id "
            f"WHERE f.run_id = {mark} AND f.finding_id IN ({among(findings)})"
        )
    if actions:
        params.append(run_id)
        parts.append(
            "SELECT 'action', action_id, proposed_seq FROM oncewire_run_actions "
            f"WHERE run_id = {mark} AND action_id IN ({among(actions)})"
        )
    return " UNION ALL ".join(parts), params
