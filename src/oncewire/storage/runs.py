"""The run ledger's records; its verbs are :mod:`oncewire.storage.verbs.runs` and ``run_scopes``.

The runs layer never writes SQL. It opens a transaction with :meth:`Store.transaction`, reads
the rows a command needs with the ``*_in_tx`` verbs, decides in Python (the transition table,
the guards, the hash chain), and hands the store one :class:`RunAppend` to apply. The invariants
that matter are held by the backend's constraints (one active run per branch, one terminal
event per run, no terminal while a phase is open, the chain only grows at its head), so a bug
above this seam cannot break them.

The column lists below are what the records read, in field order; the named queries of
``storage/sql/runs.sql`` use them as ``{run_columns}``, ``{event_columns}`` and so on. Booleans are
written as booleans (SQLite stores them as 0 and 1) and read back with ``bool``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

__all__ = [
    "ACTION_COLUMNS",
    "BARRIER_COLUMNS",
    "BRANCH_COLUMNS",
    "CHECKPOINT_COLUMNS",
    "DELIVERY_COLUMNS",
    "EVENT_COLUMNS",
    "FINDING_COLUMNS",
    "KEY_PIN_COLUMNS",
    "PHASE_COLUMNS",
    "REPORT_COLUMNS",
    "RUN_COLUMNS",
    "ActionRow",
    "BarrierRow",
    "BranchRow",
    "CheckpointRow",
    "CommandContext",
    "DeliveryRow",
    "EventRow",
    "FindingRow",
    "KeyPinRow",
    "PhaseRow",
    "ReportRow",
    "RunAppend",
    "RunRow",
]

RUN_COLUMNS = (
    "run_id, scope, branch, turn, workflow, chain, status, terminal_reason, state, head_seq, "
    "head_hash, owner, fence, lease_expires_at, created_at, updated_at, finished_at, "
    "abandoned_at, abandon_reason, hidden, key_id"
)
EVENT_COLUMNS = (
    "id, run_id, scope, branch, seq, type, idempotency_key, request_digest, terminal, payload, "
    "prev_hash, hash, at"
)
PHASE_COLUMNS = (
    "run_id, phase_id, kind, status, verdict, candidate_id, body, result, actions_bound, "
    "opened_seq, closed_seq, opened_at, closed_at"
)
FINDING_COLUMNS = "run_id, finding_id, phase_id, candidate_id, severity, body"
ACTION_COLUMNS = (
    "run_id, action_id, phase_id, kind, arguments, arguments_digest, side_effect_class, "
    "resource_keys, effect_key, status, result, proposed_seq, resolved_seq"
)
BRANCH_COLUMNS = "scope, branch, parent, view, created_at"
CHECKPOINT_COLUMNS = "checkpoint_id, scope, branch, cursor, view, reason, metadata, created_at"
BARRIER_COLUMNS = "scope, operation_id, branch, state, created_at, updated_at"
DELIVERY_COLUMNS = (
    "delivery_id, idempotency_key, request_digest, scope, branch, turn, run_id, content, "
    "content_sha256, manifest, manifest_sha256, review_status, status, recovery, owner, "
    "lease_expires_at, created_at, published_at"
)
REPORT_COLUMNS = (
    "id, pass_id, subject, subject_id, run_id, owner, outcome, status, reason, error, created_at"
)
KEY_PIN_COLUMNS = "run_id, key_id, head_seq, head_hash, mac, created_at"


@dataclass(frozen=True, slots=True)
class RunRow:
    """A run as stored: the projection columns, the compact state, the chain head and lease."""

    run_id: str
    scope: str
    branch: str
    turn: str | None
    workflow: str
    chain: str  # "sha256" or "hmac-sha256"
    status: str
    terminal_reason: str | None
    state_json: str
    head_seq: int
    head_hash: str
    owner: str | None
    fence: int
    lease_expires_at: float | None
    created_at: float
    updated_at: float
    finished_at: float | None
    abandoned_at: float | None
    abandon_reason: str | None
    hidden: bool
    key_id: str | None = None  # the HMAC key's fingerprint (never the key); None when keyless

    @property
    def active(self) -> bool:
        return self.finished_at is None and self.abandoned_at is None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> RunRow:
        """The record of a row read as ``{run_columns}``."""
        return cls(*[*row[:19], bool(row[19]), row[20]])


@dataclass(frozen=True, slots=True)
class EventRow:
    """One event of a run's chain. ``id`` is the scope-wide cursor."""

    id: int
    run_id: str
    scope: str
    branch: str
    seq: int
    type: str
    idempotency_key: str
    request_digest: str
    terminal: bool
    payload_json: str
    prev_hash: str
    hash: str
    at: float

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> EventRow:
        """The record of a row read as ``{event_columns}``."""
        return cls(*[*row[:8], bool(row[8]), *row[9:]])


