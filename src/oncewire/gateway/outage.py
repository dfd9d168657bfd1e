"""How the gateway's loops say that the store is away, and that it is back.

A loop that meets a store it cannot reach (PostgreSQL restarting, the network cut) tries again
at its own pace; a traceback a second per loop would bury the one line an operator needs. So a
transient :class:`~oncewire.core.errors.StorageError` is logged as one WARNING line when the
loop first meets it, again every :data:`REPEAT_SECONDS` while it lasts, and an INFO line says
when the store answers again and how long it was away. Any other error keeps its traceback:
it is a fault to look at, not an outage to wait out.
"""

from __future__ import annotations

import logging
import threading
import time

from oncewire.core.errors import StorageError

__all__ = ["REPEAT_SECONDS", "StoreOutage", "store_away"]

REPEAT_SECONDS = 30.0


def store_away(exc: BaseException) -> bool:
    """Whether ``exc`` says the store is unavailable for now (worth waiting out)."""
    return isinstance(exc, StorageError) and exc.transient


class StoreOutage:
    """One loop's view of the store being away; ``failed`` and ``answered`` log the changes."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log = log
        self.what = what
        self._lock = threading.Lock()
        self._since: float | None = None  # time.monotonic() of the first failure
        self._said: float = 0.0  # when the last WARNING was logged

    def failed(self, exc: BaseException) -> None:
        """Log ``exc``, met by the loop: quietly when it is the store being away."""
        if not store_away(exc):
            self.log.error("%s failed; trying again", self.what, exc_info=exc)
            return
        now = time.monotonic()
        with self._lock:
            first = self._since is None
            if first:
                self._since = now
            elif now - self._said < REPEAT_SECONDS:
                return
            self._said = now
            since = self._since or now
        if first:
            self.log.warning("%s: the store is unavailable (%s); trying again", self.what, exc)
        else:
            self.log.warning(
                "%s: the store is still unavailable after %.0fs (%s); trying again",
                self.what,
                now - since,
                exc,
            )

    def answered(self) -> None:
        """The loop's store call succeeded: say so if the store had been away."""
        with self._lock:
            since, self._since = self._since, None
        if since is not None:
            self.log.info(
                "%s: the store answers again after %.1fs", self.what, time.monotonic() - since
            )
