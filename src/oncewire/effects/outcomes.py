"""Typed outcomes of one attempt, decided where the transport knows whether bytes left.

A sink returns one of these (or a plain JSON value, which means ``Done(value)``). They check
what they are given when they are built, so a mistake in a sink fails where it is made instead
of being stored: ``NotSent(retry_after=-1)`` raises :class:`ConfigurationError`, and a reason
that is not text is stored as its ``str()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from oncewire.core.errors import ConfigurationError
from oncewire.core.limits import MAX_RETRY_SECONDS

__all__ = ["OUTCOME_TYPES", "Done", "EffectOutcome", "MaybeSent", "NotSent", "Rejected"]


def _text(value: object) -> str:
    return value if isinstance(value, str) else str(value)


@dataclass(frozen=True, slots=True)
class Done:
    """The effect happened; ``result`` (JSON) is what the receiver returned."""

    result: Any = None


@dataclass(frozen=True, slots=True)
class NotSent:
    """Nothing reached the receiver; safe to try again (not a redelivery).

    ``retry_after`` (seconds, finite, not negative) is the receiver's wish and wins over the
    backoff schedule; more than :data:`~oncewire.core.limits.MAX_RETRY_SECONDS` (a day) is
    clamped to it. A not-sent attempt does not count against the effect's ``max_attempts``
    (nothing was sent); the effect's deadline bounds how long it keeps trying, or, without a
    deadline, ``RetryPolicy.max_not_sent``.
    """

    reason: str = "not sent"
    retry_after: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", _text(self.reason))
        wait = self.retry_after
        if wait is None:
            return
        # bool is an int: NotSent(retry_after=True) is a mistake, not one second.
        if isinstance(wait, bool) or not isinstance(wait, int | float):
            raise ConfigurationError(
                f"NotSent.retry_after must be a number of seconds, not {type(wait).__name__}"
            )
        try:
            seconds = float(wait)  # an int too large for a float would overflow in the backoff
        except OverflowError:
            seconds = math.inf
        if not (0 <= seconds < math.inf):  # written so that NaN fails too
            raise ConfigurationError(
                f"NotSent.retry_after must be finite and not negative, not {wait!r}"
            )
        # Longer is "later", not "never": the receiver is asked again after the limit.
        object.__setattr__(self, "retry_after", min(seconds, float(MAX_RETRY_SECONDS)))


@dataclass(frozen=True, slots=True)
class MaybeSent:
    """The attempt may have reached the receiver; the next attempt is flagged a redelivery."""

    reason: str = "outcome unknown"

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", _text(self.reason))


@dataclass(frozen=True, slots=True)
class Rejected:
    """The receiver refused the effect; it never happened and will not be retried."""

    reason: str = "rejected"

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", _text(self.reason))


EffectOutcome = Done | NotSent | MaybeSent | Rejected
OUTCOME_TYPES: tuple[type, ...] = (Done, NotSent, MaybeSent, Rejected)
