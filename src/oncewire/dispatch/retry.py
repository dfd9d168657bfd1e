"""When to try again: exponential backoff with jitter and a cap; a receiver's wish wins."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from oncewire.core.errors import ConfigurationError
from oncewire.core.limits import MAX_RETRY_SECONDS
from oncewire.storage.records import Backlog
from oncewire.storage.verbs.effects import MAX_RECOVERIES

__all__ = ["DEFAULT_IDLE_HORIZON_SECONDS", "RetryPolicy", "drained"]

# How far ahead run(until_idle=True) waits for a retry: the longest backoff of the default
# policy (cap_seconds), so a drain sees every retry it schedules itself through.
DEFAULT_IDLE_HORIZON_SECONDS = 300.0


@dataclass(frozen=True)
class RetryPolicy:
    """Delay before attempt ``n + 1`` after attempt ``n`` failed.

    ``base_seconds * 2 ** (n - 1)``, capped at ``cap_seconds`` (and, whatever the cap, at
    :data:`~oncewire.core.limits.MAX_RETRY_SECONDS`, a day), then scaled by a random factor in
    ``[1 - jitter, 1]`` so that workers retrying the same receiver spread out. ``base_seconds``
    above ``cap_seconds`` (300 by default) is refused: the cap would silently replace it.

    ``max_not_sent`` bounds an effect without a deadline that its receiver keeps turning away
    before anything is sent (``NotSent``, a long 429 storm): such attempts do not count against
    ``max_attempts``, so without this cap they could go on forever. At the ``max_not_sent``-th
    not-sent attempt in a row the effect is ``dead`` ("never sent"); a charged attempt or an
    operator's retry starts the count again. An effect with a deadline is bounded by its
    deadline instead.

    ``max_recoveries`` bounds the times a dispatcher may die (or lose its lease) while an
    effect's sink runs. Such an attempt does not count against ``max_attempts`` (the crash is
    usually not the effect's fault, and one crash would otherwise charge every effect in
    flight); at the ``max_recoveries``-th the effect is ``dead`` ("its dispatcher died while its
    sink ran, N times"). An effect with recoveries is claimed alone, so an effect that kills its
    process every time uses up only its own.
    """

    base_seconds: float = 0.5
    cap_seconds: float = 300.0
    jitter: float = 0.5
    max_not_sent: int = 100
    max_recoveries: int = MAX_RECOVERIES
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Written so that NaN fails too; an infinite cap means "no cap".
        if not (0 <= self.base_seconds < math.inf and self.cap_seconds >= 0):
            raise ConfigurationError(
                "base_seconds must be finite and not negative; cap_seconds not negative"
            )
        if self.base_seconds > self.cap_seconds:  # the cap would silently replace the base
            raise ConfigurationError(
                f"base_seconds ({self.base_seconds:g}) is above cap_seconds "
                f"({self.cap_seconds:g}): every delay would be the cap; raise cap_seconds too"
            )
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigurationError("jitter must be between 0 and 1")
        if isinstance(self.max_not_sent, bool) or not (
            isinstance(self.max_not_sent, int) and self.max_not_sent >= 1
        ):
            raise ConfigurationError("max_not_sent must be a whole number of at least 1")
        if isinstance(self.max_recoveries, bool) or not (
            isinstance(self.max_recoveries, int) and self.max_recoveries >= 1
        ):
            raise ConfigurationError("max_recoveries must be a whole number of at least 1")

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait, never more than :data:`MAX_RETRY_SECONDS` (whatever the cap, an
        infinite one included, and whatever the receiver asked)."""
        if retry_after is not None and 0 <= retry_after < math.inf:
            return min(float(retry_after), MAX_RETRY_SECONDS)
        exponent = min(max(attempt - 1, 0), 62)
        raw = min(self.cap_seconds, MAX_RETRY_SECONDS, self.base_seconds * (2.0**exponent))
        return raw * (1.0 - self.jitter * self.rng.random())


def drained(backlog: Backlog, now: float, horizon_seconds: float) -> bool:
    """Whether ``run(until_idle=True)`` is done: nothing claimed, nothing due now, and no
    retry (an uncertain effect's next attempt, or a pending one already attempted) due within
    ``horizon_seconds``.

    A pending effect whose first attempt is scheduled later (``delay_seconds``) does not keep a
    drain waiting; a retry under way does, unless it is due past the horizon (a receiver's long
    ``retry_after``). Written so that a time no clock reaches (NaN, stored around oncewire) is
    never due.
    """
    if backlog.claimed:
        return False
    if backlog.next_retry is not None and backlog.next_retry <= now + horizon_seconds:
        return False
    return backlog.next_due is None or not backlog.next_due <= now
