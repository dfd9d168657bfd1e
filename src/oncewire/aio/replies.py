"""AsyncReplyEngine: the reply engine for asyncio callers, with ``async def`` platform adapters.

Invariant: there is one delivery algorithm. :class:`AsyncReplyEngine` runs the synchronous
:class:`~oncewire.ReplyEngine` (its planner, its record of every wire operation written
``in_flight`` before the platform is called, its recovery) on threads of its own, and awaits an
adapter's ``async def`` send, edit and delete on the caller's event loop, where the adapter's
HTTP client lives. A synchronous adapter is called on the engine's thread, as ``ReplyEngine``
calls it. :meth:`AsyncReplyEngine.stream` reads an async iterable of text (a model's streamed
answer) in the caller's task and hands the text to the engine's stream.

Where awaiting cannot work, adapters stay refused: ``ReplyEngine`` itself calls adapters
synchronously and refuses an ``async def`` one when it is built (nothing would await it);
generator operations are refused by both.

Cancellation never leaves an operation half recorded: a pass already talking to the platform
(``answer``, ``deliver``, the final delivery of a stream) finishes, and records what happened,
before the cancellation is delivered. A stream cancelled while its text is still coming stops
previewing, leaves the record open with its previews written down, and frees the reply: the
next ``stream`` or ``answer`` for that inbound reuses those messages.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import queue
from collections.abc import AsyncIterable, Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from oncewire.aio.ledger import AsyncLedger
from oncewire.aio.threads import LoopBridge, finish
from oncewire.core.errors import ConfigurationError, InvalidState
from oncewire.ledger import Ledger, LedgerTransaction
from oncewire.replies import (
    DeliveryPass,
    PlatformProfile,
    RecoveryReport,
    ReplyEngine,
    SendRequest,
    WireOutcome,
)
from oncewire.replies.wire import check_platform

__all__ = ["DEFAULT_MAX_PASSES", "AsyncReplyEngine"]

T = TypeVar("T")

DEFAULT_MAX_PASSES = 8


class _Bound:
    """The caller's event loop, learnt at the engine's first call."""

    def __init__(self) -> None:
        self.bridge: LoopBridge | None = None

    def bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self.bridge is None:
            self.bridge = LoopBridge(loop)
        elif self.bridge.loop is not loop:
            raise InvalidState("an AsyncReplyEngine serves the event loop it was first used on")

    def run(self, awaitable: Any) -> Any:
        assert self.bridge is not None  # bound before any pass starts
        return self.bridge.run(awaitable)


class _Awaited:
    """An adapter as the synchronous engine calls it: what an operation returns is awaited on
    the caller's loop when it is awaitable, and returned as it is otherwise (the engine vets
    it either way)."""

    def __init__(self, adapter: Any, loop: _Bound) -> None:
        self._adapter = adapter
        self._loop = loop

    @property
    def profile(self) -> PlatformProfile:
        profile: PlatformProfile = self._adapter.profile
        return profile

    def _answer(self, answer: Any) -> WireOutcome:
        if inspect.isawaitable(answer):
            answer = self._loop.run(answer)
        outcome: WireOutcome = answer
        return outcome

    def send(self, request: SendRequest, body: str, *, marked: bool) -> WireOutcome:
        return self._answer(self._adapter.send(request, body, marked=marked))

    def edit(
        self, request: SendRequest, message_id: str, body: str, *, marked: bool
    ) -> WireOutcome:
        return self._answer(self._adapter.edit(request, message_id, body, marked=marked))

    def delete(self, request: SendRequest, message_id: str) -> WireOutcome:
        return self._answer(self._adapter.delete(request, message_id))


class _Stopped(Exception):
    """The stream's text stopped coming (the caller's iteration failed or was cancelled)."""


_END = object()
_STOP = object()


class _Feed:
    """The text a caller's task reads from its async iterable, as the engine's synchronous
    stream iterates it on its thread: whatever arrived since the last look, as one delta."""

    def __init__(self) -> None:
        self._items: queue.SimpleQueue[object] = queue.SimpleQueue()

    def put(self, delta: str) -> None:
        self._items.put(delta)

    def end(self) -> None:
        self._items.put(_END)

    def stop(self) -> None:
        self._items.put(_STOP)

    def __iter__(self) -> Iterator[str]:
        while True:
            items = [self._items.get()]
            while True:  # everything that is already there, coalesced
                try:
                    items.append(self._items.get_nowait())
                except queue.Empty:
                    break
            text = [item for item in items if isinstance(item, str)]
            last = next((item for item in items if not isinstance(item, str)), None)
            if text:
                yield "".join(text)
            if last is _STOP:
                raise _Stopped("the stream's text stopped coming")
            if last is _END:
                return


class AsyncReplyEngine:
    """``AsyncReplyEngine(ledger, {"tg": adapter})``: :class:`~oncewire.ReplyEngine` for
    asyncio callers, whose adapters may be ``async def`` (see the module docstring).

    ``ledger`` is an :class:`~oncewire.aio.AsyncLedger` (opened) or a ``Ledger``;
    ``engine_options`` go to ``ReplyEngine`` (``edit_interval_seconds``, ...). At most
    ``max_passes`` engine passes run at once, each on a thread of the engine's.
    ``on_commit(tx, text)`` callbacks are synchronous and run on the pass's thread, inside the
    commit's transaction (``tx`` is a :class:`~oncewire.LedgerTransaction`).
    """

    def __init__(
        self,
        ledger: AsyncLedger | Ledger,
        platforms: Mapping[str, Any],
        *,
        max_passes: int = DEFAULT_MAX_PASSES,
        **engine_options: Any,
    ) -> None:
        sync = ledger.sync if isinstance(ledger, AsyncLedger) else ledger
        if type(max_passes) is not int or max_passes < 1:
            raise ConfigurationError(f"max_passes must be a whole number >= 1, not {max_passes!r}")
        self._loop = _Bound()
        for name, adapter in platforms.items():
            check_platform(name, adapter, awaited=True)
        awaited = {name: _Awaited(adapter, self._loop) for name, adapter in platforms.items()}
        self.engine = ReplyEngine(sync, awaited, **engine_options)
        self._threads = cf.ThreadPoolExecutor(max_passes, thread_name_prefix="oncewire-aio-reply")

    async def _pass(self, fn: Callable[[], T]) -> T:
        self._loop.bind()
        return await finish(self._threads.submit(fn))

    async def answer(
        self,
        inbound_id: int,
        text: str,
        *,
        on_commit: Callable[[LedgerTransaction, str], Any] | None = None,
    ) -> DeliveryPass:
        """Commit ``text`` as the reply and deliver it (:meth:`oncewire.ReplyEngine.answer`)."""
        return await self._pass(lambda: self.engine.answer(inbound_id, text, on_commit=on_commit))

    async def stream(
        self,
        inbound_id: int,
        deltas: AsyncIterable[str] | Iterable[str],
        *,
        on_commit: Callable[[LedgerTransaction, str], Any] | None = None,
        preview: bool = True,
    ) -> DeliveryPass:
        """Show ``deltas`` (an async iterable of text, or a plain one) as an edited preview,
        then commit the whole text and deliver it (:meth:`oncewire.ReplyEngine.stream`).

        The text is read in the caller's task; when the engine is done with it early (the
        inbound's answer was committed before: it is delivered as recorded), reading stops at
        the next delta.
        """
        feed = _Feed()
        engine = self.engine
        self._loop.bind()
        job = self._threads.submit(
            lambda: engine.stream(inbound_id, feed, on_commit=on_commit, preview=preview)
        )
        try:
            if isinstance(deltas, AsyncIterable):
                async for delta in deltas:
                    if job.done():
                        break
                    feed.put(delta)
            else:
                for delta in deltas:
                    if job.done():
                        break
                    feed.put(delta)
                    await asyncio.sleep(0)  # let the adapter's calls run on this loop
        except BaseException:
            feed.stop()  # the engine releases the reply, its previews written down
            try:
                await finish(job)
            except Exception:
                pass  # _Stopped, or what the engine met meanwhile: the caller's error goes on
            raise
        feed.end()
        return await finish(job)

    async def deliver(
        self, reply_id: int, *, ignore_schedule: bool = False, wait: bool = False
    ) -> DeliveryPass:
        return await self._pass(
            lambda: self.engine.deliver(reply_id, ignore_schedule=ignore_schedule, wait=wait)
        )

    async def withdraw(self, inbound_id: int) -> DeliveryPass:
        return await self._pass(lambda: self.engine.withdraw(inbound_id))

    async def run_due(self, limit: int = 100) -> list[DeliveryPass]:
        return await self._pass(lambda: self.engine.run_due(limit))

    async def recover(self) -> RecoveryReport:
        return await self._pass(self.engine.recover)

    async def aclose(self) -> None:
        """Wait for the passes in progress, then stop the engine's threads."""
        await asyncio.to_thread(self._threads.shutdown, True)
