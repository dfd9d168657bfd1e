"""The run ledger's part of the Store seam: records and domain verbs.

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

import abc
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oncewire.storage.base import Transaction

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
    "RunVerbs",
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


class RunVerbs(abc.ABC):
    """Domain verbs of the run ledger. ``tx`` is what :meth:`Store.transaction` yields."""

    # -- runs and their chains ---------------------------------------------------------------
    @abc.abstractmethod
    def insert_run_in_tx(self, tx: Transaction, row: RunRow) -> bool:
        """Insert a new run row (no events yet) unless its id exists or its branch already has
        an active run; return whether it was inserted."""

    @abc.abstractmethod
    def get_run_in_tx(self, tx: Transaction, run_id: str) -> RunRow | None: ...

    @abc.abstractmethod
    def command_context_in_tx(
        self, tx: Transaction, run_id: str, key: str
    ) -> CommandContext | None:
        """The run, its head event, the event under ``key`` and its scope's held barrier."""

    @abc.abstractmethod
    def active_run_on_branch_in_tx(
        self, tx: Transaction, scope: str, branch: str
    ) -> RunRow | None: ...

    @abc.abstractmethod
    def event_by_key_in_tx(self, tx: Transaction, run_id: str, key: str) -> EventRow | None: ...

    @abc.abstractmethod
    def event_at_in_tx(self, tx: Transaction, run_id: str, seq: int) -> EventRow | None: ...

    @abc.abstractmethod
    def append_run_event_in_tx(self, tx: Transaction, change: RunAppend) -> EventRow:
        """Insert the event (extending the run's head), then write the run row and the phase,
        finding and action rows. Returns the event with its cursor."""

    @abc.abstractmethod
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

    @abc.abstractmethod
    def update_run_lease_in_tx(
        self,
        tx: Transaction,
        run_id: str,
        *,
        owner: str | None,
        fence: int,
        lease_expires_at: float | None,
        now: float,
    ) -> None: ...

    @abc.abstractmethod
    def abandon_run_in_tx(self, tx: Transaction, run_id: str, *, reason: str, now: float) -> bool:
        """Mark an active run abandoned (no terminal is written); return whether it was."""

    @abc.abstractmethod
    def set_runs_hidden_in_tx(self, tx: Transaction, hidden: dict[str, bool]) -> None: ...

    @abc.abstractmethod
    def held_barrier_in_tx(self, tx: Transaction, scope: str) -> BarrierRow | None: ...

    @abc.abstractmethod
    def read_snapshot(self) -> AbstractContextManager[None]:
        """Every read this thread makes inside the block sees one moment of the store (a read
        transaction: deferred ``BEGIN`` on SQLite, ``REPEATABLE READ, READ ONLY`` on
        PostgreSQL). Inside a transaction already open on this thread it adds nothing. A
        verified read takes one, so that it never judges a run from two moments at once."""

    @abc.abstractmethod
    def get_run(self, run_id: str) -> RunRow | None: ...

    @abc.abstractmethod
    def run_key_pin(self, run_id: str) -> KeyPinRow | None:
        """The key pin of a keyless run (read on this thread's connection, so inside its
        transaction or snapshot)."""

    @abc.abstractmethod
    def unpinned_keyless_runs_in_tx(self, tx: Transaction) -> list[RunRow]:
        """Every keyless run without a key pin, locked where the backend locks rows."""

    @abc.abstractmethod
    def insert_key_pins_in_tx(self, tx: Transaction, rows: Sequence[KeyPinRow]) -> None: ...

    @abc.abstractmethod
    def list_runs(
        self,
        *,
        scope: str | None = None,
        statuses: Sequence[str] = (),
        limit: int = 100,
        after_run_id: str = "",
    ) -> list[RunRow]: ...

    @abc.abstractmethod
    def run_events(self, run_id: str) -> list[EventRow]:
        """Every event of the run's chain, by ``seq``."""

    @abc.abstractmethod
    def run_chain(
        self, run_id: str, *, after_seq: int = 0
    ) -> list[tuple[int, int, str, str, str, str]]:
        """``(cursor, seq, type, prev_hash, hash, payload_json)`` by seq: the lean read that
        verification needs."""

    @abc.abstractmethod
    def orphan_event_runs(self) -> list[tuple[str, int]]:
        """``(run_id, events)`` for events whose run row does not exist (an edited store)."""

    @abc.abstractmethod
    def run_projections(
        self, run_id: str
    ) -> tuple[list[PhaseRow], list[FindingRow], list[ActionRow]]: ...

    @abc.abstractmethod
    def expired_runs(
        self, *, now: float, limit: int, dead_owners: Sequence[str] = ()
    ) -> list[RunRow]:
        """Active runs whose lease expired before ``now`` or whose owner is known dead, oldest
        first."""

    @abc.abstractmethod
    def active_run_owners(self) -> list[str]:
        """The distinct owners of active runs."""

    @abc.abstractmethod
    def branch_runs_in_tx(self, tx: Transaction, scope: str, branch: str) -> list[RunRow]:
        """Every run started on this branch (a revert recomputes which are hidden)."""

    # -- branches, checkpoints, barriers -----------------------------------------------------
    @abc.abstractmethod
    def get_branch_in_tx(self, tx: Transaction, scope: str, branch: str) -> BranchRow | None: ...

    @abc.abstractmethod
    def put_branch_in_tx(self, tx: Transaction, row: BranchRow) -> None:
        """Insert the branch or replace its view."""

    @abc.abstractmethod
    def get_branch(self, scope: str, branch: str) -> BranchRow | None: ...

    @abc.abstractmethod
    def insert_checkpoint_in_tx(self, tx: Transaction, row: CheckpointRow) -> bool:
        """Insert unless the id exists; return whether it was inserted."""

    @abc.abstractmethod
    def get_checkpoint_in_tx(self, tx: Transaction, checkpoint_id: str) -> CheckpointRow | None: ...

    @abc.abstractmethod
    def scope_cursor_in_tx(self, tx: Transaction, scope: str) -> int:
        """The cursor of the newest event of ``scope`` (0 when it has none)."""

    @abc.abstractmethod
    def max_cursor_in_tx(self, tx: Transaction) -> int:
        """The newest cursor in the whole store."""

    @abc.abstractmethod
    def latest_event_in_view(
        self, scope: str, segments: Sequence[tuple[str, int, int | None]], upto: int | None
    ) -> EventRow | None:
        """The newest event of ``scope`` inside the visible segments ``(branch, after, upto)``."""

    @abc.abstractmethod
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
    ) -> None: ...

    @abc.abstractmethod
    def put_barrier_in_tx(self, tx: Transaction, row: BarrierRow) -> None:
        """Insert the barrier or update its state (one held barrier per scope)."""

    @abc.abstractmethod
    def get_barrier_in_tx(
        self, tx: Transaction, scope: str, operation_id: str
    ) -> BarrierRow | None: ...

    # -- deliveries --------------------------------------------------------------------------
    @abc.abstractmethod
    def insert_delivery_in_tx(self, tx: Transaction, row: DeliveryRow) -> DeliveryRow:
        """Insert unless the idempotency key exists; return the stored row either way."""

    @abc.abstractmethod
    def get_delivery_in_tx(self, tx: Transaction, delivery_id: str) -> DeliveryRow | None: ...

    @abc.abstractmethod
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

    @abc.abstractmethod
    def get_delivery(self, delivery_id: str) -> DeliveryRow | None: ...

    @abc.abstractmethod
    def committed_deliveries(self, *, now: float, limit: int) -> list[DeliveryRow]:
        """Committed, unpublished deliveries whose owner's lease expired before ``now``."""

    @abc.abstractmethod
    def runs_for_turn_in_tx(
        self, tx: Transaction, scope: str, branch: str, turn: str | None
    ) -> list[RunRow]: ...

    # -- reports -----------------------------------------------------------------------------
    @abc.abstractmethod
    def insert_report_in_tx(self, tx: Transaction, row: ReportRow) -> None: ...

    @abc.abstractmethod
    def list_reports(self, *, limit: int = 100, subject_id: str | None = None) -> list[ReportRow]:
        """The newest reports first."""
