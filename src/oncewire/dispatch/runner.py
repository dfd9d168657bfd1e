"""Where sinks run: worker threads for plain sinks, one event loop thread for ``async def`` ones.

The dispatcher's own thread never calls a sink: it queues calls here and reads what finished
from one completion queue, so it can record outcomes as they come, give up on an attempt that
takes too long, and leave on a signal while a sink hangs. Store calls stay on the dispatcher's
thread.

* Plain sinks: up to ``concurrency`` worker threads take calls from one queue. A thread whose
  call timed out is abandoned (a thread cannot be stopped from outside): it is replaced, and
  when its call ever returns the answer is dropped, because the attempt was already recorded.
* ``async def`` sinks: the runner owns one event loop in a thread of its own; at most
  ``concurrency`` coroutines are in flight. A timed-out coroutine is cancelled.

A call that has not started when the dispatcher stops is taken back (:meth:`SinkRunner.
take_unstarted`): its sink was never called, so the dispatcher can say so.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from oncewire.core.clock import Clock
from oncewire.dispatch.sinkspec import SinkSpec
from oncewire.effects.attempt import Attempt
from oncewire.storage.records import Claim

__all__ = ["Call", "SinkRunner"]

log = logging.getLogger("oncewire.dispatch")

_ids = itertools.count(1)
_thread_numbers = itertools.count(1)


@dataclass(eq=False)
class Call:
    """One call of a sink: one attempt, or a whole batch of one kind (``call_batch``)."""

    spec: SinkSpec
    claims: list[Claim]
    attempts: list[Attempt]
    batch: bool
    id: int = field(default_factory=lambda: next(_ids))
    # Set by the runner, under its lock.
    started_at: float | None = None  # the dispatcher's clock, when the sink was called
    started_monotonic: float | None = None
    finished_at: float | None = None
    value: Any = None
    error: BaseException | None = None
    finished: bool = False  # the sink returned or raised; the call is in the completion queue
    skipped: bool = False  # never started (the runner was closing); in the completion queue
    abandoned: bool = False  # timed out or left behind: whatever it returns is dropped
    future: Any = None  # the event loop's future for an async call

    @property
    def is_async(self) -> bool:
        return self.spec.batch_is_async if self.batch else self.spec.call_is_async

    @property
    def keys(self) -> list[str]:
        return [claim.key for claim in self.claims]

    def deadline(self) -> float | None:
        """When (time.monotonic) this call times out; None: not started or no timeout."""
        timeout = self.spec.timeout_seconds
        if timeout is None or self.started_monotonic is None:
            return None
        return self.started_monotonic + timeout


# What the completion queue carries: a finished call, or None (look at the world again).
Completion = Call | None


def _invoke(call: Call) -> Any:
    """Call the sink (for an async sink: create its coroutine)."""
    if call.batch:
        assert call.spec.batch is not None
        return call.spec.batch(call.attempts)
    assert call.spec.call is not None
    return call.spec.call(call.attempts[0])


class SinkRunner:
    def __init__(self, concurrency: int, clock: Clock) -> None:
        self.concurrency = concurrency
        self.clock = clock
        self.completions: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closing = False
        # Plain sinks.
        self._jobs: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._threads = 0  # live worker threads, not counting abandoned ones
        self._idle = 0  # workers waiting for a job
        # Async sinks.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._async_waiting: deque[Call] = deque()  # guarded by _lock
        self._async_running = 0  # only touched on the loop

    # -- submitting --------------------------------------------------------------------------
    def submit(self, call: Call) -> None:
        if call.is_async:
            with self._lock:
                self._async_waiting.append(call)
            self._ensure_loop().call_soon_threadsafe(self._pump)
            return
        with self._lock:
            spawn = self._idle == 0 and self._threads < self.concurrency
            if spawn:
                self._threads += 1
        self._jobs.put(call)
        if spawn:
            self._spawn()

    def _start(self, call: Call) -> bool:
        """Mark ``call`` started, unless it must not start (the runner is closing: then it is
        handed back through the completion queue as never started)."""
        with self._lock:
            if call.abandoned:
                return False
            if self._closing:
                call.skipped = True
            else:
                call.started_at = self.clock.now()
                call.started_monotonic = time.monotonic()
                return True
        self.completions.put(call)
        return False

    def _finish(self, call: Call, value: Any, error: BaseException | None) -> None:
        finished_at = self.clock.now()
        with self._lock:
            if call.abandoned:
                return  # already recorded as timed out, or left behind at the end
            call.value, call.error, call.finished_at = value, error, finished_at
            call.finished = True
        self.completions.put(call)

    def abandon(self, call: Call) -> bool:
        """Give up on a started ``call``: False if it finished first (its answer is queued)."""
        with self._lock:
            if call.finished or call.skipped:
                return False
            call.abandoned = True
            replace = call.started_monotonic is not None and not call.is_async
        if replace:
            self._spawn()  # that thread is lost to its call; a new one takes its place
        elif call.is_async and call.future is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(call.future.cancel)
        return True

    def take_unstarted(self) -> list[Call]:
        """Stop starting calls; return the queued ones (their sinks were never called).

        A call a worker took at this very moment comes back through the completion queue
        instead, marked ``skipped``.
        """
        with self._lock:
            self._closing = True
            unstarted = list(self._async_waiting)
            self._async_waiting.clear()
        stops = 0
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                stops += 1
            else:
                unstarted.append(job)
        for _ in range(stops):
            self._jobs.put(None)
        return unstarted

    # -- threads -----------------------------------------------------------------------------
    def _spawn(self) -> None:
        name = f"oncewire-sink-{next(_thread_numbers)}"
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            call = self._jobs.get()
            with self._lock:
                self._idle -= 1
            if call is None:
                return
            if not self._start(call):
                continue
            try:
                value = _invoke(call)
            except BaseException as exc:  # the sink may have acted before raising
                self._finish(call, None, exc)
            else:
                self._finish(call, value, None)
            if call.abandoned:
                return  # another thread took this one's place when it was abandoned

    # -- the event loop ----------------------------------------------------------------------
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="oncewire-sink-loop", daemon=True
            )
            thread.start()
            self._loop, self._loop_thread = loop, thread
        return self._loop

    def _pump(self) -> None:  # on the loop
        while self._async_running < self.concurrency:
            with self._lock:
                if not self._async_waiting:
                    return
                call = self._async_waiting.popleft()
            if not self._start(call):
                continue
            self._async_running += 1
            call.future = asyncio.ensure_future(self._run_async(call))

    async def _run_async(self, call: Call) -> None:  # on the loop
        try:
            value = await _invoke(call)
        except asyncio.CancelledError:
            log.info("attempt(s) %s cancelled", ", ".join(call.keys))
        except BaseException as exc:  # the sink may have acted before raising
            self._finish(call, None, exc)
        else:
            self._finish(call, value, None)
        finally:
            self._async_running -= 1
            self._pump()

    # -- the end -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop idle workers and the event loop. Abandoned threads are daemons: left behind."""
        with self._lock:
            self._closing = True
            threads = self._threads
        for _ in range(threads):
            self._jobs.put(None)
        loop, thread = self._loop, self._loop_thread
        self._loop = self._loop_thread = None
        if loop is None or thread is None:
            return

        def shut() -> None:
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.call_soon(loop.stop)

        loop.call_soon_threadsafe(shut)
        thread.join(timeout=2)
        if not thread.is_alive():
            loop.close()
