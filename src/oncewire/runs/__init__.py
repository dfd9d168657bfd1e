"""runs: an event-sourced run ledger with idempotent commands, a hash-chained history,
branches, an action ledger, completion deliveries and boot reconciliation.

Reach it as ``ledger.runs`` (see :class:`oncewire.runs.service.Runs`); the review preset's
commands as ``ledger.runs.review``, the turn preset's as ``ledger.runs.turn``.
"""

from oncewire.runs.append import RunContext
from oncewire.runs.branches import Barrier, Branch, Checkpoint, Revert
from oncewire.runs.deliveries import artifact_manifest
from oncewire.runs.machine import Transition, Workflow
from oncewire.runs.records import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    WORLD_CHANGING,
    ActionState,
    CompletionDelivery,
    Projection,
    ReconcileReport,
    Run,
    RunEvent,
    RunState,
    SideEffectClass,
    Verdict,
    Verification,
)
from oncewire.runs.recovery import reconcile as reconcile
from oncewire.runs.review import REVIEW, ReviewCommands
from oncewire.runs.service import DEFAULT_LEASE_SECONDS, CommandResult, Runs
from oncewire.runs.turn import TURN, TurnCommands, TurnSession, TurnState

__all__ = [
    "ACTIVE_STATUSES",
    "DEFAULT_LEASE_SECONDS",
    "REVIEW",
    "TERMINAL_STATUSES",
    "TURN",
    "WORLD_CHANGING",
    "ActionState",
    "Barrier",
    "Branch",
    "Checkpoint",
    "CommandResult",
    "CompletionDelivery",
    "Projection",
    "ReconcileReport",
    "Revert",
    "ReviewCommands",
    "Run",
    "RunContext",
    "RunEvent",
    "RunState",
    "Runs",
    "SideEffectClass",
    "Transition",
    "TurnCommands",
    "TurnSession",
    "TurnState",
    "Verdict",
    "Verification",
    "Workflow",
    "artifact_manifest",
]
