"""The gateway's reply thread: deliver what is deliverable, woken by the commits that make it so.

A reply is the reply thread's to deliver once it is committed, its retry time has come and
nobody holds it (no lease, or one run out): a turn delivers its own answer itself, so the thread
takes the replies given back with a retry time (rate limited, a platform away), those committed
by a caller that does not deliver them, and those a process that died left behind. It reads only
those (``replies.deliverable``, the committed replies' index), never the delivered history.

It waits on the store, not on a timer: a commit that gives a reply back or commits one for
anyone to deliver wakes it (``subscribe_replies``: any commit on SQLite, ``NOTIFY
oncewire_replies`` on PostgreSQL, in any process); otherwise it sleeps until the next reply's
retry time or lease end (``replies.next_deliverable``). It looks without either only while the
store is away (its return is no commit) and every :data:`SAFETY_LOOK_SECONDS`, a safety net
for a change nothing announces.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from oncewire.gateway.outage import StoreOutage
from oncewire.ledger import Ledger
from oncewire.replies import ReplyEngine

__all__ = ["BATCH", "OUTAGE_LOOK_SECONDS", "SAFETY_LOOK_SECONDS", "DueDeliveries"]

log = logging.getLogger("oncewire.gateway.deliveries")

# The gateway's loops look without a wake-up at most this far apart: a safety net for a change
# that no commit announces (a turn ended by an operator, say), never their way of noticing work.
SAFETY_LOOK_SECONDS = 30.0
OUTAGE_LOOK_SECONDS = 1.0  # while the store is away, or a reply is held by a delivery under way
BATCH = 100  # replies delivered per look; a full batch is followed by another look at once


class DueDeliveries:
    """``DueDeliveries(ledger, engine, served, wake).run(stop)``: deliver the replies of the
    platforms ``served()`` names until ``stop`` is set; ``wake`` (set it to look at once: a
    platform taken over, the drain) is the thread's event, also set by the store's commits."""

    def __init__(
        self,
        ledger: Ledger,
        engine: ReplyEngine,
        served: Callable[[], list[str]],
        wake: threading.Event,
    ) -> None:
        self.ledger = ledger
        self.engine = engine
        self.served = served
        self.wake = wake

    def run(self, stop: threading.Event) -> None:
        unsubscribe = self.ledger.store.subscribe_replies(self.wake.set)
        try:
            delivering = StoreOutage(log, "delivering due replies")
            while not stop.is_set():
                self.wake.clear()
                try:
                    served = self.served()
                    wait = self.look(served) if served else SAFETY_LOOK_SECONDS
                except Exception as exc:
                    delivering.failed(exc)
                    wait = OUTAGE_LOOK_SECONDS
                else:
                    delivering.answered()
                if wait > 0:
                    self.wake.wait(wait)
        finally:
            unsubscribe()

    def look(self, served: list[str]) -> float:
        """Deliver what is deliverable now; the seconds until the next look."""
        ledger = self.ledger
        batch = ledger.replies.deliverable(served, limit=BATCH)
        passes = [self.engine.deliver(reply.id) for reply in batch]
        if len(batch) == BATCH:
            return 0.0  # more may be due
        if any(p.status == "busy" for p in passes):
            # Taken meanwhile (a turn of this engine delivering it): its holder delivers it, or
            # gives it back with a commit that wakes this thread.
            return OUTAGE_LOOK_SECONDS
        due = ledger.replies.next_deliverable(served)
        if due is None:
            return SAFETY_LOOK_SECONDS
        return min(SAFETY_LOOK_SECONDS, max(0.0, due - ledger.clock.now()))
