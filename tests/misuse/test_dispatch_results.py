"""What a sink returns that is not one of the four outcomes, on both backends.

Regressions: a sink returning what ``Receipts.run_once`` returns (a ``ReceiptResult``, the
pattern for a receiver beside the dispatcher) was recorded ``uncertain`` ("neither an outcome
nor a storable result"), retried as a redelivery and ended ``dead``, "outcome unknown",
although its work had committed; so was any other value that JSON cannot hold. A value the
sink *returns* says the sink ran: it is ``done``, its result stored when JSON can hold it, and
"result not stored" (WARNING) when it cannot. Only answers that show the work may not have run
as meant (an unawaited coroutine, a generator, an outcome class, an exception instance) stay
``uncertain`` (tests/misuse/test_dispatch.py). Every check reads the rows around oncewire.
"""

from __future__ import annotations

import collections
import enum
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from oncewire import (
    Attempt,
    ConfigurationError,
    Dispatcher,
    Done,
    Ledger,
    Receipts,
    RetryPolicy,
)
from oncewire.aio import AsyncReceipts
from oncewire.aio.ledger import ThreadTransaction
from oncewire.core.limits import DEFAULT_MAX_RESULT_BYTES
from oncewire.receipts import ReceiptResult
from oncewire.storage import Transaction
from tests.contract.conftest import RawDatabase
from tests.misuse.test_dispatch import dispatch_once


@pytest.fixture
def ledger(store_url: str) -> Iterator[Ledger]:
    """On the system clock: these tests run real dispatchers, in real time."""
    opened = Ledger(store_url)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def receipts(ledger: Ledger, store_url: str, raw: RawDatabase) -> Iterator[Receipts]:
    """The receiver beside the dispatcher: its receipts and its own table in the same
    database, through a store of its own."""
    raw.execute("CREATE TABLE charges (key TEXT NOT NULL, fence INTEGER NOT NULL)")
    opened = Receipts(store_url)
    try:
        yield opened
    finally:
        opened.close()


def attempt_rows(raw: RawDatabase, key: str) -> list[tuple[Any, ...]]:
    return raw.query(
        "SELECT a.outcome, a.state, a.error FROM oncewire_attempts a "
        "JOIN oncewire_effects e ON e.id = a.effect_id WHERE e.key = ? ORDER BY a.fence",
        (key,),
    )


def receipt_result(raw: RawDatabase, key: str) -> Any:
    rows = raw.query("SELECT result FROM oncewire_receipts WHERE key = ?", (key,))
    assert len(rows) == 1, rows
    return rows[0][0]


def charges(raw: RawDatabase) -> list[tuple[Any, ...]]:
    return raw.query("SELECT key, fence FROM charges ORDER BY key, fence")


# -- the receiver beside the dispatcher --------------------------------------------------------


def test_a_receipt_result_is_done_with_its_result(
    ledger: Ledger, raw: RawDatabase, receipts: Receipts, backend: str
) -> None:
    insert = "INSERT INTO charges (key, fence) VALUES (:key, {})"

    def charge(attempt: Attempt) -> ReceiptResult[Any]:
        def work(tx: Transaction) -> dict[str, Any]:
            tx.execute(insert.format(attempt.fence), {"key": attempt.key})
            return {"charged": attempt.key}

        return receipts.run_once(attempt.key, attempt.payload, work)

    ledger.accept("order-1/charge", "charge", {"cents": 1999})
    dispatch_once(ledger, raw, {"charge": charge}, ["order-1/charge"])
    row = raw.effect_row("order-1/charge")
    assert (row["state"], row["result"], row["last_error"]) == (
        "done",
        '{"charged":"order-1/charge"}',
        None,
    )
    assert (row["attempts"], bool(row["maybe_sent"])) == (1, False)
    assert attempt_rows(raw, "order-1/charge") == [("done", "done", None)]
    assert receipt_result(raw, "order-1/charge") == '{"charged":"order-1/charge"}'
    assert charges(raw) == [("order-1/charge", 1)]


