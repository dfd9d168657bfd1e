"""How the dispatcher turns one attempt's outcome into the effect's next state.

Each test runs exactly one real attempt against a real SQLite file (the sink asks the dispatcher
to stop, so the loop records that attempt and returns) and then reads the stored effect.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import (
    Attempt,
    ConfigurationError,
    Dispatcher,
    Done,
    Effect,
    EffectState,
    Ledger,
    MaybeSent,
    NotSent,
    Rejected,
    RetryPolicy,
)
from oncewire.testing import ManualClock
from tests.contract.conftest import RawDatabase


@pytest.fixture
def raw(db_path: Path) -> Iterator[RawDatabase]:
    """The stored row, read around oncewire."""
    conn = RawDatabase(str(db_path))
    try:
        yield conn
    finally:
        conn.close()


NO_JITTER = RetryPolicy(base_seconds=1.0, cap_seconds=100.0, jitter=0.0)


def one_attempt(
    ledger: Ledger,
    behaviour: Callable[[Attempt], Any],
    *,
    key: str = "k1",
    retry: RetryPolicy = NO_JITTER,
) -> tuple[Effect, Dispatcher, list[Attempt]]:
    """Run the due effect's next attempt through a real dispatcher, then read it back."""
    seen: list[Attempt] = []
    dispatcher: Dispatcher

    def sink(attempt: Attempt) -> Any:
        seen.append(attempt)
        dispatcher.stop()
        return behaviour(attempt)

    dispatcher = Dispatcher(ledger, {"send": sink}, retry=retry, batch_size=1)
    dispatcher.run(handle_signals=False)
    assert len(seen) == 1
    return ledger.effects.get(key), dispatcher, seen


def _raise(exc: Exception) -> Callable[[Attempt], Any]:
    def behaviour(attempt: Attempt) -> Any:
        raise exc

    return behaviour


@pytest.mark.parametrize(
    ("returned", "stored"),
    [
        ({"ticket": 7}, {"ticket": 7}),
        (Done({"ticket": 7}), {"ticket": 7}),
        ("ok", "ok"),
        (None, None),
        (Done(), None),
    ],
)
def test_a_plain_value_or_done_records_done_with_its_result(
    ledger: Ledger, returned: Any, stored: Any
) -> None:
    ledger.accept("k1", "send", {"n": 1})
    effect, dispatcher, _ = one_attempt(ledger, lambda a: returned)
    assert effect.state is EffectState.DONE
    assert effect.result == stored
    assert effect.result_json is not None
    assert (effect.attempts, effect.last_error, effect.lease_owner) == (1, None, None)
    assert dispatcher.stats.done == 1


@pytest.mark.parametrize("result", [object(), {"x": math.nan}])
def test_a_result_without_json_form_is_done_but_says_it_was_not_stored(
    ledger: Ledger, result: Any
) -> None:
    ledger.accept("k1", "send", {})
    effect, _, _ = one_attempt(ledger, lambda a: Done(result))
    assert effect.state is EffectState.DONE  # the world changed: never retry it
    assert effect.result_json is None
    assert effect.last_error is not None
    assert effect.last_error.startswith("result not stored:")


def test_rejected_is_terminal_with_its_reason(ledger: Ledger) -> None:
    ledger.accept("k1", "send", {})
    effect, dispatcher, _ = one_attempt(ledger, lambda a: Rejected("card declined"))
    assert effect.state is EffectState.REJECTED
    assert effect.last_error == "card declined"
    assert effect.result_json is None
    assert effect.maybe_sent is False
    assert dispatcher.stats.rejected == 1


def test_not_sent_waits_for_the_backoff_and_is_not_a_redelivery(
    ledger: Ledger, clock: ManualClock
) -> None:
    ledger.accept("k1", "send", {})
    effect, dispatcher, _ = one_attempt(ledger, lambda a: NotSent("connection refused"))
    assert effect.state is EffectState.PENDING
    assert effect.not_before == clock.now() + 1.0  # base * 2**0, no jitter
    assert effect.last_error == "connection refused"
    assert effect.maybe_sent is False
    assert dispatcher.stats.not_sent == 1


