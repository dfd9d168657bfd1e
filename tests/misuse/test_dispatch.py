"""The dispatcher against sinks that are written wrong, on both backends.

Regressions: an ``async def`` sink (its coroutine never awaited), a generator, a sink returning
the class ``NotSent`` or an exception instance, and a ``call_batch`` answering a dict were all
recorded ``done`` although nothing may have happened; a list of the wrong length fell back to
calling the sink once per attempt; one undecodable payload raised out of ``run()`` and took its
batch down. Every check reads the stored row around oncewire (``raw``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest

from oncewire import (
    Attempt,
    ConfigurationError,
    Dispatcher,
    Done,
    Ledger,
    MaybeSent,
    NotSent,
    Rejected,
    RetryPolicy,
)
from tests.contract.conftest import RawDatabase


@pytest.fixture
def ledger(store_url: str) -> Iterator[Ledger]:
    """On the system clock: these tests run real dispatchers, in real time."""
    opened = Ledger(store_url)
    try:
        yield opened
    finally:
        opened.close()


# Retries are never due while a test looks: each test sees exactly one attempt per effect.
FAR = RetryPolicy(base_seconds=1e9, cap_seconds=1e9, jitter=0.0)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def attempted(raw: RawDatabase, key: str) -> bool:
    row = raw.effect_row(key)
    return bool(row["fence"] >= 1 and row["state"] != "claimed")


def dispatch_once(
    ledger: Ledger,
    raw: RawDatabase,
    sinks: Mapping[str, Any],
    keys: Sequence[str],
    **options: Any,
) -> Dispatcher:
    """Run a real dispatcher (system clock) until every key had one attempt recorded."""
    options.setdefault("retry", FAR)
    options.setdefault("poll_seconds", 0.02)
    dispatcher = Dispatcher(ledger, sinks, **options)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            dispatcher.run(handle_signals=False)
        except BaseException as exc:  # reported by the test, not lost in the thread
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: failure or all(attempted(raw, k) for k in keys), f"attempts of {keys}")
    finally:
        dispatcher.stop()
        thread.join(30)
    assert not failure, failure
    assert not thread.is_alive()
    return dispatcher


# -- sinks are checked when the dispatcher is built ------------------------------------------


def _generator_sink(attempt: Attempt) -> Iterator[Any]:
    yield Done()


class _NeitherCallableNorBatch:
    pass


class _BatchNotCallable:
    call_batch = "not a method"


@pytest.mark.parametrize(
    ("sink", "message"),
    [
        (None, "a sink must be callable"),
        ("send_email", "a sink must be callable"),
        (_NeitherCallableNorBatch(), "a sink must be callable"),
        (_BatchNotCallable(), "call_batch that is not callable"),
        (_generator_sink, "generator function"),
    ],
    ids=["none", "string", "object", "batch-attribute", "generator"],
)
def test_a_sink_that_cannot_be_called_is_refused_naming_its_kind(
    ledger: Ledger, sink: Any, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        Dispatcher(ledger, {"good": lambda a: None, "bad-kind": sink})
    assert "'bad-kind'" in str(caught.value)


@pytest.mark.parametrize(
    "options",
    [
        {"attempt_timeout": 0},
        {"attempt_timeout": -1.0},
        {"attempt_timeout": float("nan")},
        {"attempt_timeout": float("inf")},
        {"attempt_timeout": True},
        {"attempt_timeouts": {"unknown-kind": 1.0}},
        {"attempt_timeouts": {"send": 0}},
        {"grace_seconds": -1.0},
        {"grace_seconds": float("nan")},
        {"storage_patience_seconds": -1.0},
        {"storage_patience_seconds": float("nan")},
        {"storage_patience_seconds": "60"},
        {"storage_patience_seconds": True},
    ],
)
def test_invalid_timeouts_are_refused(ledger: Ledger, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        Dispatcher(ledger, {"send": lambda a: None}, **options)


# -- async sinks are supported -----------------------------------------------------------------


def test_an_async_sink_is_awaited(ledger: Ledger, raw: RawDatabase) -> None:
    loops: list[int] = []

    async def send(attempt: Attempt) -> Done:
        await asyncio.sleep(0.01)
        loops.append(id(asyncio.get_running_loop()))
        return Done({"sent": attempt.key})

    for i in range(3):
        ledger.accept(f"k{i}", "send", {"i": i})
    dispatch_once(ledger, raw, {"send": send}, ["k0", "k1", "k2"])
    for i in range(3):
        row = raw.effect_row(f"k{i}")
        assert (row["state"], row["result"], row["attempts"]) == ("done", f'{{"sent":"k{i}"}}', 1)
    assert len(set(loops)) == 1  # one event loop, owned by the dispatcher


def test_async_concurrency_is_the_number_of_coroutines_in_flight(
    ledger: Ledger, raw: RawDatabase
) -> None:
    in_flight = 0
    most = 0

    async def send(attempt: Attempt) -> str:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return "ok"

    keys = [f"k{i}" for i in range(9)]
    for key in keys:
        ledger.accept(key, "send", {})
    dispatch_once(ledger, raw, {"send": send}, keys, concurrency=3, batch_size=9)
    assert most == 3
    assert {raw.effect_row(k)["state"] for k in keys} == {"done"}


def test_an_async_call_batch_is_awaited(ledger: Ledger, raw: RawDatabase) -> None:
    class Batch:
        async def call_batch(self, attempts: Sequence[Attempt]) -> list[Any]:
            await asyncio.sleep(0)
            return [Done(a.key) if a.key != "k1" else Rejected("no") for a in attempts]

    for i in range(3):
        ledger.accept(f"k{i}", "send", {})
    dispatch_once(ledger, raw, {"send": Batch()}, ["k0", "k1", "k2"], batch_size=3)
    states = [(raw.effect_row(k)["state"], raw.effect_row(k)["result"]) for k in ("k0", "k1", "k2")]
    assert states == [("done", '"k0"'), ("rejected", None), ("done", '"k2"')]


# -- answers that are not outcomes are programming errors, never done --------------------------


async def _coroutine() -> str:
    return "never awaited"


def _generator() -> Iterator[str]:
    yield "never run"


WRONG_ANSWERS: dict[str, tuple[Callable[[], Any], str]] = {
    "coroutine": (_coroutine, "awaitable (coroutine) that was never awaited"),
    "generator": (_generator, "returned a generator"),
    "NotSent-class": (lambda: NotSent, "the class NotSent"),
    "Done-class": (lambda: Done, "the class Done"),
    "exception": (lambda: ValueError("card declined"), "exception instance (ValueError"),
}


@pytest.mark.parametrize("case", sorted(WRONG_ANSWERS))
def test_an_answer_that_is_not_an_outcome_is_uncertain_never_done(
    ledger: Ledger, raw: RawDatabase, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    make, message = WRONG_ANSWERS[case]
    ledger.accept("k", "send", {})
    with caplog.at_level(logging.INFO, logger="oncewire.dispatch"):
        dispatch_once(ledger, raw, {"send": lambda a: make()}, ["k"])
    row = raw.effect_row("k")
    assert (row["state"], row["result"], bool(row["maybe_sent"])) == ("uncertain", None, True)
    assert message in row["last_error"]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "key=k " in errors[0].getMessage()
    assert "outcome=error" in errors[0].getMessage()


def test_an_unstorable_result_in_done_is_done_with_a_warning(
    ledger: Ledger, raw: RawDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    ledger.accept("k", "send", {})
    with caplog.at_level(logging.INFO, logger="oncewire.dispatch"):
        dispatch_once(ledger, raw, {"send": lambda a: Done(object())}, ["k"])
    row = raw.effect_row("k")
    assert (row["state"], row["result"]) == ("done", None)  # the sink said it happened
    assert row["last_error"].startswith("result not stored:")
    assert [r.levelno for r in caplog.records if "key=k " in r.getMessage()] == [logging.WARNING]


# -- call_batch must answer one outcome per attempt, in order ----------------------------------


class _Answers:
    """A batch sink answering ``answer(attempts)``; calling it per attempt is a failure."""

    def __init__(self, answer: Callable[[Sequence[Attempt]], Any]) -> None:
        self.answer = answer
        self.single_calls = 0

    def __call__(self, attempt: Attempt) -> Any:
        self.single_calls += 1
        return Done("called one by one")

    def call_batch(self, attempts: Sequence[Attempt]) -> Any:
        return self.answer(attempts)


BATCH_ANSWERS: dict[str, tuple[Callable[[Sequence[Attempt]], Any], str]] = {
    "dict": (lambda atts: {a.key: Rejected("no") for a in atts}, "call_batch returned a dict"),
    "set": (lambda atts: {Done(1)}, "call_batch returned a set"),
    "generator": (lambda atts: (Done(a.key) for a in atts), "call_batch returned a generator"),
    "iterator": (lambda atts: iter([Done(a.key) for a in atts]), "call_batch returned a list_it"),
    "string": (lambda atts: "ok", "call_batch returned a str"),
    "none": (lambda atts: None, "call_batch returned a NoneType"),
    "too-short": (lambda atts: [Done(1)] * (len(atts) - 1), "2 outcome(s) for 3 attempt(s)"),
    "too-long": (lambda atts: [Done(1)] * (len(atts) + 1), "4 outcome(s) for 3 attempt(s)"),
    "coroutine": (lambda atts: _coroutine(), "call_batch returned an awaitable"),
}


@pytest.mark.parametrize("case", sorted(BATCH_ANSWERS))
def test_a_batch_answer_that_is_not_one_outcome_per_attempt_is_refused(
    ledger: Ledger, raw: RawDatabase, case: str
) -> None:
    answer, message = BATCH_ANSWERS[case]
    sink = _Answers(answer)
    keys = ["k0", "k1", "k2"]
    for key in keys:
        ledger.accept(key, "send", {})
    dispatch_once(ledger, raw, {"send": sink}, keys, batch_size=3)
    assert sink.single_calls == 0  # no fallback to calling it per attempt
    for key in keys:
        row = raw.effect_row(key)
        assert (row["state"], row["result"], bool(row["maybe_sent"])) == ("uncertain", None, True)
        assert message in row["last_error"], row["last_error"]


def test_a_batch_answer_is_read_in_order_one_outcome_each(ledger: Ledger, raw: RawDatabase) -> None:
    sink = _Answers(lambda atts: (Done("a"), NotSent("busy"), MaybeSent("reset"), NotSent))
    keys = ["k0", "k1", "k2", "k3"]
    for key in keys:
        ledger.accept(key, "send", {})
    dispatch_once(ledger, raw, {"send": sink}, keys, batch_size=4)
    rows = [raw.effect_row(k) for k in keys]
    assert [(r["state"], r["attempts"]) for r in rows] == [
        ("done", 1),
        ("pending", 0),  # NotSent gives its attempt back
        ("uncertain", 1),
        ("uncertain", 1),  # the class NotSent is not an outcome: a programming error
    ]
    assert "the class NotSent" in rows[3]["last_error"]


# -- one poison payload goes to dead alone ---------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    ["{", "[" * 5000 + "]" * 5000, '{"a": NaN}', "\u00ff\u00fe not json"],
    ids=["truncated", "deep", "nan", "garbage"],
)
def test_an_undecodable_payload_is_dead_alone_and_never_sent(
    ledger: Ledger, raw: RawDatabase, caplog: pytest.LogCaptureFixture, payload: str
) -> None:
    keys = ["k0", "k1", "k2"]
    for key in keys:
        ledger.accept(key, "send", {"key": key})
    assert raw.execute("UPDATE oncewire_effects SET payload = ? WHERE key = ?", (payload, "k1"))
    seen: list[str] = []

    def send(attempt: Attempt) -> Done:
        seen.append(attempt.key)
        return Done(attempt.payload)

    with caplog.at_level(logging.INFO, logger="oncewire.dispatch"):
        dispatch_once(ledger, raw, {"send": send}, keys, batch_size=3)
    assert sorted(seen) == ["k0", "k2"]  # the sink was never called for k1
    poisoned = raw.effect_row("k1")
    assert (poisoned["state"], poisoned["result"]) == ("dead", None)
    assert poisoned["last_error"].startswith("undecodable payload, never sent")
    assert not poisoned["maybe_sent"]
    for key in ("k0", "k2"):
        assert raw.effect_row(key)["state"] == "done"
    assert any(r.levelno == logging.ERROR and "key=k1 " in r.getMessage() for r in caplog.records)


# -- limits on what is stored ------------------------------------------------------------------


def test_a_long_rejection_reason_is_cut_and_says_so(ledger: Ledger, raw: RawDatabase) -> None:
    ledger.accept("k", "send", {})
    dispatch_once(ledger, raw, {"send": lambda a: Rejected("x" * 100_000)}, ["k"])
    error = raw.effect_row("k")["last_error"]
    assert error.startswith("x" * 2000 + "... [cut: 98000 more characters]")
    assert len(error) < 2100


def test_a_long_exception_message_is_cut(ledger: Ledger, raw: RawDatabase) -> None:
    def send(attempt: Attempt) -> None:
        raise RuntimeError("y" * 50_000)

    ledger.accept("k", "send", {})
    dispatch_once(ledger, raw, {"send": send}, ["k"])
    row = raw.effect_row("k")
    assert row["state"] == "uncertain"
    assert len(row["last_error"]) < 2100 and "more characters]" in row["last_error"]


# 10**400: an int too large for a float; it used to pass and then raise OverflowError out of
# Dispatcher.run in the backoff, killing every dispatcher that met the effect.
@pytest.mark.parametrize("wait", [-1, -0.001, float("nan"), float("inf"), True, "5", 10**400])
def test_a_retry_after_that_is_not_a_wait_is_refused_where_it_is_made(wait: Any) -> None:
    with pytest.raises(ConfigurationError, match="retry_after"):
        NotSent("429", retry_after=wait)


def test_a_sink_building_a_bad_not_sent_is_a_raise_and_uncertain(
    ledger: Ledger, raw: RawDatabase
) -> None:
    # The sink ran: whatever it did before the mistake may have landed.
    ledger.accept("k", "send", {})
    dispatch_once(ledger, raw, {"send": lambda a: NotSent("429", retry_after=-1)}, ["k"])
    row = raw.effect_row("k")
    assert row["state"] == "uncertain"
    assert "ConfigurationError" in row["last_error"]


def test_a_sink_answering_an_overflowing_retry_after_does_not_stop_the_dispatcher(
    ledger: Ledger, raw: RawDatabase
) -> None:
    ledger.accept("k", "send", {})
    dispatch_once(ledger, raw, {"send": lambda a: NotSent("429", retry_after=10**400)}, ["k"])
    row = raw.effect_row("k")
    assert row["state"] == "uncertain"
    assert "ConfigurationError" in row["last_error"]


def test_not_sent_does_not_use_up_max_attempts(ledger: Ledger, raw: RawDatabase) -> None:
    ledger.accept("k", "send", {}, max_attempts=2)
    calls: list[tuple[int, bool]] = []

    def send(attempt: Attempt) -> Any:
        calls.append((attempt.number, attempt.redelivery))
        return NotSent("429", retry_after=0) if len(calls) <= 5 else Done("at last")

    Dispatcher(ledger, {"send": send}, poll_seconds=0.01).run(until_idle=True, handle_signals=False)
    row = raw.effect_row("k")
    assert (row["state"], row["result"], row["attempts"]) == ("done", '"at last"', 1)
    assert calls == [(n, False) for n in range(1, 7)]  # numbered on, never a redelivery


def test_not_sent_without_a_deadline_stops_at_max_not_sent(
    ledger: Ledger, raw: RawDatabase
) -> None:
    ledger.accept("k", "send", {})
    policy = RetryPolicy(base_seconds=0.0, jitter=0.0, max_not_sent=5)
    stats = Dispatcher(ledger, {"send": lambda a: NotSent("429")}, retry=policy).run(
        until_idle=True, handle_signals=False
    )
    row = raw.effect_row("k")
    assert row["state"] == "dead"
    assert row["last_error"] == "never sent: not sent 5 times, the last: 429"
    assert (row["attempts"], bool(row["maybe_sent"])) == (0, False)
    assert stats.claimed == 5


def test_an_operators_retry_gives_a_never_sent_effect_a_fresh_count(
    ledger: Ledger, raw: RawDatabase
) -> None:
    """Regression: the not-sent count was ``fence - attempts``, and a retry resets only the
    attempts, so a retried "never sent" effect died again on its first NotSent."""
    ledger.accept("k", "send", {})
    policy = RetryPolicy(base_seconds=0.0, jitter=0.0, max_not_sent=3)
    Dispatcher(ledger, {"send": lambda a: NotSent("429")}, retry=policy).run(
        until_idle=True, handle_signals=False
    )
    assert raw.effect_row("k")["state"] == "dead"
    ledger.effects.retry("k")
    assert raw.query("SELECT not_sent FROM oncewire_effects WHERE key = ?", ("k",)) == [(0,)]
    answers = iter([NotSent("429"), NotSent("429"), "ok"])
    stats = Dispatcher(ledger, {"send": lambda a: next(answers)}, retry=policy).run(
        until_idle=True, handle_signals=False
    )
    row = raw.effect_row("k")
    assert (row["state"], row["result"], stats.claimed) == ("done", '"ok"', 3)


def test_max_not_sent_counts_not_sent_attempts_in_a_row(ledger: Ledger, raw: RawDatabase) -> None:
    """A charged attempt (one that may have been sent) starts the not-sent count again."""
    ledger.accept("k", "send", {}, max_attempts=5)
    policy = RetryPolicy(base_seconds=0.0, jitter=0.0, max_not_sent=3)
    answers = iter(
        [NotSent("429"), NotSent("429"), MaybeSent("reset"), NotSent("429"), NotSent("429"), "ok"]
    )
    Dispatcher(ledger, {"send": lambda a: next(answers)}, retry=policy).run(
        until_idle=True, handle_signals=False
    )
    row = raw.effect_row("k")
    assert (row["state"], row["result"], row["attempts"]) == ("done", '"ok"', 2)
    outcomes = raw.query(
        "SELECT outcome FROM oncewire_attempts a JOIN oncewire_effects e ON e.id = a.effect_id "
        "WHERE e.key = ? ORDER BY a.fence",
        ("k",),
    )
    assert [o for (o,) in outcomes] == [
        "not_sent",
        "not_sent",
        "maybe_sent",
        "not_sent",
        "not_sent",
        "done",
    ]


def test_not_sent_with_a_deadline_is_bounded_by_it(ledger: Ledger, raw: RawDatabase) -> None:
    ledger.accept("k", "send", {}, deadline_seconds=3600)
    policy = RetryPolicy(base_seconds=0.0, jitter=0.0, max_not_sent=2)
    calls = 0

    def send(attempt: Attempt) -> Any:
        nonlocal calls
        calls += 1
        return NotSent("429", retry_after=0) if calls < 4 else "ok"

    Dispatcher(ledger, {"send": send}, retry=policy).run(until_idle=True, handle_signals=False)
    row = raw.effect_row("k")
    assert (row["state"], row["result"]) == ("done", '"ok"')  # max_not_sent did not apply
    assert calls == 4


def test_an_effect_whose_kind_has_no_sink_is_named_once(
    ledger: Ledger, raw: RawDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    ledger.accept("mine", "send", {})
    for i in range(3):
        ledger.accept(f"orphan{i}", "sms", {})
    dispatcher = Dispatcher(ledger, {"send": lambda a: "ok"})
    with caplog.at_level(logging.WARNING, logger="oncewire.dispatch"):
        dispatcher.run(until_idle=True, handle_signals=False)
        dispatcher.run(until_idle=True, handle_signals=False)  # once per kind, not per run
    warnings = [r.getMessage() for r in caplog.records if "'sms'" in r.getMessage()]
    assert len(warnings) == 1
    assert "3 effect(s) of kind 'sms' wait" in warnings[0]
    assert "no sink in this dispatcher handles 'sms'" in warnings[0]
    assert raw.effect_row("orphan0")["state"] == "pending"
    assert raw.effect_row("mine")["state"] == "done"


def test_each_attempt_is_one_log_line(
    ledger: Ledger, raw: RawDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    ledger.accept("k", "send", {})
    with caplog.at_level(logging.INFO, logger="oncewire.dispatch"):
        dispatch_once(ledger, raw, {"send": lambda a: Done(1)}, ["k"])
    lines = [r for r in caplog.records if "key=k " in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    message = lines[0].getMessage()
    for part in ("kind=send", "attempt=1", "redelivery=no", "outcome=done", "ms="):
        assert part in message
