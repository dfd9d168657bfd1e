"""The threads an event loop hands blocking work to, and the way back to the loop.

oncewire's stores are synchronous and keep one connection per thread, so an asyncio caller's
database work runs on threads, never on the event loop:

* :class:`Worker` is one thread running the calls given to it, in order. A transaction checks
  one out of a :class:`WorkerPool` and runs every statement of its life on it (SQLite
  connections are per thread; a psycopg connection is not thread-safe either), so two
  concurrent transactions never share a connection, and a worker serves one transaction at a
  time. A call already running on a worker can keep serving calls (:meth:`Worker.serve_until`):
  that is how a receipt's transaction, opened by synchronous code, waits for ``async`` work
  whose statements run on the same thread.
* :func:`finish` awaits a call to its end even when the awaiting task is cancelled meanwhile,
  then delivers the cancellation. A call that touched a transaction is never abandoned half
  way: what it did is over, one way or the other, before the caller's next line runs.
* :class:`LoopBridge` runs a coroutine on the caller's event loop from one of these threads and
  blocks that thread (never the loop) until it is answered: how an ``async`` platform adapter
  or a caller's ``psycopg.AsyncConnection`` is awaited by synchronous code that runs on a
  thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import itertools
import queue
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from oncewire.core.errors import InvalidState

__all__ = ["LoopBridge", "Worker", "WorkerPool", "finish"]

T = TypeVar("T")

_Job = tuple[Callable[[], Any], "cf.Future[Any]"]
_numbers = itertools.count(1)


class Worker:
    """One thread that runs the calls given to it, in order (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._main, name=f"{name}-{next(_numbers)}", daemon=True
        )
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> cf.Future[T]:
        """Run ``fn()`` on this worker after the calls already given to it."""
        future: cf.Future[T] = cf.Future()
        self._jobs.put((fn, future))
        return future

    def wake(self) -> None:
        """Let :meth:`serve_until` look at its condition again."""
        self._jobs.put((_nothing, cf.Future()))

    def serve_until(self, done: cf.Future[Any]) -> None:
        """Inside a call running on this worker: run the calls given meanwhile until ``done``
        is complete. Whoever completes ``done`` calls :meth:`wake` after it."""
        while not done.done():
            job = self._jobs.get()
            if job is None:
                self._jobs.put(None)  # the stop is for the main loop, after this call
                raise InvalidState("the worker was stopped while a call waited on it")
            _run(job)

    def stop(self) -> None:
        """End the thread once the calls already given to it have run; wait for it."""
        self._jobs.put(None)
        self._thread.join()

    def _main(self) -> None:
        while (job := self._jobs.get()) is not None:
            _run(job)


def _nothing() -> None:
    return None


def _run(job: _Job) -> None:
    fn, future = job
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn()
    except BaseException as exc:  # the caller gets it from the future, whatever it is
        future.set_exception(exc)
    else:
        future.set_result(result)


class WorkerPool:
    """At most ``size`` workers, each lent to one caller at a time and reused after.

    Not bound to an event loop: a pool may be shared by code on several loops (an application's
    and a dispatcher's), each waiter woken on its own.
    """

    def __init__(self, size: int, name: str) -> None:
        if type(size) is not int or size < 1:
            raise ValueError(f"a pool needs at least one worker, not {size!r}")
        self.size = size
        self._name = name
        self._lock = threading.Lock()
        self._idle: list[Worker] = []
        self._count = 0  # workers alive: idle and lent
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[Worker]]] = deque()
        self._drained: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._closed = False

    async def acquire(self) -> Worker:
        """A worker for this caller alone until :meth:`release`; waits while all are lent."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closed:
                raise InvalidState("this ledger is closed")
            if self._idle:
                return self._idle.pop()
            create = self._count < self.size
            if create:
                self._count += 1
            else:
                waiting: asyncio.Future[Worker] = loop.create_future()
                self._waiters.append((loop, waiting))
        if create:
            try:
                return Worker(self._name)
            except BaseException:
                with self._lock:
                    self._count -= 1
                raise
        try:
            return await waiting
        except BaseException:
            with self._lock:
                if (loop, waiting) in self._waiters:
                    self._waiters.remove((loop, waiting))
                    raise
            if waiting.done() and not waiting.cancelled() and waiting.exception() is None:
                self.release(waiting.result())  # handed over as this waiter gave up
            raise

    def release(self, worker: Worker) -> None:
        """Give ``worker`` back: to the first waiter, or to the idle ones."""
        stop = False
        with self._lock:
            if self._waiters:
                loop, waiting = self._waiters.popleft()
            elif self._closed:
                self._count -= 1
                stop = True
                drained = self._drained if self._count == 0 else []
            else:
                self._idle.append(worker)
                return
        if stop:
            _stop_in_background(worker)
            for loop_, done in drained:
                loop_.call_soon_threadsafe(_settle, done, None)
            return
        loop.call_soon_threadsafe(self._hand_over, waiting, worker)

    def _hand_over(self, waiting: asyncio.Future[Worker], worker: Worker) -> None:
        if waiting.done():  # its task gave up meanwhile: the next waiter, or idle
            self.release(worker)
        else:
            waiting.set_result(worker)

    async def close(self) -> None:
        """Refuse new callers, stop idle workers, and wait until every lent one is back."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            waiters, self._waiters = self._waiters, deque()
            drained: asyncio.Future[None] | None = None
            if self._count > 0:
                drained = loop.create_future()
                self._drained.append((loop, drained))
        for loop_, waiting in waiters:
            loop_.call_soon_threadsafe(_fail, waiting, InvalidState("this ledger is closed"))
        await asyncio.to_thread(_stop_all, idle)
        if drained is not None:
            await drained


def _stop_all(workers: list[Worker]) -> None:
    for worker in workers:
        worker.stop()


def _stop_in_background(worker: Worker) -> None:
    # release() may run on the event loop: never join a thread there.
    threading.Thread(target=worker.stop, name="oncewire-aio-stop", daemon=True).start()


def _settle(future: asyncio.Future[None], value: None) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


async def finish(future: cf.Future[T] | asyncio.Future[T]) -> T:
    """The result of a call running on a thread (a ``concurrent.futures`` future, or the
    one ``loop.run_in_executor`` returns), awaited to its end.

    A cancellation of the awaiting task while the call runs is held until the call has ended,
    then raised (the call's own result or error is dropped): what the call did to a transaction
    is over before the caller goes on. The event loop is never blocked meanwhile.
    """
    waiting = asyncio.wrap_future(future)
    cancelled: asyncio.CancelledError | None = None
    while not waiting.done():
        try:
            await asyncio.shield(waiting)
        except asyncio.CancelledError as exc:
            if not waiting.cancelled():  # this task was cancelled, not the call
                cancelled = cancelled or exc
        except BaseException:
            pass  # the call's own error: read from the future below
    if cancelled is not None:
        if not waiting.cancelled():
            waiting.exception()  # retrieved: never reported as lost
        raise cancelled
    return waiting.result()


class LoopBridge:
    """Runs coroutines on one event loop for code running on other threads."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def run(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` on the loop; block this thread (never the loop's) until it is
        answered. Refused on the loop's own thread, where it could only deadlock."""
        if _running_loop() is self.loop:
            raise InvalidState("LoopBridge.run called on its own event loop's thread")
        future = asyncio.run_coroutine_threadsafe(_awaited(awaitable), self.loop)
        while True:
            try:
                return future.result(timeout=1.0)
            except cf.TimeoutError:
                if self.loop.is_closed():  # nobody will ever answer
                    future.cancel()
                    raise InvalidState("the event loop closed while a call waited on it") from None


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
