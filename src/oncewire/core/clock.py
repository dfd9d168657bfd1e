"""An injectable clock, so leases, backoff and retention are testable without sleeping; and
how a stored time is printed."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock", "iso_utc"]


def iso_utc(ts: float) -> str:
    """A Unix time as ISO 8601 in UTC, with milliseconds and the zone.

    Any number a row can hold is printed, never raised on: a time no calendar date has (NaN,
    infinite, past the year 9999 or before the year 1, written around oncewire's limits) is
    ``"<seconds> (not a date)"``.
    """
    try:
        return dt.datetime.fromtimestamp(float(ts), dt.UTC).isoformat(timespec="milliseconds")
    except (OverflowError, ValueError, OSError):
        return f"{ts!r} (not a date)"


class Clock(Protocol):
    """Where oncewire reads the time and waits: leases, backoff, deadlines and retention use it."""

    def now(self) -> float:
        """Seconds since the Unix epoch (wall clock: stored in rows and compared across hosts)."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait up to ``seconds`` for ``event``; True if it was set."""
        ...


class SystemClock:
    """The real clock: wall-clock time, real sleeps (the default of every ``Ledger``)."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(0.0, seconds))


class ManualClock:
    """A clock that moves only when told to (``sleep`` advances it)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Does not block: time jumps to the end of the wait unless the event is already set,
        so a dispatcher waiting for a retry under a manual clock moves on instead of hanging."""
        if not event.is_set():
            self.advance(max(0.0, seconds))
        return event.is_set()
