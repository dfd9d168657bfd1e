"""The dispatcher awaits an async sink's ``aclose()`` on its own event loop when it stops."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from oncewire.dispatch import Dispatcher
from oncewire.effects.attempt import Attempt
from oncewire.ledger import Ledger
from oncewire.storage.records import EffectState


class ClosingSink:
    def __init__(self) -> None:
        self.loops: list[Any] = []
        self.closed_on: list[tuple[Any, str]] = []

    async def __call__(self, attempt: Attempt) -> dict[str, str]:
        self.loops.append(asyncio.get_running_loop())
        return {"ok": attempt.key}

    async def aclose(self) -> None:
        self.closed_on.append((asyncio.get_running_loop(), threading.current_thread().name))


def test_an_async_sink_is_closed_on_the_loop_that_ran_it(tmp_path: Path) -> None:
    sink = ClosingSink()
    with Ledger(str(tmp_path / "close.db")) as ledger:
        ledger.accept("k1", "thing", {"n": 1})
        Dispatcher(ledger, {"thing": sink}).run(until_idle=True, handle_signals=False)
        assert ledger.effects.get("k1").state is EffectState.DONE
    assert len(sink.loops) == 1
    assert sink.closed_on == [(sink.loops[0], "oncewire-sink-loop")]


def test_a_sink_that_was_never_called_is_not_closed(tmp_path: Path) -> None:
    sink = ClosingSink()
    with Ledger(str(tmp_path / "idle.db")) as ledger:
        Dispatcher(ledger, {"thing": sink}).run(until_idle=True, handle_signals=False)
    assert sink.closed_on == []
