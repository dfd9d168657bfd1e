"""effects: the transactional outbox."""

from oncewire.effects.attempt import Attempt
from oncewire.effects.outbox import DEFAULT_MAX_ATTEMPTS, Effects
from oncewire.effects.outcomes import Done, EffectOutcome, MaybeSent, NotSent, Rejected
from oncewire.storage.records import TERMINAL_STATES, Effect, EffectState

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "TERMINAL_STATES",
    "Attempt",
    "Done",
    "Effect",
    "EffectOutcome",
    "EffectState",
    "Effects",
    "MaybeSent",
    "NotSent",
    "Rejected",
]
