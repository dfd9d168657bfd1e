"""Where sinks run: worker threads for plain sinks, one event loop thread for ``async def`` ones.

The dispatcher's own thread never calls a sink: it queues calls here and reads what finished
from one completion queue, so it can record outcomes as they come, give up on an attempt that
takes too long, and leave on a signal while a sink hangs. Store calls stay on the dispatcher's
thread.

* Plain sinks: up to ``concurrency`` worker threads take calls from one queue. A thread whose
  call timed out is abandoned (a thread cannot be stopped from outside): it is replaced, and
  when its call ever returns the answer is dropped, because the attempt was already recorded.
* ``async def`` sinks: the runner owns one event loop in a thread of its own; at most
  ``concurrency`` coroutines are in flight. A timed-out coroutine is cancelled. When the
  dispatcher stops, each async sink that has an ``async def aclose()`` is awaited on the loop
  (a connection it made there is closed there), then the loop stops.

A call that has not started when the dispatcher stops is taken back (:meth:`SinkRunner.
take_unstarted`): its sink was never called, so the dispatcher can say so.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from oncewire.core.canonical import loads
from oncewire.core.clock import Clock
from oncewire.dispatch.sinkspec import SinkSpec
from oncewire.effects.attempt import Attempt
from oncewire.storage.records import Claim

if TYPE_CHECKING:
    import asyncio

__all__ = ["Call", "SinkRunner", "attempt_of", "form_calls"]

log = logging.getLogger("oncewire.dispatch")

_ids = itertools.count(1)
SINK_CLOSE_SECONDS = 2.0  # each async sink's aclose(), when the dispatcher stops
_thread_numbers = itertools.count(1)


@dataclass(eq=False, slots=True)
class Call:
    """One call of a sink: one attempt, or a whole batch of one kind (``call_batch``)."""

    spec: SinkSpec
    claims: list[Claim]
    attempts: list[Attempt]
    batch: bool
    id: int = field(default_factory=lambda: next(_ids))
    # Set by the runner, under its lock.
    started: bool = False  # the sink was called (or its coroutine created)
    started_at: float | None = None  # the dispatcher's clock, when the sink was called
    started_monotonic: float | None = None  # set only when the call has a timeout
    finished_at: float | None = None
    value: Any = None
    error: BaseException | None = None
    finished: bool = False  # the sink returned or raised; the call is in the completion queue
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


def attempt_of(claim: Claim) -> Attempt:
    """What the sink of ``claim`` is called with; raises if its payload does not decode."""
    return Attempt(
        key=claim.key,
        kind=claim.kind,
        payload=loads(claim.payload_json),
        # Every call of a sink for this effect, not-sent ones included (they give their
        # charge back, so claim.attempt can repeat): the fence grows with every claim.
        number=claim.fence,
        redelivery=claim.redelivery,
        fence=claim.fence,
        deadline=claim.deadline,
    )


def form_calls(specs: Mapping[str, SinkSpec], pairs: Sequence[tuple[Claim, Attempt]]) -> list[Call]:
    """The calls for claimed attempts: one per attempt, except that the attempts of a kind
    whose sink has ``call_batch`` go in one call (a lone one too, if it has no plain call)."""
    by_kind: dict[str, list[tuple[Claim, Attempt]]] = {}
    for claim, attempt in pairs:
        by_kind.setdefault(claim.kind, []).append((claim, attempt))
    calls: list[Call] = []
    for kind, group in by_kind.items():
        spec = specs[kind]
        if spec.batch is not None and (len(group) > 1 or spec.call is None):
            calls.append(Call(spec, [c for c, _ in group], [a for _, a in group], batch=True))
        else:
            calls.extend(Call(spec, [c], [a], batch=False) for c, a in group)
    return calls


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
    """Runs the calls it is given; reports each one in :attr:`completions` once it finished.

    A worker thread takes the next waiting call as soon as its previous call returns, under one
    lock acquisition and one reading of the clock (the moment a call finished is the moment the
    next one started), so a batch of plain calls costs one thread handoff, not one per call.
    Each call is still marked started and finished on its own: a call that times out is given
    up on alone, and the calls that had not started yet are taken by another thread.
    """

    def __init__(self, concurrency: int, clock: Clock) -> None:
        self.concurrency = concurrency
        self.clock = clock
        self.completions: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closing = False
        self._running: dict[int, Call] = {}  # started, neither finished nor abandoned
        # Plain sinks: calls not started, in order; workers block on _wakeups when idle.
        self._waiting: deque[Call] = deque()  # guarded by _lock
        self._wakeups: queue.SimpleQueue[bool | None] = queue.SimpleQueue()  # None: leave
        self._threads = 0  # live worker threads, not counting abandoned ones
        self._idle = 0  # workers blocked on _wakeups with no wakeup owed to them
        # Async sinks.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._async_waiting: deque[Call] = deque()  # guarded by _lock
        self._async_running = 0  # only touched on the loop
        self._async_sinks: dict[int, Any] = {}  # the async sinks called, by id: closed at the end
        # Starting a call that leaves fewer than this many waiting wakes the dispatcher (a None in
        # completions), so it can record the next calls as starting while this one runs. 0: never.
        self.low_water = 0

    # -- what the dispatcher looks at -----------------------------------------------------------
    def has_room(self) -> bool:
        """Every call submitted has started and a sink slot is free: more work can start."""
        return (
            not self._waiting
            and not self._async_waiting
            and (len(self._running) < self.concurrency)
        )

    def waiting(self) -> int:
        """Calls submitted that have not started yet."""
        return len(self._waiting) + len(self._async_waiting)

    def timing(self) -> list[Call]:
        """The running calls that have a deadline (see :meth:`Call.deadline`)."""
        with self._lock:
            return [call for call in self._running.values() if call.started_monotonic is not None]

    def overdue(self) -> list[Call]:
        """The running calls whose timeout has passed."""
        now = time.monotonic()
        return [
            call
            for call in self.timing()
            if (deadline := call.deadline()) is not None and deadline <= now
        ]

    def until_timeout(self, longest: float) -> float:
        """Seconds until the first running call times out: ``longest`` at most, 0 at least."""
        now = time.monotonic()
        for call in self.timing():
            deadline = call.deadline()
            if deadline is not None:
                longest = min(longest, deadline - now)
        return max(longest, 0.0)

    # -- submitting --------------------------------------------------------------------------
    def submit(self, calls: list[Call]) -> None:
        """Queue ``calls`` (to start in this order, up to ``concurrency`` at a time)."""
        plain = [call for call in calls if not call.is_async]
        if len(plain) < len(calls):
            with self._lock:
                self._async_waiting.extend(call for call in calls if call.is_async)
            self._ensure_loop().call_soon_threadsafe(self._pump)
        if not plain:
            return
        with self._lock:
            self._waiting.extend(plain)
            wake = min(len(plain), self._idle)
            self._idle -= wake
            spawn = min(len(plain) - wake, self.concurrency - self._threads)
            self._threads += spawn
        for _ in range(wake):
            self._wakeups.put(True)
        for _ in range(spawn):
            self._spawn()

    def _begin(self, call: Call, now: float) -> None:
        """Mark ``call`` started (under the lock)."""
        call.started = True
        call.started_at = now
        if call.spec.timeout_seconds is not None:
            call.started_monotonic = time.monotonic()
        self._running[call.id] = call

    def _end(self, call: Call, value: Any, error: BaseException | None, now: float) -> bool:
        """Mark ``call`` finished (under the lock); False if it was abandoned meanwhile."""
        if call.abandoned:
            return False  # already recorded as timed out, or left behind at the end
        call.value, call.error, call.finished_at = value, error, now
        call.finished = True
        del self._running[call.id]
        return True

    def _next(self, waiting: deque[Call], now: float) -> Call | None:
        """Take and start the next call of ``waiting`` (under the lock); None: nothing to
        start, or the runner is closing."""
        while waiting and not self._closing:
            call = waiting.popleft()
            if not call.abandoned:  # left behind before it started: never call its sink
                self._begin(call, now)
                if len(self._waiting) + len(self._async_waiting) < self.low_water:
                    self.completions.put(None)
                return call
        return None

    def abandon(self, call: Call) -> bool:
        """Give up on a started ``call``: False if it finished first (its answer is queued)."""
        with self._lock:
            if call.finished or call.abandoned:
                return False
            call.abandoned = True
            self._running.pop(call.id, None)
            replace = call.started and not call.is_async
        if replace:
            self._spawn()  # that thread is lost to its call; a new one takes its place
        elif call.is_async and call.future is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(call.future.cancel)
        return True

    def take_unstarted(self) -> list[Call]:
        """Stop starting calls; return the queued ones (their sinks were never called)."""
        with self._lock:
            self._closing = True
            unstarted = [*self._waiting, *self._async_waiting]
            self._waiting.clear()
            self._async_waiting.clear()
        return unstarted

    # -- threads -----------------------------------------------------------------------------
    def _spawn(self) -> None:
        name = f"oncewire-sink-{next(_thread_numbers)}"
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        lock, waiting = self._lock, self._waiting
        call: Call | None = None  # the call this thread just ran
        value: Any = None
        error: BaseException | None = None
        while True:
            now = self.clock.now()
            with lock:
                done = call is not None and self._end(call, value, error, now)
                lost = call is not None and not done  # abandoned: replaced by another thread
                following = None
                if not lost:
                    following = self._next(waiting, now)
                    if following is None:
                        self._idle += 1
            if done:
                self.completions.put(call)
            if lost:
                return
            call, value, error = following, None, None
            if call is None:
                if self._wakeups.get() is None:
                    return
                continue
            try:
                value = _invoke(call)
            except BaseException as exc:  # the sink may have acted before raising
                error = exc

    # -- the event loop ----------------------------------------------------------------------
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            import asyncio  # here: a process whose sinks are all plain never loads it

            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="oncewire-sink-loop", daemon=True
            )
            thread.start()
            self._loop, self._loop_thread = loop, thread
        return self._loop

    def _pump(self) -> None:  # on the loop
        import asyncio

        while self._async_running < self.concurrency:
            now = self.clock.now()
            with self._lock:
                call = self._next(self._async_waiting, now)
            if call is None:
                return
            self._async_running += 1
            self._async_sinks.setdefault(id(call.spec.sink), call.spec.sink)
            call.future = asyncio.ensure_future(self._run_async(call))

    async def _run_async(self, call: Call) -> None:  # on the loop
        import asyncio

        try:
            value = await _invoke(call)
        except asyncio.CancelledError as exc:
            if call.abandoned:  # timed out, or left behind: already recorded
                log.info("attempt(s) %s cancelled", ", ".join(call.keys))
            else:  # the sink's own doing: it raised, and may have acted before
                self._finish(call, None, exc)
        except BaseException as exc:  # the sink may have acted before raising
            self._finish(call, None, exc)
        else:
            self._finish(call, value, None)
        finally:
            self._async_running -= 1
            self._pump()

    def _finish(self, call: Call, value: Any, error: BaseException | None) -> None:
        now = self.clock.now()
        with self._lock:
            done = self._end(call, value, error, now)
        if done:
            self.completions.put(call)

    # -- the end -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop idle workers and the event loop. Abandoned threads are daemons: left behind."""
        with self._lock:
            self._closing = True
            threads = self._threads
        for _ in range(threads):
            self._wakeups.put(None)
        loop, thread = self._loop, self._loop_thread
        self._loop = self._loop_thread = None
        if loop is None or thread is None:
            return
        import asyncio  # an event loop ran: already loaded

        # An async sink's own resources (a connection made on this loop) are closed on it.
        closing = asyncio.run_coroutine_threadsafe(_aclose(self._async_sinks.values()), loop)
        try:
            closing.result(timeout=SINK_CLOSE_SECONDS + 1)
        except Exception:  # closing is a courtesy; the loop is stopped either way
            log.warning("async sinks did not close within %ss", SINK_CLOSE_SECONDS)

        def shut() -> None:
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.call_soon(loop.stop)

        loop.call_soon_threadsafe(shut)
        thread.join(timeout=2)
        if not thread.is_alive():
            loop.close()


async def _aclose(sinks: Any) -> None:
    """Await each sink's ``aclose()`` (if it has one), each for at most SINK_CLOSE_SECONDS."""
    import asyncio

    for sink in list(sinks):
        aclose = getattr(sink, "aclose", None)
        if aclose is None:
            continue
        try:
            await asyncio.wait_for(aclose(), SINK_CLOSE_SECONDS)
        except Exception:
            log.warning("closing the sink %r failed", sink, exc_info=True)
