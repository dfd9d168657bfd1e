"""The receiver side on a real SQLite file: the work and its receipt commit together, a
redelivery replays, a changed payload is refused, and retention is explicit."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncewire import ConfigurationError, PayloadConflict, Receipts
from oncewire.errors import ReceiptNotFound
from oncewire.storage import Transaction
from oncewire.testing import ManualClock

Peek = Callable[..., list[tuple[Any, ...]]]


class Boom(Exception):
    pass


@pytest.fixture
def receiver_db(tmp_path: Path) -> Path:
    return tmp_path / "receiver.db"


@pytest.fixture
def tickets(receipts: Receipts) -> Receipts:
    """The receiver, with its own ``tickets`` table in the same file."""
    with receipts.store.transaction() as tx:
        tx.execute("CREATE TABLE tickets (id INTEGER PRIMARY KEY, title TEXT NOT NULL)")
    return receipts


class CreateTicket:
    """The receiver's work: insert a ticket row, return its id. Counts its calls."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.calls = 0

    def __call__(self, tx: Transaction) -> dict[str, Any]:
        self.calls += 1
        cursor = tx.execute("INSERT INTO tickets (title) VALUES (:title)", {"title": self.title})
        return {"ticket": cursor.lastrowid}


def _rows(path: Path, peek: Peek) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    return (
        peek(path, "SELECT id, title FROM tickets ORDER BY id"),
        peek(path, "SELECT key, digest, payload, result FROM oncewire_receipts ORDER BY key"),
    )


def test_the_work_commits_with_its_receipt(
    tickets: Receipts, receiver_db: Path, peek: Peek
) -> None:
    work = CreateTicket("printer on fire")
    outcome = tickets.run_once("req-1", {"title": "printer on fire"}, work)
    assert (outcome.key, outcome.result, outcome.replayed) == ("req-1", {"ticket": 1}, False)
    rows, receipts = _rows(receiver_db, peek)
    assert rows == [(1, "printer on fire")]
    assert [(k, p, r) for k, _, p, r in receipts] == [
        ("req-1", '{"title":"printer on fire"}', '{"ticket":1}')
    ]


def test_work_that_raises_leaves_neither_the_row_nor_the_receipt(
    tickets: Receipts, receiver_db: Path, peek: Peek
) -> None:
    def failing(tx: Transaction) -> None:
        tx.execute("INSERT INTO tickets (title) VALUES ('half done')")
        raise Boom

    with pytest.raises(Boom):
        tickets.run_once("req-1", {"n": 1}, failing)
    assert _rows(receiver_db, peek) == ([], [])
    work = CreateTicket("second try")  # and the key is free for the redelivery
    assert tickets.run_once("req-1", {"n": 1}, work).replayed is False
    assert work.calls == 1


def test_a_result_without_json_form_leaves_nothing(
    tickets: Receipts, receiver_db: Path, peek: Peek
) -> None:
    def bad_result(tx: Transaction) -> Any:
        tx.execute("INSERT INTO tickets (title) VALUES ('x')")
        return {"score": float("nan")}

    with pytest.raises(ValueError, match="no JSON form"):
        tickets.run_once("req-1", {}, bad_result)
    assert _rows(receiver_db, peek) == ([], [])


def test_a_redelivery_replays_the_stored_result_without_calling_fn(
    tickets: Receipts, receiver_db: Path, peek: Peek
) -> None:
    first = CreateTicket("a")
    tickets.run_once("req-1", {"title": "a", "tags": ["x"]}, first)
    before = _rows(receiver_db, peek)
    again = CreateTicket("a")
    outcome = tickets.run_once("req-1", {"tags": ["x"], "title": "a"}, again)  # other key order
    assert (outcome.result, outcome.replayed) == ({"ticket": 1}, True)
    assert again.calls == 0
    assert _rows(receiver_db, peek) == before


def test_a_changed_payload_is_a_conflict_and_writes_nothing(
    tickets: Receipts, receiver_db: Path, peek: Peek
) -> None:
    tickets.run_once("req-1", {"title": "a"}, CreateTicket("a"))
    before = _rows(receiver_db, peek)
    work = CreateTicket("b")
    with pytest.raises(PayloadConflict) as caught:
        tickets.run_once("req-1", {"title": "b"}, work)
    assert caught.value.key == "req-1"
    assert caught.value.stored_digest == before[1][0][1]
    assert work.calls == 0
    assert _rows(receiver_db, peek) == before


def test_a_none_result_replays_as_none(receipts: Receipts) -> None:
    assert receipts.run_once("k", {}, lambda tx: None).result is None
    replay = receipts.run_once("k", {}, lambda tx: "not called")
    assert (replay.result, replay.replayed) == (None, True)


def test_retention_sets_the_expiry_and_purge_drops_only_expired(
    tickets: Receipts, clock: ManualClock
) -> None:
    start = clock.now()
    tickets.run_once("old", {}, CreateTicket("old"))
    clock.advance(1800)
    tickets.run_once("young", {}, CreateTicket("young"))
    assert tickets.get("old").expires_at == start + 3600
    assert tickets.get("young").expires_at == start + 1800 + 3600
    assert tickets.purge() == 0  # nothing has expired yet
    clock.advance(1801)
    assert tickets.purge() == 1
    assert [r.key for r in tickets.list()] == ["young"]
    with pytest.raises(ReceiptNotFound):
        tickets.get("old")
    assert tickets.purge(now=start + 10**6) == 1


def test_an_expired_but_unpurged_receipt_still_deduplicates(
    tickets: Receipts, clock: ManualClock
) -> None:
    tickets.run_once("req-1", {"n": 1}, CreateTicket("a"))
    clock.advance(10 * 3600)  # far past the retention window, but nobody purged
    again = CreateTicket("a")
    outcome = tickets.run_once("req-1", {"n": 1}, again)
    assert outcome.replayed is True
    assert again.calls == 0
    with pytest.raises(PayloadConflict):
        tickets.run_once("req-1", {"n": 2}, again)


def test_a_purged_key_is_new_work_again(tickets: Receipts, clock: ManualClock) -> None:
    tickets.run_once("req-1", {"n": 1}, CreateTicket("a"))
    clock.advance(3601)
    assert tickets.purge() == 1
    again = CreateTicket("a")
    assert tickets.run_once("req-1", {"n": 1}, again).replayed is False
    assert again.calls == 1


def test_without_retention_receipts_are_kept(tmp_path: Path, clock: ManualClock) -> None:
    with Receipts(str(tmp_path / "keep.db"), retention_seconds=None, clock=clock) as keep:
        keep.run_once("k", {}, lambda tx: 1)
        assert keep.get("k").expires_at is None
        assert keep.purge(now=clock.now() + 10**9) == 0
        assert [r.key for r in keep.list()] == ["k"]


@pytest.mark.parametrize("retention", [0.0, -5.0, math.nan, math.inf])
def test_retention_must_be_positive(tmp_path: Path, retention: float) -> None:
    with pytest.raises(ConfigurationError):
        Receipts(str(tmp_path / "r.db"), retention_seconds=retention)


def test_an_empty_key_is_refused(receipts: Receipts) -> None:
    with pytest.raises(ConfigurationError):
        receipts.run_once("", {}, lambda tx: 1)


def test_list_pages_by_key(receipts: Receipts) -> None:
    for key in ["b", "d", "a", "c"]:
        receipts.run_once(key, {}, lambda tx: None)
    assert [r.key for r in receipts.list(limit=2)] == ["a", "b"]
    assert [r.key for r in receipts.list(limit=2, after_key="b")] == ["c", "d"]
