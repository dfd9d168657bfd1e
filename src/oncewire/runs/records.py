"""What the run ledger speaks in: statuses, side-effect classes and the records it returns."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ACTIVE_STATUSES",
    "TERMINAL_STATUSES",
    "WORLD_CHANGING",
    "ActionState",
    "CommandResult",
    "CompletionDelivery",
    "Projection",
    "ReconcileReport",
    "Run",
    "RunEvent",
    "RunState",
    "SideEffectClass",
    "Verdict",
    "Verification",
]


class RunState(enum.StrEnum):
    """Where a run stands: active (running to unsettled) or terminal (verified to cancelled)."""

    RUNNING = "running"  # started; no candidate yet
    CANDIDATE = "candidate"  # a candidate result exists; not (yet) verified
    REVIEWING = "reviewing"  # a review phase is open on the current candidate
    REPAIRING = "repairing"  # a repair phase is open
    UNSETTLED = "unsettled"  # a repair closed without a known outcome; only a terminal follows
    VERIFIED = "verified"  # terminal: the last review of the final candidate passed
    COMPLETED_WITH_ISSUES = "completed_with_issues"  # terminal: reviewed, issues remain
    REVIEW_UNAVAILABLE = "review_unavailable"  # terminal: no review could be completed
    OUTCOME_UNKNOWN = "outcome_unknown"  # terminal: actions may have changed the world, unknown
    FAILED = "failed"  # terminal: the run failed (or, when shown, its history did)
    CANCELLED = "cancelled"  # terminal: withdrawn by its caller or an operator


ACTIVE_STATUSES = frozenset(
    {
        RunState.RUNNING,
        RunState.CANDIDATE,
        RunState.REVIEWING,
        RunState.REPAIRING,
        RunState.UNSETTLED,
    }
)
TERMINAL_STATUSES = frozenset(set(RunState) - ACTIVE_STATUSES)


class Verdict(enum.StrEnum):
    """What a review concluded about the current candidate."""

    PASS = "pass"  # the reviewer found the candidate sound
    ISSUES = "issues"  # the reviewer found issues (findings say which)
    FAILED = "failed"  # the reviewer rejected the candidate
    REVIEW_UNAVAILABLE = "review_unavailable"  # no verdict: the review could not finish


class SideEffectClass(enum.StrEnum):
    """What an action may change; anything but read_only counts as world-changing."""

    READ_ONLY = "read_only"  # reads only; cannot change anything
    WORKSPACE_WRITE = "workspace_write"  # writes the run's own workspace
    EXTERNAL = "external"  # changes the world outside (a ticket, a payment, a message)
    UNKNOWN = "unknown"  # not classified: treated as world-changing


WORLD_CHANGING = frozenset(
    {SideEffectClass.WORKSPACE_WRITE, SideEffectClass.EXTERNAL, SideEffectClass.UNKNOWN}
)


class ActionState(enum.StrEnum):
    """Where an action of a run stands: proposed before it runs, then what is known of it."""

    PROPOSED = "proposed"  # recorded before it ran; its outcome is not known yet
    SUCCEEDED = "succeeded"  # it ran and its effect happened
    FAILED = "failed"  # it ran and failed; its effect did not happen
    NOT_RUN = "not_run"  # it was never started


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One event of a run's hash chain."""

    cursor: int  # scope-wide, only grows
    run_id: str
    seq: int
    type: str
    key: str
    request_digest: str
    terminal: bool
    payload: dict[str, Any]
    prev_hash: str
    hash: str
    at: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor,
            "run_id": self.run_id,
            "seq": self.seq,
            "type": self.type,
            "key": self.key,
            "request_digest": self.request_digest,
            "terminal": self.terminal,
            "payload": self.payload,
            "prev_hash": self.prev_hash,
            "hash": self.hash,
            "at": self.at,
        }


