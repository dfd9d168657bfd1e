"""Typed outcomes of one attempt, decided where the transport knows whether bytes left."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Done", "MaybeSent", "NotSent", "Outcome", "Rejected"]


@dataclass(frozen=True, slots=True)
class Done:
    """The effect happened; ``result`` (JSON) is what the receiver returned."""

    result: Any = None


@dataclass(frozen=True, slots=True)
class NotSent:
    """Nothing reached the receiver; safe to try again (not a redelivery).

    ``retry_after`` (seconds) is the receiver's wish and wins over the backoff schedule.
    """

    reason: str = "not sent"
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class MaybeSent:
    """The attempt may have reached the receiver; the next attempt is flagged a redelivery."""

    reason: str = "outcome unknown"


@dataclass(frozen=True, slots=True)
class Rejected:
    """The receiver refused the effect; it never happened and will not be retried."""

    reason: str = "rejected"


Outcome = Done | NotSent | MaybeSent | Rejected
