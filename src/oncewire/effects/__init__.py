"""effects: the transactional outbox."""

from oncewire.effects.attempt import Attempt
from oncewire.effects.ledger import EffectsView, Ledger, LedgerTransaction
from oncewire.effects.outcomes import Done, MaybeSent, NotSent, Outcome, Rejected
from oncewire.storage.records import TERMINAL_STATES, Effect, EffectState

__all__ = [
    "TERMINAL_STATES",
    "Attempt",
    "Done",
    "Effect",
    "EffectState",
    "EffectsView",
    "Ledger",
    "LedgerTransaction",
    "MaybeSent",
    "NotSent",
    "Outcome",
    "Rejected",
]
