"""The outbox inside the caller's own transaction, on a real SQLite file.

What is committed is always checked through a separate sqlite3 connection, never through the
ledger that wrote it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncewire import ConfigurationError, EffectState, InvalidState, Ledger, PayloadConflict
from oncewire.errors import EffectNotFound
from oncewire.testing import ManualClock

Peek = Callable[..., list[tuple[Any, ...]]]


class Boom(Exception):
    pass


@pytest.fixture
def orders(ledger: Ledger) -> Ledger:
    """The ledger, with the caller's own ``orders`` table in the same file."""
    with ledger.transaction() as tx:
        tx.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, cents INTEGER NOT NULL)")
    return ledger


def _state_of(db_path: Path, peek: Peek) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    return (
        peek(db_path, "SELECT id, cents FROM orders ORDER BY id"),
        peek(db_path, "SELECT key, kind, payload, digest, state FROM oncewire_effects ORDER BY id"),
    )


def test_the_callers_row_and_the_effect_commit_together(
    orders: Ledger, db_path: Path, peek: Peek
) -> None:
    with orders.transaction() as tx:
        tx.execute("INSERT INTO orders (id, cents) VALUES (:id, :cents)", {"id": 42, "cents": 1999})
        effect = tx.accept("order-42/charge", "charge", {"order": 42, "cents": 1999})
        # Inside the transaction another connection sees neither.
        assert _state_of(db_path, peek) == ([], [])
    rows, effects = _state_of(db_path, peek)
    assert rows == [(42, 1999)]
    assert effects == [
        ("order-42/charge", "charge", '{"cents":1999,"order":42}', effect.digest, "pending")
    ]


def test_an_exception_in_the_block_rolls_back_both(
    orders: Ledger, db_path: Path, peek: Peek
) -> None:
    with pytest.raises(Boom), orders.transaction() as tx:
        tx.execute("INSERT INTO orders (id, cents) VALUES (:id, :cents)", {"id": 42, "cents": 1999})
        tx.accept("order-42/charge", "charge", {"order": 42})
        raise Boom
    assert _state_of(db_path, peek) == ([], [])
    assert orders.effects.find("order-42/charge") is None


def test_a_payload_conflict_inside_a_transaction_leaves_nothing(
    orders: Ledger, db_path: Path, peek: Peek
) -> None:
    original = orders.accept("order-1/charge", "charge", {"cents": 100})
    before = _state_of(db_path, peek)
    with pytest.raises(PayloadConflict) as caught, orders.transaction() as tx:
        tx.execute("INSERT INTO orders (id, cents) VALUES (:id, :cents)", {"id": 2, "cents": 500})
        tx.accept("order-2/charge", "charge", {"cents": 500})
        tx.accept("order-1/charge", "charge", {"cents": 999})  # same key, other payload
    assert caught.value.key == "order-1/charge"
    assert caught.value.stored_digest == original.digest
    assert caught.value.offered_digest != original.digest
    assert _state_of(db_path, peek) == before
    assert orders.effects.get("order-1/charge") == original


def test_the_same_key_and_payload_returns_the_same_effect(
    ledger: Ledger, db_path: Path, peek: Peek, clock: ManualClock
) -> None:
    first = ledger.accept("k", "send", {"a": 1, "b": {"c": [1, 2], "d": "é"}})
    clock.advance(10)
    with ledger.transaction() as tx:
        again = tx.accept("k", "send", {"b": {"d": "é", "c": [1, 2]}, "a": 1})
        assert tx.accepted == []  # nothing new was accepted
    assert again == first
    assert peek(db_path, "SELECT COUNT(*), MAX(updated_at) FROM oncewire_effects") == [
        (1, first.updated_at)
    ]


def test_the_same_key_with_another_kind_is_a_conflict(ledger: Ledger) -> None:
    ledger.accept("k", "send", {"a": 1})
    with pytest.raises(PayloadConflict, match=r"^key 'k' is bound to kind 'send', not 'charge'; "):
        ledger.accept("k", "charge", {"a": 1})
    assert ledger.effects.get("k").kind == "send"


