"""The proxy's dispatcher: the effects machinery that performs its ``tools/call`` effects.

Each recorded call is performed by a :class:`~oncewire.Dispatcher` of the proxy's own, in a
thread: the same claim, lease, fence, start marker and settle as any ``oncewire dispatch``
worker, so a call is claimed under a lease, recorded as starting before its request is written
to the server (a proxy that dies there leaves the call to be found ``uncertain``, never lost),
and settled with the typed outcome :class:`ForwardSink` returns. Its owner is this process, so
the next proxy on the same host releases a dead one's claims at once.

It claims only the calls its own client waits for (``claimable``: the keys of the calls under
way in this proxy), never a call of another proxy on the same store, even one of the same kind:
that call belongs to another session, whose server has its own roots, state and progress
tokens. A call a proxy that died left unfinished is performed (or answered) by the proxy its
client retries it through with its key, which then waits for it.

The sink runs in a dispatcher worker thread and hands the request to the proxy's event loop,
where the server's connection lives (:meth:`Forwarder.forward`); it waits for the outcome.
An attempt that is a redelivery (an earlier one may have reached the server) of a tool that is
not redeliverable is not forwarded: it is :class:`~oncewire.MaybeSent` with
:data:`~oncewire.mcp.proxy_calls.NOT_REDELIVERED`, and such a call has one attempt, so its
effect ends ``dead`` with the outcome unknown.

The dispatcher's kinds are fixed when it is built; when a call of a tool it does not serve
arrives, :class:`Dispatching` starts one for the larger set and stops the old one (which
finishes what it has in flight).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Collection, Coroutine, Iterable
from typing import Any, Protocol

from oncewire.dispatch import Dispatcher
from oncewire.effects.attempt import Attempt
from oncewire.effects.outcomes import EffectOutcome, MaybeSent, NotSent, Rejected
from oncewire.ledger import Ledger
from oncewire.mcp.proxy_calls import AFTER_FORWARD, BEFORE_FORWARD, NOT_REDELIVERED

__all__ = ["Dispatching", "ForwardSink", "Forwarder"]

log = logging.getLogger("oncewire.mcp.proxy")

# Calls performed at once (each a request in flight to the server).
CONCURRENCY = 8
# A result up to this size is stored with its effect (a repeat replays it).
MAX_RESULT_BYTES = 16 * 1024 * 1024
RESTART_SECONDS = 1.0


class Forwarder(Protocol):
    """The proxy, as its sink sees it."""

    loop: asyncio.AbstractEventLoop

    def redelivers(self, tool: str) -> bool: ...

    def forward(self, attempt: Attempt) -> Coroutine[Any, Any, EffectOutcome]: ...


class ForwardSink:
    """The sink of every ``mcp.<server>.<tool>`` kind: forward the call, return its outcome."""

    def __init__(self, proxy: Forwarder) -> None:
        self.proxy = proxy
        self._lock = threading.Lock()
        self._running: dict[int, concurrent.futures.Future[EffectOutcome]] = {}

    def __call__(self, attempt: Attempt) -> EffectOutcome:
        payload = attempt.payload
        tool = payload.get("tool") if isinstance(payload, dict) else None
        if not isinstance(tool, str) or not isinstance(payload.get("arguments"), dict):
            return Rejected("not a tools/call the proxy recorded: the payload has no tool")
        if attempt.redelivery and not self.proxy.redelivers(tool):
            return MaybeSent(NOT_REDELIVERED)
        BEFORE_FORWARD.hit()
        try:
            future = asyncio.run_coroutine_threadsafe(self.proxy.forward(attempt), self.proxy.loop)
        except RuntimeError:  # the loop has stopped: nothing was written
            return NotSent("the proxy is stopping")
        with self._lock:
            self._running[attempt.fence] = future
        try:
            outcome = future.result()
        except concurrent.futures.CancelledError:
            return MaybeSent("the proxy stopped with the call in flight: it may have run")
        finally:
            with self._lock:
                self._running.pop(attempt.fence, None)
        AFTER_FORWARD.hit()
        return outcome

    def cancel(self, attempt: Attempt) -> None:
        """The attempt timed out: stop waiting (the proxy tells the server it is cancelled)."""
        with self._lock:
            future = self._running.get(attempt.fence)
        if future is not None:
            future.cancel()

    def cancel_all(self) -> None:
        with self._lock:
            futures = list(self._running.values())
        for future in futures:
            future.cancel()


class Dispatching:
    """The proxy's dispatcher, for the kinds it has seen; replaced when a kind is added."""

    def __init__(
        self,
        ledger: Ledger,
        sink: ForwardSink,
        *,
        attempt_timeout: float | None,
        recorded: Callable[[], None],
        claimable: Callable[[], Collection[str]],
        grace_seconds: float = 10.0,
    ) -> None:
        self.ledger = ledger
        self.claimable = claimable
        self.sink = sink
        self.attempt_timeout = attempt_timeout
        self.recorded = recorded
        self.grace_seconds = grace_seconds
        self.kinds: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._current: Dispatcher | None = None
        self._threads: list[threading.Thread] = []
        self._closed = False

    def serve(self, kinds: Iterable[str]) -> None:
        """Make sure ``kinds`` are served, and look for due work now."""
        with self._lock:
            if self._closed:
                return
            wanted = self.kinds | frozenset(kinds)
            current = self._current
            if wanted == self.kinds and current is not None:
                current.wake()
                return
            self.kinds = wanted
            dispatcher = Dispatcher(
                self.ledger,
                dict.fromkeys(sorted(wanted), self.sink),
                concurrency=CONCURRENCY,
                batch_size=CONCURRENCY,
                attempt_timeout=self.attempt_timeout,
                grace_seconds=self.grace_seconds,
                max_result_bytes=MAX_RESULT_BYTES,
                recorded=self.recorded,
                claimable=self.claimable,
            )
            thread = threading.Thread(
                target=self._run, args=(dispatcher,), name="oncewire-mcp-proxy", daemon=True
            )
            self._current = dispatcher
            self._threads.append(thread)
            thread.start()
        if current is not None:
            current.stop()  # it finishes the calls it has in flight

    def _run(self, dispatcher: Dispatcher) -> None:
        while True:
            try:
                dispatcher.run(handle_signals=False)
            except Exception:
                log.exception("the proxy's dispatcher stopped on an error")
            finally:
                self.recorded()
            with self._lock:
                if self._closed or self._current is not dispatcher:
                    return
            time.sleep(RESTART_SECONDS)
            with self._lock:
                if self._closed or self._current is not dispatcher:
                    return

    def close(self) -> None:
        """Stop claiming; wait at most the grace period for the calls in flight (blocking)."""
        with self._lock:
            self._closed = True
            current, self._current = self._current, None
            threads = list(self._threads)
        if current is not None:
            current.stop()
        deadline = time.monotonic() + self.grace_seconds + 5.0
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