def test_a_replayed_receipt_is_done_and_noted_in_the_attempt_history(
    ledger: Ledger, raw: RawDatabase, receipts: Receipts, backend: str
) -> None:
    """The receiver committed on an earlier attempt whose outcome was not recorded (its
    dispatcher died): the redelivery replays the receipt, and the history says so."""
    insert = "INSERT INTO charges (key, fence) VALUES (:key, 0)"
    calls: list[str] = []

    def work_for(key: str) -> Any:
        def work(tx: Transaction) -> dict[str, Any]:
            calls.append(key)
            tx.execute(insert, {"key": key})
            return {"charged": key}

        return work

    ledger.accept("k", "charge", {"cents": 1999})
    first = receipts.run_once("k", {"cents": 1999}, work_for("k"))
    assert first.replayed is False

    def charge(attempt: Attempt) -> ReceiptResult[Any]:
        return receipts.run_once(attempt.key, attempt.payload, work_for(attempt.key))

    dispatch_once(ledger, raw, {"charge": charge}, ["k"])
    row = raw.effect_row("k")
    assert (row["state"], row["result"], row["last_error"]) == ("done", '{"charged":"k"}', None)
    [(outcome, state, error)] = attempt_rows(raw, "k")
    assert (outcome, state) == ("done", "done")
    assert error is not None and error.startswith("replayed:"), error
    assert calls == ["k"]  # the work ran once, before the dispatcher
    assert charges(raw) == [("k", 0)]


def test_an_async_sink_returning_async_receipts_result_is_done(
    ledger: Ledger, raw: RawDatabase, receipts: Receipts, backend: str
) -> None:
    insert = "INSERT INTO charges (key, fence) VALUES (:key, 1)"

    class Charge:
        def __init__(self) -> None:
            self.receiver = AsyncReceipts(receipts)

        async def __call__(self, attempt: Attempt) -> ReceiptResult[Any]:
            async def work(tx: ThreadTransaction) -> dict[str, Any]:
                await tx.execute(insert, {"key": attempt.key})
                return {"charged": attempt.key}

            return await self.receiver.run_once(attempt.key, attempt.payload, work)

        async def aclose(self) -> None:
            await self.receiver.pool.close()

    keys = ["a", "b"]
    for key in keys:
        ledger.accept(key, "charge", {"key": key})
    dispatch_once(ledger, raw, {"charge": Charge()}, keys)
    for key in keys:
        row = raw.effect_row(key)
        expected = f'{{"charged":"{key}"}}'
        assert (row["state"], row["result"], row["attempts"]) == ("done", expected, 1)
        assert attempt_rows(raw, key) == [("done", "done", None)]
        assert receipt_result(raw, key) == expected
    assert charges(raw) == [("a", 1), ("b", 1)]


def test_a_receipts_result_in_a_batch_answer_is_done(
    ledger: Ledger, raw: RawDatabase, receipts: Receipts
) -> None:
    class Batch:
        def call_batch(self, attempts: Sequence[Attempt]) -> list[Any]:
            answers = receipts.run_many(
                [(a.key, a.payload) for a in attempts], lambda tx, key, payload: key.upper()
            )
            return list(answers)

    keys = ["x", "y", "z"]
    for key in keys:
        ledger.accept(key, "charge", {"key": key})
    dispatch_once(ledger, raw, {"charge": Batch()}, keys, batch_size=3)
    for key in keys:
        row = raw.effect_row(key)
        assert (row["state"], row["result"]) == ("done", f'"{key.upper()}"')
        assert receipt_result(raw, key) == f'"{key.upper()}"'


# -- any other value a sink returns: the sink ran -------------------------------------------


class Colour(enum.IntEnum):
    RED = 1


class _Opaque:
    pass


UNSTORABLE: dict[str, Any] = {
    "object": object(),
    "instance": _Opaque(),
    "set": {1, 2},
    "bytes": b"sent",
    "dict-with-an-object": {"id": object()},
}

STORABLE: dict[str, tuple[Any, str]] = {
    "int-enum": (Colour.RED, "1"),
    "ordered-dict": (collections.OrderedDict(b=2, a=1), '{"a":1,"b":2}'),
    "dict-subclass": (type("Row", (dict,), {})(id=7), '{"id":7}'),
}


