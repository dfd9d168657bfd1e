"""How reconciliation treats a turn whose owner died: it leaves it to the gateway.

A turn is resumable: the gateway that boots takes it over (``runs.turn.resume``), reuses the
steps and tool results already recorded and asks the model again from there, or ends it by
what the inbox and reply ledgers say. An operator's ``oncewire runs reconcile`` therefore
changes nothing on a turn and reports it ``deferred`` (``resumable``); closing it with the
review preset's plan would invent an ending the chat never saw.
"""

from __future__ import annotations

from oncewire.runs.append import RunContext
from oncewire.runs.machine import RecoveryPlan, State

__all__ = ["RESUMABLE", "recovery_plan"]

RESUMABLE = "resumable"


def recovery_plan(ctx: RunContext, state: State) -> RecoveryPlan:
    """Defer: the turn is resumed by the gateway, never closed by reconciliation."""
    return RecoveryPlan(defer=RESUMABLE)