def test_delay_and_deadline_are_relative_to_the_clock(ledger: Ledger, clock: ManualClock) -> None:
    effect = ledger.accept("k", "send", {}, delay_seconds=5, deadline_seconds=60, max_attempts=2)
    assert (effect.not_before, effect.deadline, effect.max_attempts) == (
        clock.now() + 5,
        clock.now() + 60,
        2,
    )
    with pytest.raises(ConfigurationError, match=r"delay_seconds must be a finite number >= 0"):
        ledger.accept("k2", "send", {}, delay_seconds=-3)  # a mistake, not "now"


@pytest.mark.parametrize(
    ("key", "kind", "max_attempts"),
    [("", "send", 1), ("k" * 513, "send", 1), ("k", "", 1), ("k", "x" * 129, 1), ("k", "s", 0)],
)
def test_invalid_arguments_are_refused_before_anything_is_written(
    ledger: Ledger, db_path: Path, peek: Peek, key: str, kind: str, max_attempts: int
) -> None:
    with pytest.raises(ConfigurationError):
        ledger.accept(key, kind, {}, max_attempts=max_attempts)
    assert peek(db_path, "SELECT COUNT(*) FROM oncewire_effects") == [(0,)]


@pytest.mark.parametrize(
    "timing",
    [
        {"delay_seconds": math.nan},
        {"delay_seconds": math.inf},
        {"deadline_seconds": math.nan},  # used to be stored as NULL: silently no deadline
        {"deadline_seconds": math.inf},
        {"deadline_seconds": -math.inf},
    ],
    ids=repr,
)
def test_non_finite_delays_and_deadlines_are_refused(
    ledger: Ledger, db_path: Path, peek: Peek, timing: dict[str, float]
) -> None:
    with pytest.raises(ConfigurationError, match="finite"):
        ledger.accept("k", "send", {}, **timing)
    assert peek(db_path, "SELECT COUNT(*) FROM oncewire_effects") == [(0,)]


def test_a_payload_without_json_form_writes_nothing(
    orders: Ledger, db_path: Path, peek: Peek
) -> None:
    with pytest.raises(ValueError, match="nan"), orders.transaction() as tx:
        tx.execute("INSERT INTO orders (id, cents) VALUES (1, 1)")
        tx.accept("k", "send", {"amount": float("nan")})
    assert _state_of(db_path, peek) == ([], [])


def test_a_second_transaction_on_the_same_thread_is_refused(ledger: Ledger) -> None:
    with pytest.raises(InvalidState), ledger.transaction(), ledger.transaction():
        pass


def test_reading_and_filtering_through_the_effects_view(ledger: Ledger) -> None:
    ledger.accept("a", "mail", {})
    ledger.accept("b", "sms", {})
    ledger.effects.cancel("b", "changed my mind")
    assert [e.key for e in ledger.effects.list("pending")] == ["a"]
    assert [e.key for e in ledger.effects.list(["pending", EffectState.CANCELLED])] == ["a", "b"]
    assert [e.key for e in ledger.effects.list(kind="sms")] == ["b"]
    assert ledger.effects.get("b").last_error == "changed my mind"
    assert ledger.effects.counts()[EffectState.CANCELLED] == 1
    assert ledger.effects.find("zzz") is None
    with pytest.raises(EffectNotFound):
        ledger.effects.get("zzz")
    with pytest.raises(ConfigurationError, match="unknown effect state 'lost'"):
        ledger.effects.list("lost")
    assert ledger.effects.retry("b").state is EffectState.PENDING


def test_threads_accept_concurrently_each_on_its_own_connection(
    ledger: Ledger, db_path: Path, peek: Peek
) -> None:
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(25):
                with ledger.transaction() as tx:
                    tx.accept(f"w{worker}/{i}", "send", {"worker": worker, "i": i})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert peek(db_path, "SELECT COUNT(DISTINCT key) FROM oncewire_effects") == [(100,)]


def test_a_ledger_is_a_context_manager_and_reopens_durably(db_path: Path, peek: Peek) -> None:
    with Ledger(str(db_path)) as ledger:
        ledger.accept("k", "send", {"n": 1})
    with Ledger(f"sqlite:///{db_path}", create=False) as reopened:
        assert reopened.effects.get("k").payload == {"n": 1}
