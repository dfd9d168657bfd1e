"""effects: the transactional outbox."""

from oncewire.effects.attempt import Attempt
from oncewire.effects.outbox import DEFAULT_MAX_ATTEMPTS, Effects, EffectsView
from oncewire.effects.outcomes import Done, MaybeSent, NotSent, Outcome, Rejected
from oncewire.storage.records import TERMINAL_STATES, Effect, EffectState

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "TERMINAL_STATES",
    "Attempt",
    "Done",
    "Effect",
    "EffectState",
    "Effects",
    "EffectsView",
    "MaybeSent",
    "NotSent",
    "Outcome",
    "Rejected",
]
