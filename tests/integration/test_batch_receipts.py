"""Batch sinks and ``Receipts.run_many``: one receiver transaction for a claimed batch, each
effect in its own savepoint. Checked by reading the receiver's tables directly."""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from oncewire import (
    Attempt,
    Dispatcher,
    Done,
    Ledger,
    NotSent,
    PayloadConflict,
    ReceiptResult,
    Receipts,
    Rejected,
)
from oncewire.sinks import ReceiptsSink
from oncewire.storage import Transaction
from tests.support.pg import migrated_schema, server_url


def _tickets_table(receipts: Receipts, serial: str = "INTEGER") -> None:
    with receipts.store.transaction() as tx:
        tx.execute(f"CREATE TABLE tickets (id {serial} PRIMARY KEY, key TEXT NOT NULL UNIQUE)")


def _insert() -> Any:
    def work(tx: Transaction, key: str, payload: Any) -> dict[str, Any]:
        if payload.get("explode"):
            raise RuntimeError("receiver refused to work")
        row = tx.execute(
            "INSERT INTO tickets (key) VALUES (:key) RETURNING id", {"key": key}
        ).fetchone()
        return {"ticket": row[0]}

    return work


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receipts]:
    receipts = Receipts(str(tmp_path / "receiver.db"))
    _tickets_table(receipts)
    try:
        yield receipts
    finally:
        receipts.close()


def _keys(path: str) -> list[str]:
    with closing(sqlite3.connect(path)) as db:
        return [k for (k,) in db.execute("SELECT key FROM tickets ORDER BY id")]


def test_run_many_isolates_each_item_in_one_transaction(receiver: Receipts) -> None:
    work = _insert()
    receiver.run_once("old", {"n": 0}, lambda tx: work(tx, "old", {"n": 0}))
    results = receiver.run_many(
        [
            ("a", {"n": 1}),
            ("old", {"n": 0}),  # a replay
            ("old", {"n": 9}),  # the same key, another payload
            ("boom", {"explode": True}),  # work raises: its writes roll back
            ("b", {"n": 2}),
        ],
        work,
    )
    assert isinstance(results[0], ReceiptResult) and not results[0].replayed
    assert isinstance(results[1], ReceiptResult) and results[1].replayed
    assert results[1].result == {"ticket": 1}
    assert isinstance(results[2], PayloadConflict)
    assert isinstance(results[3], RuntimeError)
    assert isinstance(results[4], ReceiptResult) and results[4].result == {"ticket": 3}
    path = receiver.store.path  # type: ignore[attr-defined]
    assert _keys(path) == ["old", "a", "b"]
    stored = {r.key for r in receiver.list()}
    assert stored == {"old", "a", "b"}, "a failed item must leave no receipt"


def test_a_dispatcher_hands_a_batch_sink_whole_batches(tmp_path: Path, receiver: Receipts) -> None:
    calls: list[int] = []

    class CountingSink(ReceiptsSink):
        def call_batch(self, attempts: Sequence[Attempt]) -> list[Any]:
            calls.append(len(attempts))
            return super().call_batch(attempts)

    work = _insert()
    sink = CountingSink(receiver, lambda tx, attempt: work(tx, attempt.key, attempt.payload))
    with Ledger(str(tmp_path / "app.db")) as ledger:
        with ledger.transaction() as tx:
            for i in range(120):
                tx.accept(f"k{i:03d}", "ticket", {"n": i})
        stats = Dispatcher(ledger, {"ticket": sink}, batch_size=50).run(
            until_idle=True, handle_signals=False
        )
        states = Counter(e.state.value for e in ledger.effects.list(limit=500))
    assert states == Counter({"done": 120})
    assert stats.done == 120
    assert calls == [50, 50, 20]
    per_key = Counter(_keys(receiver.store.path))  # type: ignore[attr-defined]
    assert len(per_key) == 120 and set(per_key.values()) == {1}


def test_batch_outcomes_map_to_what_the_receiver_knows(receiver: Receipts) -> None:
    work = _insert()
    receiver.run_once("taken", {"v": 1}, lambda tx: work(tx, "taken", {"v": 1}))
    sink = ReceiptsSink(receiver, lambda tx, attempt: work(tx, attempt.key, attempt.payload))

    def attempt(key: str, payload: Any) -> Attempt:
        return Attempt(key=key, kind="ticket", payload=payload, number=1, redelivery=False, fence=1)

    outcomes = sink.call_batch(
        [attempt("fresh", {"v": 1}), attempt("taken", {"v": 2}), attempt("x", {"explode": True})]
    )
    assert isinstance(outcomes[0], Done)
    assert isinstance(outcomes[1], Rejected) and "PayloadConflict" in outcomes[1].reason
    assert isinstance(outcomes[2], NotSent), "rolled-back work did not happen"


def test_a_batch_sink_that_raises_or_miscounts_is_an_unknown_outcome(tmp_path: Path) -> None:
    class Raises:
        def call_batch(self, attempts: Sequence[Attempt]) -> list[Any]:
            raise ConnectionResetError("peer went away mid-batch")

    class Miscounts:
        def call_batch(self, attempts: Sequence[Attempt]) -> list[Any]:
            return [None]

    with Ledger(str(tmp_path / "app.db")) as ledger:
        for i in range(3):
            ledger.accept(f"r{i}", "raises", {}, max_attempts=1)
            ledger.accept(f"m{i}", "miscounts", {}, max_attempts=1)
        Dispatcher(ledger, {"raises": Raises(), "miscounts": Miscounts()}).run(
            until_idle=True, handle_signals=False
        )
        effects = {e.key: e for e in ledger.effects.list(limit=10)}
    # Out of attempts after an outcome nobody knows: dead, and saying the outcome is unknown.
    assert {e.state.value for e in effects.values()} == {"dead"}
    assert all(e.maybe_sent for e in effects.values())
    assert "peer went away" in (effects["r0"].last_error or "")
    assert "returned 1 outcome(s) for 3 attempt(s)" in (effects["m0"].last_error or "")
    assert "outcome of the last attempt is unknown" in (effects["m0"].last_error or "")


def test_run_many_on_postgresql_survives_a_failing_item() -> None:
    with migrated_schema(server_url(), "batch") as url, Receipts(url) as receipts:
        _tickets_table(receipts, "BIGSERIAL")
        work = _insert()

        def clash(tx: Transaction, key: str, payload: Any) -> Any:
            # A unique violation aborts a PostgreSQL transaction; only the savepoint saves
            # the rest of the batch.
            tx.execute("INSERT INTO tickets (key) VALUES (:key)", {"key": "same"})
            return work(tx, key, payload)

        results = receipts.run_many([("a", {}), ("b", {}), ("c", {})], clash)
        assert isinstance(results[0], ReceiptResult)
        assert not isinstance(results[1], ReceiptResult)
        assert not isinstance(results[2], ReceiptResult)
        assert [r.key for r in receipts.list()] == ["a"]
