"""An inline dispatcher: the one a :class:`~oncewire.langgraph.DurableToolNode` (one per node)
or a durable Agents SDK run (:func:`oncewire.agents.run`) keeps in its own process.

A node with ``dispatch="inline"`` (and every durable Agents SDK run) performs its tool calls
with a :class:`~oncewire.Dispatcher` of its own: the same claim, fence, settle and recovery
machinery as ``oncewire dispatch`` workers, so every call is claimed under a lease with a
fence, recorded as starting before its tool runs (a process that dies there leaves it to be
retried as a flagged redelivery) and settled with the outcome the tool gave. Starting a
dispatcher costs threads, a store subscription and a few queries, which is most of what a step
with a quick tool would spend; so the node starts its dispatcher at its first step that has a
call to run, in a daemon thread, and keeps it:

* a step that accepted calls wakes it at once (:meth:`InlineDispatch.enter`), instead of
  waiting for the store to announce the commit;
* the dispatcher tells the steps waiting in this process as soon as it has recorded outcomes
  (:meth:`InlineDispatch.subscribe`), instead of their waiting for the store's announcement;
* between steps it serves what is due like any worker (a call another process accepted, a
  retry whose time has come), polling the store at the dispatcher's pace; one given ``keys``
  claims only the effects whose keys it returns (the calls its own process holds, which are
  all it can perform), leaves every other effect to the process that holds it, and does
  nothing while it returns none;
* it stops with :meth:`InlineDispatch.close` (the node's ``close()``) and at the process's
  normal exit, handing back the claims whose tools have not started and waiting at most
  ``grace_seconds`` for those running (a tool still running then stays claimed, for
  recovery, as it would after a crash);
* a forked child starts one of its own at its first step (the parent's thread is not there);
* a dispatcher that stops on an error is logged and replaced: at once while a step waits for
  it, else at the next step.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection, Mapping
from typing import Any

from oncewire.dispatch import Dispatcher
from oncewire.dispatch.retry import RetryPolicy
from oncewire.ledger import Ledger

__all__ = ["CLOSE_GRACE_SECONDS", "InlineDispatch"]

log = logging.getLogger("oncewire.dispatch")

# How long closing (and the process's exit) waits for the tools still running.
CLOSE_GRACE_SECONDS = 30.0
# How long a dispatcher that stopped on an error waits before its replacement starts.
RESTART_SECONDS = 1.0

_LIVE: weakref.WeakSet[InlineDispatch] = weakref.WeakSet()


class InlineDispatch:
    """A node's dispatcher, started at the first :meth:`enter` and kept until :meth:`close`."""

    def __init__(
        self,
        ledger: Ledger,
        sinks: Mapping[str, Any],
        *,
        name: str,
        concurrency: int,
        lease_seconds: float,
        retry: RetryPolicy | None,
        grace_seconds: float = CLOSE_GRACE_SECONDS,
        keys: Callable[[], Collection[str]] | None = None,
    ) -> None:
        self.ledger = ledger
        self.keys = keys
        self.sinks = dict(sinks)
        self.name = name
        self.concurrency = max(1, concurrency)
        self.lease_seconds = lease_seconds
        self.retry = retry
        self.grace_seconds = grace_seconds
        self._reset()
        _LIVE.add(self)

    def _reset(self) -> None:
        """No dispatcher, no waiter: a new one, or a forked child's (whose parent's thread is
        not there, and whose locks another thread of the parent may have held)."""
        self._lock = threading.Lock()
        self._dispatcher: Dispatcher | None = None
        self._thread: threading.Thread | None = None
        self._waiting = 0
        self._closed = False
        self._listeners: dict[int, Callable[[], None]] = {}
        self._next_listener = 0
        self._hooked = False  # close() registered with the store's closing

    @property
    def running(self) -> bool:
        """Whether the dispatcher's thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def dispatcher(self) -> Dispatcher | None:
        """The dispatcher serving now (None before the first step and after closing)."""
        return self._dispatcher

    # -- the steps ---------------------------------------------------------------------------
    def enter(self) -> None:
        """A step waits for calls it has just accepted: start the dispatcher if it is not
        running, and wake it (it claims now, not at its next poll)."""
        with self._lock:
            self._waiting += 1
            self._closed = False
            if not self.running:
                self._start()
            dispatcher = self._dispatcher
        if dispatcher is not None:
            dispatcher.wake()

    def leave(self) -> None:
        """The step no longer waits."""
        with self._lock:
            self._waiting = max(0, self._waiting - 1)

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` after each commit of the dispatcher that recorded outcomes (and when
        it stops); return a stopper."""
        with self._lock:
            number = self._next_listener
            self._next_listener += 1
            self._listeners[number] = wake

        def stop() -> None:
            with self._lock:
                self._listeners.pop(number, None)

        return stop

    def _recorded(self) -> None:
        with self._lock:
            listeners = list(self._listeners.values())
        for wake in listeners:
            wake()

    # -- the thread --------------------------------------------------------------------------
    def _new_dispatcher(self) -> Dispatcher:
        return Dispatcher(
            self.ledger,
            self.sinks,
            concurrency=self.concurrency,
            batch_size=self.concurrency,
            lease_seconds=self.lease_seconds,
            retry=self.retry,
            grace_seconds=self.grace_seconds,
            recorded=self._recorded,
            claimable=self.keys,
        )

    def _start(self) -> None:
        """Under the lock: a new dispatcher in a daemon thread, stopped before the ledger's
        store closes its connections under it."""
        if not self._hooked:
            self.ledger.store.on_close(self.close)
            self._hooked = True
        dispatcher = self._new_dispatcher()
        thread = threading.Thread(
            target=self._serve,
            args=(dispatcher,),
            name=f"oncewire-{self.name}",
            daemon=True,
        )
        self._dispatcher, self._thread = dispatcher, thread
        thread.start()

    def _serve(self, dispatcher: Dispatcher) -> None:
        while True:
            try:
                dispatcher.run(handle_signals=False)
                return  # stopped: closed
            except Exception:
                log.exception("the inline dispatcher of the node %r stopped on an error", self.name)
            finally:
                self._recorded()  # the waiting steps look at the store again
            time.sleep(RESTART_SECONDS)
            with self._lock:
                if self._closed or self._dispatcher is not dispatcher or not self._waiting:
                    if self._dispatcher is dispatcher:
                        self._dispatcher = self._thread = None
                    return  # the next step starts another
                dispatcher = self._dispatcher = self._new_dispatcher()

    def close(self) -> None:
        """Stop the dispatcher (see the module docstring); a later step starts it again."""
        with self._lock:
            self._closed = True
            dispatcher, thread = self._dispatcher, self._thread
            self._dispatcher = self._thread = None
        if dispatcher is None or thread is None:
            return
        if thread is threading.current_thread():  # a tool closing its own node: let it finish
            dispatcher.stop()
            return
        dispatcher.stop()
        thread.join(timeout=self.grace_seconds + 5.0)


def _close_all() -> None:
    for inline in list(_LIVE):
        inline.close()


def _forked() -> None:
    for inline in list(_LIVE):
        inline._reset()


atexit.register(_close_all)
os.register_at_fork(after_in_child=_forked)