@pytest.mark.parametrize("case", sorted(UNSTORABLE))
def test_a_value_json_cannot_hold_is_done_with_its_result_not_stored(
    ledger: Ledger, raw: RawDatabase, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    value = UNSTORABLE[case]
    ledger.accept("k", "send", {})
    with caplog.at_level(logging.INFO, logger="oncewire.dispatch"):
        dispatch_once(ledger, raw, {"send": lambda a: value}, ["k"])
    row = raw.effect_row("k")
    assert (row["state"], row["result"], bool(row["maybe_sent"])) == ("done", None, False)
    name = type(value).__name__
    assert row["last_error"].startswith(f"result not stored: {name}"), row["last_error"]
    assert [(o, s) for o, s, _ in attempt_rows(raw, "k")] == [("done", "done")]
    lines = [r for r in caplog.records if "key=k " in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING]
    assert f"result not stored: {name}" in lines[0].getMessage()


@pytest.mark.parametrize("case", sorted(STORABLE))
def test_a_value_json_can_hold_is_done_with_its_result(
    ledger: Ledger, raw: RawDatabase, case: str
) -> None:
    value, stored = STORABLE[case]
    ledger.accept("k", "send", {})
    dispatch_once(ledger, raw, {"send": lambda a: value}, ["k"])
    row = raw.effect_row("k")
    assert (row["state"], row["result"], row["last_error"]) == ("done", stored, None)


def test_an_unstorable_value_in_a_batch_answer_is_done(ledger: Ledger, raw: RawDatabase) -> None:
    class Batch:
        def call_batch(self, attempts: Sequence[Attempt]) -> list[Any]:
            return [object(), Done("fine")][: len(attempts)]

    for key in ("a", "b"):
        ledger.accept(key, "send", {})
    dispatch_once(ledger, raw, {"send": Batch()}, ["a", "b"], batch_size=2)
    first, second = raw.effect_row("a"), raw.effect_row("b")
    assert (first["state"], first["result"]) == ("done", None)
    assert first["last_error"].startswith("result not stored: object")
    assert (second["state"], second["result"]) == ("done", '"fine"')


def test_a_done_effect_is_not_attempted_again(ledger: Ledger, raw: RawDatabase) -> None:
    """The old reading made an unstorable answer a redelivery; it must not be claimed again."""
    calls: list[int] = []

    def send(attempt: Attempt) -> Any:
        calls.append(attempt.number)
        return object()

    ledger.accept("k", "send", {}, max_attempts=3)
    policy = RetryPolicy(base_seconds=0.0, jitter=0.0)
    Dispatcher(ledger, {"send": send}, retry=policy, poll_seconds=0.01).run(
        until_idle=True, handle_signals=False
    )
    assert calls == [1]
    assert raw.effect_row("k")["state"] == "done"


# -- a result has a size limit; the work still happened ---------------------------------------


def test_a_result_bigger_than_the_limit_is_done_without_it(
    ledger: Ledger, raw: RawDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: a 50 MB answer became a 50 MB row."""
    big = "x" * (DEFAULT_MAX_RESULT_BYTES + 1)
    ledger.accept("big", "send", {})
    ledger.accept("fits", "send", {})
    answers = {"big": big, "fits": "x" * (DEFAULT_MAX_RESULT_BYTES - 2)}  # 2 bytes of quotes
    with caplog.at_level(logging.INFO, logger="oncewire.dispatch"):
        dispatch_once(ledger, raw, {"send": lambda a: answers[a.key]}, ["big", "fits"])
    row = raw.effect_row("big")
    assert (row["state"], row["result"], bool(row["maybe_sent"])) == ("done", None, False)
    assert row["last_error"] == (
        f"result not stored: str: its canonical JSON is {DEFAULT_MAX_RESULT_BYTES + 3} bytes; "
        f"the limit is {DEFAULT_MAX_RESULT_BYTES} (max_result_bytes)"
    )
    assert raw.query(
        "SELECT LENGTH(result), last_error FROM oncewire_effects WHERE key = ?", ("fits",)
    ) == [(DEFAULT_MAX_RESULT_BYTES, None)]
    lines = [r for r in caplog.records if "key=big " in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING]
    assert "result not stored: str" in lines[0].getMessage()


def test_max_result_bytes_sets_the_limit(ledger: Ledger, raw: RawDatabase) -> None:
    ledger.accept("small", "send", {})
    ledger.accept("large", "send", {})
    answers = {"small": {"n": "x" * 10}, "large": {"n": "x" * 200}}
    dispatch_once(
        ledger, raw, {"send": lambda a: answers[a.key]}, ["small", "large"], max_result_bytes=100
    )
    assert raw.effect_row("small")["result"] == '{"n":"xxxxxxxxxx"}'
    large = raw.effect_row("large")
    assert (large["state"], large["result"]) == ("done", None)
    assert "the limit is 100 (max_result_bytes)" in large["last_error"]


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "1000", (256 << 20) + 1])
def test_an_invalid_max_result_bytes_is_refused(ledger: Ledger, limit: Any) -> None:
    with pytest.raises(ConfigurationError, match="max_result_bytes"):
        Dispatcher(ledger, {"send": lambda a: None}, max_result_bytes=limit)
