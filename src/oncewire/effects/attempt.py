"""What a sink is called with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Attempt"]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One call of a sink for one effect.

    ``redelivery`` is True when an earlier attempt may have reached the receiver: a receiver
    that deduplicates by ``key`` turns that into one effect; one that cannot should say so.
    ``fence`` grows with every claim; a receiver may refuse a write carrying an older fence.
    ``number`` counts every call of a sink for this effect, not-sent ones included, so it never
    repeats for one effect; ``Effect.attempts`` counts only those charged against
    ``max_attempts`` (a ``NotSent`` attempt gives its charge back).
    """

    key: str
    kind: str
    payload: Any
    number: int
    redelivery: bool
    fence: int
    deadline: float | None = None

    def headers(self) -> dict[str, str]:
        """Conventional HTTP headers for this attempt."""
        headers = {"Idempotency-Key": self.key, "Oncewire-Attempt": str(self.number)}
        if self.redelivery:
            headers["Oncewire-Redelivery"] = "1"
        return headers