@dataclass(frozen=True, slots=True)
class Run:
    """A run as the ledger shows it.

    ``status`` is what may be relied on. When the history failed verification it is
    ``failed`` with ``terminal_reason == "safety_boundary"``, and ``claimed_status`` keeps the
    status the storage claimed; otherwise ``claimed_status`` is None.
    """

    run_id: str
    scope: str
    branch: str
    turn: str | None
    workflow: str
    status: str
    terminal_reason: str | None
    created_at: float | None
    finished_at: float | None
    abandoned_at: float | None
    abandon_reason: str | None
    owner: str | None
    fence: int
    lease_expires_at: float | None
    head_seq: int
    state: dict[str, Any]
    hidden: bool = False
    claimed_status: str | None = None
    fault: str | None = None

    @property
    def active(self) -> bool:
        # Whatever the workflow's statuses: a run is active until its terminal or its release.
        return self.finished_at is None and self.abandoned_at is None and not self.fault

    @property
    def candidate(self) -> dict[str, Any] | None:
        value = self.state.get("candidate")
        return value if isinstance(value, dict) else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "scope": self.scope,
            "branch": self.branch,
            "turn": self.turn,
            "workflow": self.workflow,
            "status": self.status,
            "terminal_reason": self.terminal_reason,
            "claimed_status": self.claimed_status,
            "fault": self.fault,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "abandoned_at": self.abandoned_at,
            "abandon_reason": self.abandon_reason,
            "hidden": self.hidden,
            "owner": self.owner,
            "fence": self.fence,
            "lease_expires_at": self.lease_expires_at,
            "head_seq": self.head_seq,
            "state": self.state,
        }


@dataclass(frozen=True, slots=True)
class Projection:
    """What a branch shows: its current run folded from the events visible on it."""

    scope: str
    branch: str
    cursor: int | None  # the view's upper bound (None: the branch head)
    run: Run | None
    events: list[RunEvent] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Verification:
    """The result of verifying one run's history."""

    run_id: str
    ok: bool
    events: int
    first_bad_seq: int | None = None
    reason: str | None = None
    claimed_status: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "ok": self.ok,
            "events": self.events,
            "first_bad_seq": self.first_bad_seq,
            "reason": self.reason,
            "claimed_status": self.claimed_status,
        }


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What reconciliation did to one run or delivery (also stored as a report row)."""

    subject: str  # "run" or "delivery"
    subject_id: str
    run_id: str | None
    outcome: str  # terminal | abandoned | deferred | settled | refused | failed
    status: str | None = None  # the run's status or the delivery's review status afterwards
    reason: str | None = None
    error: str | None = None
    finished_at: float | None = None
    # As stored (``runs.reports()``): the sweep that wrote it, by whom and when.
    pass_id: str | None = None
    owner: str | None = None
    created_at: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "subject_id": self.subject_id,
            "run_id": self.run_id,
            "outcome": self.outcome,
            "status": self.status,
            "reason": self.reason,
            "error": self.error,
            "finished_at": self.finished_at,
        }


@dataclass(frozen=True, slots=True)
class CompletionDelivery:
    """A completion delivery: the final message and its manifest, committed together."""

    delivery_id: str
    key: str
    scope: str
    branch: str
    turn: str | None
    run_id: str | None
    content: str
    content_sha256: str
    manifest: dict[str, Any]
    manifest_sha256: str
    review_status: str
    status: str  # committed | published
    recovery: dict[str, Any] | None
    created_at: float
    published_at: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "delivery_id": self.delivery_id,
            "key": self.key,
            "scope": self.scope,
            "branch": self.branch,
            "turn": self.turn,
            "run_id": self.run_id,
            "content": self.content,
            "content_sha256": self.content_sha256,
            "manifest": self.manifest,
            "manifest_sha256": self.manifest_sha256,
            "review_status": self.review_status,
            "status": self.status,
            "recovery": self.recovery,
            "created_at": self.created_at,
            "published_at": self.published_at,
        }


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a command did: the event it appended (or replayed) and the run after that event."""

    run: Run
    event: RunEvent
    replayed: bool
