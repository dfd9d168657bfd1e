"""How long oncewire lets anything wait, on both backends.

A delay, a deadline, a receiver's ``retry_after`` and the backoff are bounded (``core.limits``):
refused at accept with nothing stored, or clamped when a receiver asks for longer (it said
"later", not "never"). A retry never lands past its effect's deadline. ``run(until_idle=True)``
returns when nothing is due within its horizon. And every reader of a stored time (``oncewire
effects show`` and ``list``, ``oncewire doctor``, a draining dispatcher) copes with a time no bound
made, written into the table around oncewire.

Regressions: ``NotSent(retry_after=99999999999999)`` parked an effect in the year 3,170,900,
after which ``effects show`` failed with ValueError and ``run(until_idle=True)`` never returned;
``delay_seconds=1e300`` was accepted and every reader of the effect raised OverflowError.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any

import pytest

from oncewire import ConfigurationError, Dispatcher, Ledger, MaybeSent, NotSent, RetryPolicy
from oncewire.cli import main
from oncewire.core.limits import MAX_DEADLINE_SECONDS, MAX_DELAY_SECONDS, MAX_RETRY_SECONDS
from oncewire.dispatch.retry import DEFAULT_IDLE_HORIZON_SECONDS
from oncewire.testing import ManualClock
from tests.contract.conftest import RawDatabase

YEAR_3170900 = 99_999_999_999_999.0  # what a Retry-After of 99999999999999 used to park at


def drain(dispatcher: Dispatcher, **options: Any) -> None:
    """``run(until_idle=True)`` in a thread; fails (instead of hanging the suite) if it does
    not return."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            dispatcher.run(until_idle=True, handle_signals=False, **options)
        except BaseException as exc:  # reported by the test, not lost in the thread
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        dispatcher.abort()
        thread.join(10)
        pytest.fail("run(until_idle=True) did not return")
    assert not failure, failure


# -- accept refuses a wait that is not one --------------------------------------------------------