def test_the_backoff_grows_with_the_attempt_number(ledger: Ledger, clock: ManualClock) -> None:
    ledger.accept("k1", "send", {})
    one_attempt(ledger, lambda a: NotSent("down"))
    clock.advance(1.0)
    effect, _, seen = one_attempt(ledger, lambda a: NotSent("still down"))
    assert seen[0].number == 2
    assert effect.not_before == clock.now() + 2.0


def test_retry_after_from_the_receiver_wins(ledger: Ledger, clock: ManualClock) -> None:
    ledger.accept("k1", "send", {})
    effect, _, _ = one_attempt(ledger, lambda a: NotSent("429", retry_after=42.0))
    assert effect.not_before == clock.now() + 42.0


def test_maybe_sent_is_uncertain_and_marks_later_attempts(
    ledger: Ledger, clock: ManualClock
) -> None:
    ledger.accept("k1", "send", {})
    effect, dispatcher, _ = one_attempt(ledger, lambda a: MaybeSent("timeout after write"))
    assert effect.state is EffectState.UNCERTAIN
    assert effect.maybe_sent is True
    assert effect.last_error == "timeout after write"
    assert effect.not_before == clock.now() + 1.0
    assert dispatcher.stats.maybe_sent == 1
    clock.advance(1.0)
    _, dispatcher, seen = one_attempt(ledger, lambda a: "ok")
    assert seen[0].redelivery is True
    assert dispatcher.stats.redeliveries == 1


def test_a_raising_sink_counts_as_maybe_sent(ledger: Ledger) -> None:
    ledger.accept("k1", "send", {})
    effect, _, _ = one_attempt(ledger, _raise(RuntimeError("boom")))
    assert effect.state is EffectState.UNCERTAIN
    assert effect.maybe_sent is True
    assert effect.last_error == "sink raised RuntimeError: boom"


def test_not_sent_gives_its_attempt_back(ledger: Ledger, clock: ManualClock, raw: Any) -> None:
    # Nothing was sent, so a not-sent attempt does not use the effect up (it used to be dead
    # here: "out of attempts (1): 503").
    ledger.accept("k1", "send", {}, max_attempts=1)
    effect, dispatcher, _ = one_attempt(ledger, lambda a: NotSent("503"))
    row = raw.effect_row("k1")
    assert (row["state"], row["attempts"], row["last_error"]) == ("pending", 0, "503")
    assert effect.maybe_sent is False
    assert dispatcher.stats.dead == 0
    clock.advance(1.0)
    effect, _, seen = one_attempt(ledger, lambda a: "sent")
    assert (seen[0].number, seen[0].redelivery) == (2, False)  # the sink's count goes on
    row = raw.effect_row("k1")
    assert (row["state"], row["attempts"], row["result"]) == ("done", 1, '"sent"')


def test_without_a_deadline_max_not_sent_attempts_make_it_dead_never_sent(
    ledger: Ledger, clock: ManualClock, raw: Any
) -> None:
    policy = RetryPolicy(base_seconds=1.0, cap_seconds=1.0, jitter=0.0, max_not_sent=3)
    ledger.accept("k1", "send", {}, max_attempts=1)
    for n in range(1, 4):
        _, _, seen = one_attempt(ledger, lambda a: NotSent("429"), retry=policy)
        assert seen[0].number == n
        clock.advance(1.0)
    row = raw.effect_row("k1")
    assert row["state"] == "dead"
    assert row["last_error"] == "never sent: not sent 3 times, the last: 429"
    assert (row["attempts"], row["maybe_sent"]) == (0, 0)


def test_maybe_sent_on_the_last_attempt_is_dead_and_says_it_may_have_landed(
    ledger: Ledger,
) -> None:
    ledger.accept("k1", "send", {}, max_attempts=1)
    effect, _, _ = one_attempt(ledger, lambda a: MaybeSent("reset by peer"))
    assert effect.state is EffectState.DEAD
    assert effect.maybe_sent is True
    assert effect.last_error == (
        "out of attempts (1): reset by peer; the outcome of the last attempt is unknown"
    )


