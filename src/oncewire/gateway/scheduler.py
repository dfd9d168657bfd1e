"""The gateway's scheduler: which turn starts now, on which worker, and what a turn's end means.

One :class:`Scheduler` per process runs on its own thread (:meth:`Scheduler.run`). It starts
turns (:mod:`oncewire.gateway.turn`) on a pool of ``[turns] max_concurrent`` worker threads, one
turn per session at a time (the run ledger's one-active-run-per-branch index holds it; the
scheduler only avoids asking twice). It waits on the store's commits, not on a timer: it looks
when the inbox changes (an admission, a turn answered or superseded, an interrupt recorded, by
this process or another) or one of its turns ends, and reads only each free session's first
waiting message (``inbound.queued``). At each look it also reads the status of the turns it
runs: one whose interrupt was recorded has its worker signalled (its model stream or tool wait
ends), and the worker ends it ``interrupted``.

What it holds is this process's view of its turns: the ones running (per session), the
sessions found busy with another process's turn, the turns to resume (with the fence their
dead owner held) and the turns that stopped while the store was away. The platforms it serves
are the :mod:`~oncewire.gateway.supervisor`'s, asked at each look.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from oncewire.core.errors import OncewireError
from oncewire.gateway.deliveries import OUTAGE_LOOK_SECONDS, SAFETY_LOOK_SECONDS
from oncewire.gateway.model_results import Interrupt
from oncewire.gateway.outage import StoreOutage, store_away
from oncewire.gateway.turn import TurnResult, TurnWorker
from oncewire.ledger import Ledger

__all__ = ["Scheduler", "SessionKey"]

# The runner's logger: an operator reads one gateway log (docs/deploy.md quotes its lines).
log = logging.getLogger("oncewire.gateway.runner")

SessionKey = tuple[str, str, str, str]  # platform, bot, chat, thread


@dataclass
class _Running:
    inbound_id: int
    interrupt: Interrupt
    future: Future[TurnResult]


class Scheduler:
    """Start turns as slots and sessions free up, and follow them to their end."""

    def __init__(
        self,
        ledger: Ledger,
        worker: TurnWorker,
        *,
        owner: str,
        max_concurrent: int,
        served: Callable[[], list[str]],
        wake: threading.Event,
        stop: threading.Event,
        safety_look_seconds: float = SAFETY_LOOK_SECONDS,
    ) -> None:
        self.ledger = ledger
        self.worker = worker
        self.owner = owner
        self.limit = max_concurrent
        self.safety_look_seconds = safety_look_seconds
        self._served = served
        self._stop = stop
        self._pool = ThreadPoolExecutor(max_concurrent, thread_name_prefix="turn")
        self._wake = wake  # set to look again now (shared with whoever stops the process)
        self._store_changed = threading.Event()  # a commit the scheduler waits for
        self._lock = threading.Lock()
        self._running: dict[SessionKey, _Running] = {}
        # Sessions whose turn is another process's (a start was refused busy): not asked again
        # before a commit that may have ended it.
        self._busy: set[SessionKey] = set()
        self._resumes: dict[int, int] = {}  # inbound id -> the fence its dead owner held
        # Turns of this process that stopped on an error while their run could not be read
        # (the store was away): read again at each look until it answers.
        self._unread: set[int] = set()

    # -- what the rest of the process tells it ---------------------------------------------
    def wake(self) -> None:
        """Look again now (a message admitted, a platform taken over, the drain begun)."""
        self._wake.set()

    def held(self) -> set[int]:
        """The inbound ids of the turns this process runs or is about to resume: a sweep for
        turns to take over leaves them alone."""
        with self._lock:
            return set(self._resumes) | {item.inbound_id for item in self._running.values()}

    def resume(self, resumes: dict[int, int]) -> None:
        """Turns to take over (inbound id -> the fence their dead owner held)."""
        if resumes:
            with self._lock:
                self._resumes.update(resumes)

    # -- the thread ------------------------------------------------------------------------
    def run(self) -> None:
        """Start turns as slots and sessions free up: woken by the inbox's commits (an
        admission, a turn answered or superseded, an interrupt recorded, in any process) and by
        this process's turns ending; see :data:`SAFETY_LOOK_SECONDS` for the looks without."""

        def changed() -> None:
            self._store_changed.set()
            self._wake.set()

        unsubscribe = self.ledger.store.subscribe_inbound(changed)
        try:
            self._loop()
        finally:
            unsubscribe()

    def _loop(self) -> None:
        scheduling = StoreOutage(log, "scheduling")
        while not self._stop.is_set():
            self._wake.clear()
            if self._store_changed.is_set():
                self._store_changed.clear()
                with self._lock:
                    self._busy.clear()  # the commit may have ended their turns: ask again
            away = False
            try:
                self._look()
            except Exception as exc:
                scheduling.failed(exc)
                away = True
            else:
                scheduling.answered()
            with self._lock:
                away = away or bool(self._unread)
            if not self._wake.wait(OUTAGE_LOOK_SECONDS if away else self.safety_look_seconds):
                self._store_changed.set()  # a look without a wake-up asks every session again

    def _look(self) -> None:
        self._read_unread()
        self._signal_interrupts()
        for inbound_id, session, fence in self._candidates():
            with self._lock:
                if self._stop.is_set() or len(self._running) >= self.limit:
                    break
                if session in self._running:
                    continue
                interrupt = Interrupt()
                future = self._pool.submit(
                    self.worker.run, inbound_id, interrupt, resume_fence=fence
                )
                self._running[session] = _Running(inbound_id, interrupt, future)
                if fence is not None:
                    self._resumes.pop(inbound_id, None)
            future.add_done_callback(functools.partial(self._finished, session))

    def _signal_interrupts(self) -> None:
        """Signal the workers whose turn has an interrupt recorded (the store is the truth)."""
        with self._lock:
            running = list(self._running.values())
        for item in running:
            if item.interrupt.is_set():
                continue
            try:
                status = self.ledger.runs.get(f"turn:{item.inbound_id}").status
            except OncewireError:
                continue  # not started yet (or a /stop, which has no turn)
            if status == "interrupting":
                log.info("inbound %s: its turn's interrupt is recorded; signalled", item.inbound_id)
                item.interrupt.interrupt()

    def _candidates(self) -> list[tuple[int, SessionKey, int | None]]:
        """Turns to start now, oldest first: the resumes, then each free session's first
        message, as many as there are free slots (one indexed read: the sessions this process
        runs, or found busy, are asked for on top and left out here)."""
        found: list[tuple[int, SessionKey, int | None]] = []
        serving = self._served()
        with self._lock:
            resumes = sorted(self._resumes.items())
            taken = set(self._running) | self._busy
            free = self.limit - len(self._running)
        for inbound_id, fence in resumes:
            inbound = self.ledger.inbound.get(inbound_id)
            if inbound.platform not in serving:
                continue  # its lease was lost: the process holding it now resumes it
            key = (inbound.platform, inbound.bot, inbound.chat, inbound.thread)
            taken.add(key)
            found.append((inbound_id, key, fence))
        if free <= len(found) or not serving:
            return found
        # Each session offers one message, so at most len(taken) of these are left out.
        for inbound in self.ledger.inbound.queued(serving, limit=free - len(found) + len(taken)):
            key = (inbound.platform, inbound.bot, inbound.chat, inbound.thread)
            if key not in taken:
                found.append((inbound.id, key, None))
        return found

    # -- a turn's end ----------------------------------------------------------------------
    def _finished(self, session: SessionKey, done: Future[TurnResult]) -> None:
        with self._lock:
            running = self._running.pop(session, None)
        try:
            result = done.result()
        except BaseException as exc:
            if store_away(exc):
                # Nothing of the turn is recorded that did not happen (its commit failed); it
                # is still this process's, and is taken over again once the store answers.
                log.warning(
                    "inbound %s: its turn stopped: the store is unavailable (%s)",
                    running.inbound_id if running is not None else "?",
                    exc,
                )
            else:
                log.exception("a turn failed unexpectedly")
            if running is not None and not self._stop.is_set():
                self._retry(running.inbound_id)
        else:
            if result.status == "quarantined":
                log.warning("inbound %s: quarantined after too many starts", result.inbound_id)
            elif result.status == "busy":
                # Another process's turn holds the session: asked again after a commit that
                # may have ended it (not at once: that would only be refused again).
                log.debug("inbound %s: its session is busy", result.inbound_id)
                with self._lock:
                    self._busy.add(session)
        self._wake.set()  # a slot is free

    def _retry(self, inbound_id: int) -> None:
        """A turn that raised is still active under this process: take it over again (one
        more start: past max_starts its message is quarantined, so a message that keeps
        failing cannot hold its session for ever)."""
        try:
            run = self.ledger.runs.get(f"turn:{inbound_id}")
        except Exception as exc:
            if store_away(exc):
                # Read again at the scheduler's next looks: the turn is resumed as soon as the
                # store answers, not only once its turn lease has run out.
                with self._lock:
                    self._unread.add(inbound_id)
                return
            log.exception("inbound %s: its turn cannot be read; left to the next start", inbound_id)
            return
        with self._lock:
            self._unread.discard(inbound_id)
        if run.active and run.owner == self.owner:
            with self._lock:
                self._resumes[inbound_id] = run.fence

    def _read_unread(self) -> None:
        """Read again the turns that stopped while the store was away (see :meth:`_retry`)."""
        with self._lock:
            unread = sorted(self._unread)
        for inbound_id in unread:
            self._retry(inbound_id)

    # -- the drain -------------------------------------------------------------------------
    def drain(self, deadline: float) -> None:
        """Let the running turns finish until ``deadline`` (``time.monotonic``); interrupt the
        ones still running then where they stand (left to the next process, which resumes
        them), and shut the pool down."""
        with self._lock:
            running = list(self._running.values())
        for item in running:
            try:
                item.future.result(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
            except BaseException:
                continue  # logged by _finished
        with self._lock:
            left = list(self._running.values())
        for item in left:
            log.info(
                "inbound %s still running after the grace period: interrupted", item.inbound_id
            )
            item.interrupt.interrupt()
        self._pool.shutdown(wait=True, cancel_futures=True)