DAYS_366 = "31622400 s (366 days)"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (math.nan, "delay_seconds must be a finite number >= 0, not nan"),
        (math.inf, "delay_seconds must be a finite number >= 0, not inf"),
        (-1, "delay_seconds must be a finite number >= 0, not -1"),
        (-0.001, "delay_seconds must be a finite number >= 0, not -0.001"),
        (1e300, f"delay_seconds is 1e+300 s; the limit is {DAYS_366}"),
        (MAX_DELAY_SECONDS + 1, f"delay_seconds is 31622401 s; the limit is {DAYS_366}"),
    ],
    ids=repr,
)
def test_a_delay_that_is_not_a_wait_is_refused_and_nothing_is_stored(
    ledger: Ledger, raw: RawDatabase, bad: float, message: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ledger.accept("k", "send", {}, delay_seconds=bad)
    assert str(caught.value) == message
    assert raw.count("oncewire_effects") == 0


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (1e300, f"deadline_seconds is 1e+300 s; the limit is {DAYS_366}"),
        (MAX_DEADLINE_SECONDS + 0.5, f"deadline_seconds is 31622400.5 s; the limit is {DAYS_366}"),
    ],
    ids=repr,
)
def test_a_deadline_beyond_the_limit_is_refused_and_nothing_is_stored(
    ledger: Ledger, raw: RawDatabase, bad: float, message: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ledger.accept("k", "send", {}, deadline_seconds=bad)
    assert str(caught.value) == message
    assert raw.count("oncewire_effects") == 0


def test_the_limits_themselves_are_accepted(
    ledger: Ledger, raw: RawDatabase, clock: ManualClock
) -> None:
    ledger.accept("late", "send", {}, delay_seconds=MAX_DELAY_SECONDS)
    ledger.accept("bounded", "send", {}, deadline_seconds=MAX_DEADLINE_SECONDS)
    assert raw.effect_row("late")["not_before"] == clock.now() + MAX_DELAY_SECONDS
    assert raw.effect_row("bounded")["deadline"] == clock.now() + MAX_DEADLINE_SECONDS


def test_a_first_attempt_due_after_the_deadline_is_refused(
    ledger: Ledger, raw: RawDatabase, clock: ManualClock
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ledger.accept("k", "send", {}, delay_seconds=100, deadline_seconds=10)
    assert str(caught.value) == (
        "delay_seconds (100) is past deadline_seconds (10): the effect would be due only after "
        "its deadline"
    )
    assert raw.count("oncewire_effects") == 0
    ledger.accept("k", "send", {}, delay_seconds=10, deadline_seconds=10)  # due at the deadline
    row = raw.effect_row("k")
    assert row["not_before"] == row["deadline"] == clock.now() + 10


def test_the_cli_refuses_an_absurd_delay_in_one_line(
    store_url: str, raw: RawDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["effects", "accept", "--db", store_url, "k", "send", "{}", "--delay", "1e300"])
    err = capsys.readouterr().err
    assert code != 0
    assert err == (
        f"error: delay_seconds is 1e+300 s; the limit is {DAYS_366} [configuration_error]\n"
    )
    assert raw.count("oncewire_effects") == 0


# -- a receiver's wish and the backoff are bounded -----------------------------------------------


def test_a_retry_after_beyond_the_limit_is_clamped_to_it() -> None:
    assert NotSent("429", retry_after=YEAR_3170900).retry_after == MAX_RETRY_SECONDS
    assert NotSent("429", retry_after=1e300).retry_after == MAX_RETRY_SECONDS
    assert NotSent("429", retry_after=MAX_RETRY_SECONDS).retry_after == MAX_RETRY_SECONDS
    assert NotSent("429", retry_after=60).retry_after == 60


def test_a_huge_retry_after_parks_the_effect_at_the_limit_and_the_drain_returns(
    ledger: Ledger,
    raw: RawDatabase,
    clock: ManualClock,
    store_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ledger.accept("k", "send", {})
    drain(Dispatcher(ledger, {"send": lambda a: NotSent("429", retry_after=YEAR_3170900)}))
    row = raw.effect_row("k")
    assert (row["state"], row["fence"], row["attempts"]) == ("pending", 1, 0)
    assert row["not_before"] == row["updated_at"] + MAX_RETRY_SECONDS
    assert clock.now() < row["not_before"]  # the drain did not wait for it
    code = main(["effects", "show", "--db", store_url, "k"])
    assert (code, capsys.readouterr().err) == (0, "")


def test_a_retry_after_past_the_deadline_is_dead_not_parked(
    ledger: Ledger, raw: RawDatabase
) -> None:
    ledger.accept("k", "send", {}, deadline_seconds=3600)
    drain(Dispatcher(ledger, {"send": lambda a: NotSent("429", retry_after=YEAR_3170900)}))
    row = raw.effect_row("k")
    assert row["state"] == "dead"
    assert row["last_error"] == "deadline would pass before the next attempt: 429"
    assert row["not_before"] <= row["deadline"]


def test_the_backoff_is_bounded_even_without_a_cap(ledger: Ledger, raw: RawDatabase) -> None:
    ledger.accept("k", "send", {}, max_attempts=3)
    policy = RetryPolicy(base_seconds=1e300, cap_seconds=math.inf, jitter=0.0)
    assert policy.delay(1) == policy.delay(10_000) == MAX_RETRY_SECONDS
    drain(Dispatcher(ledger, {"send": lambda a: MaybeSent("reset")}, retry=policy))
    row = raw.effect_row("k")
    assert (row["state"], row["attempts"]) == ("uncertain", 1)
    assert row["not_before"] == row["updated_at"] + MAX_RETRY_SECONDS


# -- until_idle's horizon ------------------------------------------------------------------------


def test_until_idle_waits_for_a_retry_within_its_horizon_only(
    ledger: Ledger, raw: RawDatabase, clock: ManualClock
) -> None:
    assert DEFAULT_IDLE_HORIZON_SECONDS == 300.0
    ledger.accept("soon", "send", {})
    ledger.accept("later", "send", {})
    waits = {"soon": 120.0, "later": 600.0}
    calls: list[str] = []

    def send(attempt: Any) -> Any:
        calls.append(attempt.key)
        return NotSent("busy", retry_after=waits[attempt.key]) if attempt.number == 1 else "ok"

    drain(Dispatcher(ledger, {"send": send}))
    assert sorted(calls) == ["later", "soon", "soon"]  # 120 s is within 300 s, 600 s is not
    assert raw.effect_row("later")["state"] == "pending"
    drain(Dispatcher(ledger, {"send": send}), idle_horizon_seconds=900)
    assert raw.effect_row("later")["state"] == "done"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1, True, "60"], ids=repr)
def test_an_idle_horizon_that_is_not_a_wait_is_refused(ledger: Ledger, bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="idle_horizon_seconds must be a finite number"):
        Dispatcher(ledger, {"send": lambda a: "ok"}).run(
            until_idle=True, handle_signals=False, idle_horizon_seconds=bad
        )


# -- stored times no bound made ------------------------------------------------------------------


def _absurd(backend: str) -> list[float]:
    # SQLite stores NaN as NULL (which not_before refuses); PostgreSQL keeps it.
    values = [YEAR_3170900, 1e300, math.inf, -1e300]
    return [*values, math.nan] if backend == "postgresql" else values


@pytest.mark.parametrize("which", range(5))
def test_readers_and_a_drain_survive_any_stored_time(
    ledger: Ledger,
    raw: RawDatabase,
    backend: str,
    store_url: str,
    which: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    values = _absurd(backend)
    if which >= len(values):
        pytest.skip("NaN is a value only PostgreSQL can store")
    value = values[which]
    ledger.accept("odd", "send", {})
    ledger.accept("fine", "send", {}, delay_seconds=60)
    drain(Dispatcher(ledger, {"send": lambda a: MaybeSent("timed out")}), idle_horizon_seconds=0)
    # An uncertain effect and its attempt, with every time of both rows absurd, as SQL can.
    raw.execute(
        "UPDATE oncewire_effects SET not_before = ?, deadline = ?, created_at = ?, "
        "updated_at = ? WHERE key = ?",
        (value, value, value, value, "odd"),
    )
    raw.execute("UPDATE oncewire_attempts SET started_at = ?, finished_at = ?", (value, value))
    url = store_url
    for argv in (
        ["effects", "show", "--db", url, "odd"],
        ["effects", "show", "--db", url, "odd", "--json"],
        ["effects", "list", "--db", url],
        ["effects", "list", "--db", url, "--json"],
        ["doctor", "--db", url],
    ):
        code = main(argv)
        out, err = capsys.readouterr()
        assert "Error" not in err and "error:" not in err, (argv, err)
        assert "odd" in out or argv[0] == "doctor", (argv, out)
        if argv[0] == "effects":
            assert code == 0, (argv, err)
        if argv[-1] == "--json" and argv[1] == "show":
            shown = json.loads(out)
            assert shown["effect"]["not_before"] == f"{value!r} (not a date)", shown
            assert shown["attempts"][0]["finished_at"] == f"{value!r} (not a date)", shown
    drain(Dispatcher(ledger, {"send": lambda a: "ok"}))
    row = raw.effect_row("odd")
    # Never due; a deadline below any clock has passed, one above it (or NaN) has not.
    assert row["state"] == ("dead" if value < 0 else "uncertain")
    assert row["fence"] == 1
    assert raw.effect_row("fine")["state"] == "pending"
