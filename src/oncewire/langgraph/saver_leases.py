"""The thread leases an OncewireSaver holds, and the heartbeat that keeps them while it works.

Writing to a thread needs its lease (a fenced named lease, ``langgraph.thread:<id>``). The saver
takes it once (:meth:`ThreadLeases.claim`, or inside a new thread's first append) and keeps it
across that thread's writes: a write checks the fence in its own transaction (the store's fast
append) without extending the lease, and the lease is extended only when a third of it has gone
by, by the write that finds it so (the general append, which extends it in its transaction) or
by the heartbeat.

The heartbeat is one daemon thread per saver, started with the first lease it holds, that wakes
every sixth of ``lease_seconds`` and extends each lease past a third of its time, so a node that
runs longer than ``lease_seconds`` without writing keeps its thread while its process is alive
(a process that dies, or stops, stops renewing: its lease runs out and another may resume).
It keeps a lease while the thread is in use: claimed by :meth:`ThreadLeases.claim` (as
``durable_invoke`` and resumes do) until :meth:`ThreadLeases.release`, or written to within the
last ``hold_seconds``; an idle thread's lease is left to run out, as before, so that another
process can take the thread over. A renewal refused because the fence moved marks the thread
lost: the saver's next write to it is refused (:class:`ThreadLeaseLost`) before anything is
written.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref

from oncewire.core.clock import Clock
from oncewire.core.errors import OncewireError, StaleFence, ThreadBusy, ThreadLeaseLost
from oncewire.storage import LangGraphStore
from oncewire.storage.langgraph import lease_name
from oncewire.storage.verbs.leases import Lease

__all__ = ["DEFAULT_HOLD_SECONDS", "ThreadLeases"]

DEFAULT_HOLD_SECONDS = 600.0

log = logging.getLogger("oncewire.langgraph")


class ThreadLeases:
    """The leases one saver (one ``owner``) holds; thread-safe. See the module docstring."""

    def __init__(
        self,
        store: LangGraphStore,
        clock: Clock,
        *,
        owner: str,
        lease_seconds: float,
        hold_seconds: float,
        heartbeat: bool,
    ) -> None:
        self.store, self.clock, self.owner = store, clock, owner
        self.lease_seconds = lease_seconds
        self.hold_seconds = hold_seconds
        self.heartbeat = heartbeat
        self._lock = threading.Lock()
        self._held: dict[str, Lease] = {}
        self._lost: set[str] = set()
        self._pinned: set[str] = set()  # claimed: kept until released
        self._used: dict[str, float] = {}  # thread -> time.monotonic() of its last write
        self._beating: tuple[int, threading.Event] | None = None  # (pid, stop)

    # -- taking and giving back ----------------------------------------------------------------
    def claim(self, thread_id: str, *, pin: bool) -> Lease:
        """Take the thread's lease (at once when free, ran out, or held by a dead process on
        this host), or :class:`ThreadBusy`. ``pin``: kept by the heartbeat until released."""
        now = self.clock.now()
        name = lease_name(thread_id)
        lease = self.store.acquire_lease(
            name, owner=self.owner, lease_seconds=self.lease_seconds, now=now
        )
        if lease is None:
            held = self.store.get_lease(name)
            raise ThreadBusy(
                f"thread {thread_id!r} is owned by {held.owner if held else 'another process'!r} "
                "until its lease runs out; nothing was written",
                thread_id=thread_id,
                owner=held.owner if held else None,
            )
        with self._lock:
            self._lost.discard(thread_id)
            if pin:
                self._pinned.add(thread_id)
        self.record(thread_id, lease)
        return lease

    def release(self, thread_id: str) -> bool:
        with self._lock:
            lease = self._held.pop(thread_id, None)
            self._pinned.discard(thread_id)
            self._used.pop(thread_id, None)
        if lease is None:
            return False
        return self.store.release_lease(
            lease.name, owner=self.owner, fence=lease.fence, now=self.clock.now()
        )

    def record(self, thread_id: str, lease: Lease) -> None:
        """``lease`` is held (taken, or extended by a write); the heartbeat starts if needed."""
        with self._lock:
            self._held[thread_id] = lease
            self._used[thread_id] = time.monotonic()
        if self.heartbeat:
            self._start()

    def used(self, thread_id: str) -> None:
        with self._lock:
            self._used[thread_id] = time.monotonic()

    # -- what a write relies on ----------------------------------------------------------------
    def held(self, thread_id: str) -> Lease | None:
        """The lease held on the thread, or :class:`ThreadLeaseLost` once it was taken over."""
        with self._lock:
            lease = self._held.get(thread_id)
            lost = thread_id in self._lost
        if lost:
            raise ThreadLeaseLost(
                f"thread {thread_id!r} was taken over by another process; this saver writes "
                "to it again only after reading its latest state; nothing was written",
                thread_id=thread_id,
                owner=self.owner,
            )
        return lease

    def due(self, lease: Lease, now: float) -> bool:
        """Whether a third of the lease has gone by since it was taken or last extended."""
        return now - lease.updated_at >= self.lease_seconds / 3

    def lose(self, thread_id: str) -> None:
        with self._lock:
            self._held.pop(thread_id, None)
            self._pinned.discard(thread_id)
            self._lost.add(thread_id)

    def found_again(self, thread_id: str) -> None:
        """The thread's latest state was read: writing to it again is allowed."""
        with self._lock:
            self._lost.discard(thread_id)

    # -- the heartbeat -------------------------------------------------------------------------
    def _start(self) -> None:
        with self._lock:
            if self._beating is not None and self._beating[0] == os.getpid():
                return  # running (a forked child starts its own: threads do not survive a fork)
            stop = threading.Event()
            self._beating = (os.getpid(), stop)
        interval = max(self.lease_seconds / 6, 0.01)  # renewed between a third and a half
        beat = threading.Thread(
            target=_beat,
            args=(weakref.ref(self), stop, interval),
            name="oncewire-langgraph-leases",
            daemon=True,
        )
        beat.start()

        def halt() -> None:  # the store is closing: no renewal may be running on it then
            stop.set()
            if beat is not threading.current_thread():
                beat.join(BEAT_JOIN_SECONDS)

        self.store.on_close(halt)

    def stop(self) -> None:
        with self._lock:
            beating, self._beating = self._beating, None
        if beating is not None:
            beating[1].set()

    def renew_due(self) -> int:
        """Extend every kept lease past a third of its time (see the module docstring); how
        many were extended."""
        now, tick = self.clock.now(), time.monotonic()
        with self._lock:
            kept = [
                (thread_id, lease)
                for thread_id, lease in self._held.items()
                if thread_id in self._pinned
                or tick - self._used.get(thread_id, tick) < self.hold_seconds
            ]
        renewed = 0
        for thread_id, lease in kept:
            if not self.due(lease, now):
                continue
            try:
                with self.store.borrowed_connection():
                    fresh = self.store.renew_lease(
                        lease.name,
                        owner=self.owner,
                        fence=lease.fence,
                        lease_seconds=self.lease_seconds,
                        now=now,
                    )
            except StaleFence:
                self.lose(thread_id)
                continue
            with self._lock:
                if self._held.get(thread_id) == lease:  # not released nor replaced meanwhile
                    self._held[thread_id] = fresh
                    renewed += 1
        return renewed


# How long closing the store waits for a renewal in flight (a statement's round trip, a busy wait).
BEAT_JOIN_SECONDS = 10.0


def _beat(ref: weakref.ref[ThreadLeases], stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        leases = ref()
        if leases is None or leases.store.closed:
            return
        try:
            leases.renew_due()
        except OncewireError as exc:  # the store is unreachable for now: the next beat retries
            log.warning("renewing LangGraph thread leases failed: %s", exc)
        del leases
