"""Riding out a store outage: how long to wait before trying again, and when to give up.

The database may go away for a while (a restart, a failover, the network). The dispatcher keeps
the outcomes it has not recorded yet and tries its store step again: they are fenced, so a retry
after a commit whose answer was lost is refused rather than applied twice. It backs off from
0.1 s to 2 s, and after ``patience_seconds`` of failures in a row it gives up and raises, so an
outage that will not end is an error someone sees rather than a worker that waits forever.

Each outage backs off from its own first failure: a worker that rode out one outage earlier
does not meet the next with its longest wait.
"""

from __future__ import annotations

from oncewire.core.errors import ConfigurationError

__all__ = ["MAX_DELAY_SECONDS", "Outage", "check_patience"]

MAX_DELAY_SECONDS = 2.0
_FIRST_DELAY_SECONDS = 0.05  # doubled before the first wait: the first retry comes after 0.1 s


def check_patience(seconds: float) -> float:
    """A patience of 0 or more seconds (``inf``: never give up); NaN, which no outage would
    ever exceed, is refused with the rest."""
    if isinstance(seconds, bool) or not (isinstance(seconds, int | float) and seconds >= 0):
        raise ConfigurationError(
            "storage_patience_seconds must be 0 or more seconds (inf: never give up)"
        )
    return float(seconds)


class Outage:
    """The store calls that failed in a row, since when: the backoff's state."""

    def __init__(self, patience_seconds: float) -> None:
        self.patience_seconds = patience_seconds
        self.since: float | None = None  # time.monotonic() of this outage's first failure
        self.failures = 0  # store calls failed in a row, this outage: the backoff's exponent

    def over(self) -> None:
        """A store call succeeded: the next failure starts a new outage."""
        self.since, self.failures = None, 0

    def too_long(self, now: float) -> str:
        """What to say when the worker gives up at ``now``."""
        lasted = 0.0 if self.since is None else now - self.since
        return (
            f"store unavailable for {lasted:.1f}s, longer than storage_patience_seconds "
            f"({self.patience_seconds:g}s)"
        )

    def failed(self, now: float) -> float | None:
        """Count a failure at ``now`` (time.monotonic); the seconds to wait before trying
        again, or None once the outage has lasted longer than the patience (give up)."""
        if self.since is None:
            self.since = now
        self.failures += 1
        if now - self.since > self.patience_seconds:
            return None
        return min(MAX_DELAY_SECONDS, _FIRST_DELAY_SECONDS * (1 << min(self.failures, 6)))
