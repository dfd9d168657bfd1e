"""Under a ManualClock, draining waits for a scheduled retry by moving the clock, not by
hanging in real time (regression: run(until_idle=True) never returned)."""

from __future__ import annotations

from oncewire import Attempt, Dispatcher, Done, Ledger, NotSent
from oncewire.testing import ManualClock


def test_until_idle_under_a_manual_clock_returns_after_the_retry(ledger: Ledger) -> None:
    clock = ledger.clock
    assert isinstance(clock, ManualClock)
    ledger.accept("k", "flaky", {})
    calls: list[int] = []

    def flaky(attempt: Attempt) -> object:
        calls.append(attempt.number)
        return NotSent("busy", retry_after=120) if attempt.number == 1 else Done("ok")

    begun = clock.now()
    Dispatcher(ledger, {"flaky": flaky}, poll_seconds=5).run(until_idle=True, handle_signals=False)
    assert calls == [1, 2]
    assert ledger.effects.get("k").result == "ok"
    assert clock.now() - begun >= 120, "the manual clock moved past the retry"
