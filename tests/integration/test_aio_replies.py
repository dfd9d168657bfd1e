"""AsyncReplyEngine: ``async def`` adapters over the journaled fake platform, and ``stream()``
over an async iterable of text, judged from the fake's journal and the database (the replies
rig's checker), not from what the engine reports."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import ReplyEngine
from oncewire.aio import AsyncReplyEngine
from oncewire.core.errors import ConfigurationError
from oncewire.lab.suites.replies_rig import LONG_BODY, Rig, deltas, footer, header, reply_text
from oncewire.replies import PlatformProfile, ReplyState, SendRequest, WireOutcome
from oncewire.testing import ManualClock
from oncewire.testing.fake_platform import FakePlatform, Fault


class AsyncFake:
    """An ``async def`` adapter in front of a fake platform; notes the threads it ran on."""

    def __init__(self, fake: FakePlatform) -> None:
        self._fake = fake
        self.threads: set[int] = set()

    @property
    def profile(self) -> PlatformProfile:
        return self._fake.profile

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> WireOutcome:
        self.threads.add(threading.get_ident())
        await asyncio.sleep(0)  # a real adapter awaits its HTTP client here
        outcome: WireOutcome = fn(*args, **kwargs)
        return outcome

    async def send(self, request: SendRequest, body: str, *, marked: bool) -> WireOutcome:
        return await self._call(self._fake.send, request, body, marked=marked)

    async def edit(
        self, request: SendRequest, message_id: str, body: str, *, marked: bool
    ) -> WireOutcome:
        return await self._call(self._fake.edit, request, message_id, body, marked=marked)

    async def delete(self, request: SendRequest, message_id: str) -> WireOutcome:
        return await self._call(self._fake.delete, request, message_id)


async def model(parts: list[str]) -> AsyncIterator[str]:
    """A model's streamed answer: text arriving in the caller's event loop."""
    for part in parts:
        await asyncio.sleep(0.001)
        yield part


# fault id -> (fault kind, the rig checker's expectation)
FAULTS = {
    "clean": (None, "exact"),
    "conn_error": ("conn_error", "exact"),
    "rate_limit": ("rate_limit", "exact"),
    "timeout": ("timeout", "one_copy"),
}


@pytest.mark.parametrize("platform", ["fk_tg", "fk_ne"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_an_async_adapter_and_an_async_stream_deliver_the_reply_once(
    tmp_path: Path, store_url: str, platform: str, fault: str
) -> None:
    kind, expect = FAULTS[fault]
    aid = f"A-{platform}-{fault}"
    chat = f"c-{fault}"
    faults = [] if kind is None else [Fault(kind, platform=platform, contains=footer(aid))]
    with Rig(tmp_path / "rig", clock=ManualClock(), faults=faults, db=store_url) as rig:
        adapters = {name: AsyncFake(fake) for name, fake in rig.platforms.items()}
        admission = rig.admit(platform, chat, "in-1")
        text = reply_text(aid, LONG_BODY)  # over both caps: a preview, a seal, a final edit

        def persist(tx: Any, final: str) -> None:
            rig._persist(tx, admission.inbound.id, final)

        async def main() -> tuple[str, int]:
            engine = AsyncReplyEngine(
                rig.ledger, adapters, edit_interval_seconds=0.0, inline_wait_max_seconds=5.0
            )
            try:
                result = await engine.stream(
                    admission.inbound.id, model(deltas(text, "many")), on_commit=persist
                )
            finally:
                await engine.aclose()
            return result.status, threading.get_ident()

        status, loop_thread = asyncio.run(main())
        assert status == "delivered"
        fired = [f for f in rig.view().faults if f["chat"] == chat]
        assert len(fired) == (0 if kind is None else 1)
        failures = rig.check(platform, chat, aid, admission.inbound.id, expect)
        assert not failures, "\n".join(failures)
        # Every operation was awaited on the caller's event loop, none on the engine's threads.
        assert adapters[platform].threads == {loop_thread}


def test_a_stream_cancelled_midway_leaves_the_record_open_and_the_next_stream_finishes_it(
    tmp_path: Path,
) -> None:
    aid = "A-cancelled"
    with Rig(tmp_path / "rig", clock=ManualClock()) as rig:
        adapters = {name: AsyncFake(fake) for name, fake in rig.platforms.items()}
        admission = rig.admit("fk_tg", "c-1", "in-1")
        inbound_id = admission.inbound.id
        text = reply_text(aid, LONG_BODY)
        parts = deltas(text, "many")

        def persist(tx: Any, final: str) -> None:
            rig._persist(tx, inbound_id, final)

        async def main() -> str:
            engine = AsyncReplyEngine(rig.ledger, adapters, edit_interval_seconds=0.0)
            shown = asyncio.Event()

            async def stalls() -> AsyncIterator[str]:
                yield parts[0]
                yield parts[1]
                shown.set()
                await asyncio.Event().wait()  # the model stalls: only a cancellation ends it
                yield "never"

            task = asyncio.create_task(engine.stream(inbound_id, stalls(), on_commit=persist))
            await asyncio.wait_for(shown.wait(), 30)
            while not rig.view().visible("fk_tg", "c-1"):  # a preview is on screen
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            reply = rig.ledger.replies.for_inbound(inbound_id)
            assert reply is not None and reply.state is ReplyState.OPEN
            assert reply.lease_owner is None  # freed for whoever answers next
            assert rig.transcript(inbound_id) == []
            again = await engine.stream(inbound_id, model(parts), on_commit=persist)
            await engine.aclose()
            return again.status

        assert asyncio.run(main()) == "delivered"
        failures = rig.check("fk_tg", "c-1", aid, inbound_id, "exact")
        assert not failures, "\n".join(failures)
        copies, _ = rig.view().copies(
            "fk_tg", "c-1", header(aid), footer(aid), rig.platforms["fk_tg"].profile
        )
        assert len(copies) == 1


def test_async_adapters_are_refused_where_nothing_awaits_them(tmp_path: Path) -> None:
    with Rig(tmp_path / "rig", clock=ManualClock()) as rig:
        adapter = AsyncFake(rig.platforms["fk_tg"])
        with pytest.raises(ConfigurationError, match=r"send is async.*AsyncReplyEngine"):
            ReplyEngine(rig.ledger, {"fk_tg": adapter})

        class GeneratorSend(AsyncFake):
            async def send(  # type: ignore[override]
                self, request: SendRequest, body: str, *, marked: bool
            ) -> Any:
                yield None

        with pytest.raises(ConfigurationError, match="send is a generator function"):
            AsyncReplyEngine(rig.ledger, {"fk_tg": GeneratorSend(rig.platforms["fk_tg"])})
        assert rig.view().operations == []
