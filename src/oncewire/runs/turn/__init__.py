"""The turn preset: one chat turn (an inbound message, answered by a model and its tools) as a
workflow on the generic run machinery.

``table`` is the workflow (its states, guards and the rows each command projects),
``commands`` the named commands a caller reaches as ``ledger.runs.turn``, and ``recovery``
what reconciliation does with a turn whose owner died (it defers to the gateway). Importing
this package registers the workflow.
"""

from oncewire.runs.turn.commands import TurnCommands, TurnSession, text_sha256
from oncewire.runs.turn.recovery import RESUMABLE
from oncewire.runs.turn.table import (
    TURN,
    TURN_ACTIVE,
    TURN_TERMINAL,
    TurnState,
    action_id,
    effect_key,
    run_id,
)

__all__ = [
    "RESUMABLE",
    "TURN",
    "TURN_ACTIVE",
    "TURN_TERMINAL",
    "TurnCommands",
    "TurnSession",
    "TurnState",
    "action_id",
    "effect_key",
    "run_id",
    "text_sha256",
]