def test_a_retry_that_would_land_after_the_deadline_is_dead(ledger: Ledger) -> None:
    ledger.accept("k1", "send", {}, deadline_seconds=10.0)
    effect, _, _ = one_attempt(ledger, lambda a: NotSent("busy", retry_after=60.0))
    assert effect.state is EffectState.DEAD
    assert effect.last_error == "deadline would pass before the next attempt: busy"


def test_a_retry_inside_the_deadline_waits(ledger: Ledger, clock: ManualClock) -> None:
    ledger.accept("k1", "send", {}, deadline_seconds=10.0)
    effect, _, seen = one_attempt(ledger, lambda a: NotSent("busy", retry_after=5.0))
    assert seen[0].deadline == clock.now() + 10.0
    assert effect.state is EffectState.PENDING
    assert effect.not_before == clock.now() + 5.0


def test_the_attempt_carries_key_kind_payload_and_fence(ledger: Ledger) -> None:
    accepted = ledger.accept("k1", "send", {"to": "zoë", "n": [1, 2]}, max_attempts=4)
    _, _, seen = one_attempt(ledger, lambda a: "ok")
    attempt = seen[0]
    assert (attempt.key, attempt.kind, attempt.payload) == ("k1", "send", accepted.payload)
    assert (attempt.number, attempt.redelivery, attempt.fence) == (1, False, 1)
    assert attempt.headers() == {"Idempotency-Key": "k1", "Oncewire-Attempt": "1"}


def test_redelivery_headers() -> None:
    attempt = Attempt("k", "send", {}, number=3, redelivery=True, fence=5)
    assert attempt.headers() == {
        "Idempotency-Key": "k",
        "Oncewire-Attempt": "3",
        "Oncewire-Redelivery": "1",
    }


def test_effects_without_a_sink_are_left_alone(ledger: Ledger) -> None:
    ledger.accept("mine", "send", {})
    ledger.accept("theirs", "other-kind", {})
    stats = Dispatcher(ledger, {"send": lambda a: "ok"}).run(until_idle=True, handle_signals=False)
    assert stats.claimed == 1
    assert ledger.effects.get("mine").state is EffectState.DONE
    theirs = ledger.effects.get("theirs")
    assert (theirs.state, theirs.attempts) == (EffectState.PENDING, 0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sinks": {}},
        {"batch_size": 0},
        {"concurrency": 0},
        {"lease_seconds": 0.0},
        {"poll_seconds": -1.0},
        {"lease_seconds": math.nan},
        {"lease_seconds": math.inf},
        {"poll_seconds": math.nan},
    ],
)
def test_invalid_dispatcher_settings_are_refused(ledger: Ledger, kwargs: dict[str, Any]) -> None:
    arguments: dict[str, Any] = {"sinks": {"send": lambda a: None}, **kwargs}
    with pytest.raises(ConfigurationError):
        Dispatcher(ledger, **arguments)


def test_every_settlement_carries_the_attempt_history_fields() -> None:
    from oncewire.dispatch import settling
    from oncewire.storage.records import Claim

    claim = Claim(
        7,
        "k",
        "send",
        "{}",
        attempt=1,
        max_attempts=3,
        fence=4,
        redelivery=True,
        deadline=None,
        lease_expires_at=0.0,
    )
    cases = {
        "done": settling.read_value(Done(1)),
        "not_sent": settling.read_value(NotSent("busy")),
        "maybe_sent": settling.read_value(MaybeSent("reset")),
        "rejected": settling.read_value(Rejected("no")),
        "timeout": settling.timed_out(2.0),
        "error": settling.read_value(NotSent),
        "undecodable": settling.undecodable(ValueError("bad")),
    }
    for label, verdict in cases.items():
        item = settling.settlement(
            claim,
            verdict,
            policy=NO_JITTER,
            now=100.0,
            attempt_number=claim.fence,
            started_at=90.0,
            finished_at=95.0,
        )
        assert (item.id, item.fence, item.outcome) == (7, 4, label)
        assert (item.attempt, item.redelivery) == (4, True)
        assert (item.started_at, item.finished_at) == (90.0, 95.0)
        assert item.refund_attempt is (label == "not_sent")