@dataclass(frozen=True, slots=True)
class PhaseRow:
    run_id: str
    phase_id: str
    kind: str  # "review" or "repair"
    status: str  # "open", then how it closed
    verdict: str | None
    candidate_id: str | None
    body_json: str
    result_json: str | None
    actions_bound: bool
    opened_seq: int
    closed_seq: int | None
    opened_at: float
    closed_at: float | None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> PhaseRow:
        """The record of a row read as ``{phase_columns}``."""
        return cls(*[*row[:8], bool(row[8]), *row[9:]])


@dataclass(frozen=True, slots=True)
class FindingRow:
    run_id: str
    finding_id: str
    phase_id: str
    candidate_id: str
    severity: str
    body_json: str


@dataclass(frozen=True, slots=True)
class ActionRow:
    run_id: str
    action_id: str
    phase_id: str | None
    kind: str
    arguments_json: str
    arguments_digest: str
    side_effect_class: str
    resource_keys_json: str
    effect_key: str | None
    status: str  # "proposed", then how it resolved
    result_json: str | None
    proposed_seq: int
    resolved_seq: int | None


@dataclass(frozen=True, slots=True)
class BranchRow:
    scope: str
    branch: str
    parent: str | None
    view_json: str
    created_at: float


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    checkpoint_id: str
    scope: str
    branch: str
    cursor: int
    view_json: str
    reason: str
    metadata_json: str
    created_at: float


@dataclass(frozen=True, slots=True)
class BarrierRow:
    scope: str
    operation_id: str
    branch: str | None
    state: str
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    delivery_id: str
    idempotency_key: str
    request_digest: str
    scope: str
    branch: str
    turn: str | None
    run_id: str | None
    content: str
    content_sha256: str
    manifest_json: str
    manifest_sha256: str
    review_status: str
    status: str
    recovery_json: str | None
    owner: str | None
    lease_expires_at: float | None
    created_at: float
    published_at: float | None


@dataclass(frozen=True, slots=True)
class KeyPinRow:
    """A keyless run that a key was adopted over, pinned at its head with a MAC under the key."""

    run_id: str
    key_id: str
    head_seq: int
    head_hash: str
    mac: str
    created_at: float


@dataclass(frozen=True, slots=True)
class ReportRow:
    id: int
    pass_id: str
    subject: str  # "run" or "delivery"
    subject_id: str
    run_id: str | None
    owner: str
    outcome: str
    status: str | None
    reason: str | None
    error: str | None
    created_at: float


@dataclass(frozen=True, slots=True)
class RunAppend:
    """Everything one command writes: one event, the run row after it, and its projections."""

    event: EventRow  # ``id`` is ignored: the store assigns the cursor
    run: RunRow
    phases: Sequence[PhaseRow] = field(default_factory=tuple)  # inserted or replaced
    findings: Sequence[FindingRow] = field(default_factory=tuple)  # inserted
    actions: Sequence[ActionRow] = field(default_factory=tuple)  # inserted or replaced


@dataclass(frozen=True, slots=True)
class CommandContext:
    """What a command reads before it decides, in one round trip."""

    run: RunRow
    head: EventRow | None  # the event at the run's head_seq
    prior: EventRow | None  # the event already stored under the command's key, if any
    barrier: BarrierRow | None  # the barrier held on the run's scope, if any
