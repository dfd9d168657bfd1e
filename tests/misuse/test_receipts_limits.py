"""What ``Receipts.run_once`` and ``run_many`` let in: the same key and payload limits as
``accept``, refused before any SQL and before the work runs, alike on both backends."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from oncewire import ConfigurationError, Receipts
from oncewire.errors import InvalidPayload
from oncewire.storage import Transaction
from oncewire.testing import ManualClock
from tests.contract.conftest import RawDatabase


@pytest.fixture
def receipts(store_url: str, clock: ManualClock, raw: RawDatabase) -> Iterator[Receipts]:
    # ``raw`` first: it opens (and so creates) the store through the ledger fixture.
    opened = Receipts(store_url, clock=clock, max_payload_bytes=1024)
    try:
        yield opened
    finally:
        opened.close()


class Work:
    """The receiver's work; counts its calls (a refused item must not run it)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, tx: Transaction, *args: Any) -> dict[str, int]:
        self.calls += 1
        return {"n": self.calls}


def _nested(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


FORMAT = "must not contain a format character (Unicode category Cf)"

BAD_KEYS = [
    pytest.param("a\x00b", "must not contain a control character: U+0000 at index 1", id="nul"),
    pytest.param("\r\n", "must not contain a control character: U+000D at index 0", id="crlf"),
    pytest.param("x\udc00", "must not contain a lone surrogate: U+DC00 at index 1", id="surrogate"),
    pytest.param(" \t ", "must not contain a control character: U+0009 at index 1", id="ws-tab"),
    pytest.param("  ", "must not be only whitespace", id="spaces"),
    pytest.param("k\u2003", "must not start or end with whitespace: 'k\\u2003'", id="em-space"),
    pytest.param("", "must not be empty", id="empty"),
    pytest.param("k" * 513, "is 513 characters long; the limit is 512", id="long"),
    pytest.param(b"k", "must be a string, not bytes", id="bytes"),
    pytest.param("r\u200bk", f"{FORMAT}: U+200B at index 1", id="zero-width-space"),
    pytest.param("\u202eabc", f"{FORMAT}: U+202E at index 0", id="rtl-override"),
    pytest.param("k\u2067", f"{FORMAT}: U+2067 at index 1", id="rli"),
    pytest.param("\ufeffk", f"{FORMAT}: U+FEFF at index 0", id="bom"),
]


@pytest.mark.parametrize(("key", "problem"), BAD_KEYS)
def test_a_bad_receipt_key_is_refused_before_the_work(
    receipts: Receipts, raw: RawDatabase, key: Any, problem: str
) -> None:
    work = Work()
    with pytest.raises(ConfigurationError) as caught:
        receipts.run_once(key, {"a": 1}, work)
    assert str(caught.value) == f"a receipt key {problem}"
    assert work.calls == 0
    assert raw.count("oncewire_receipts") == 0


POISON = [
    pytest.param(_nested(200), "nested too deeply", id="deep"),
    pytest.param([10**641], r"payload\[0\] is an integer of more than 640 digits", id="big-int"),
    pytest.param({"s": "\ud800"}, "s has a string with a lone surrogate", id="surrogate"),
    pytest.param("x" * 1023, "1025 bytes of canonical JSON; the limit is 1024", id="too-large"),
]


@pytest.mark.parametrize(("payload", "message"), POISON)
def test_a_payload_a_reader_cannot_load_is_refused_before_the_work(
    receipts: Receipts, raw: RawDatabase, payload: Any, message: str
) -> None:
    work = Work()
    with pytest.raises(InvalidPayload, match=message):
        receipts.run_once("k", payload, work)
    assert work.calls == 0
    assert raw.count("oncewire_receipts") == 0


def test_run_many_refuses_bad_items_alone(receipts: Receipts, raw: RawDatabase) -> None:
    work = Work()
    results = receipts.run_many(
        [("ok-1", {"a": 1}), ("bad\x00", {"a": 2}), ("ok-2", _nested(101)), ("ok-3", {"a": 3})],
        work,
    )
    assert [type(r).__name__ for r in results] == [
        "ReceiptResult",
        "ConfigurationError",
        "InvalidPayload",
        "ReceiptResult",
    ]
    assert work.calls == 2
    stored = sorted(row[0] for row in raw.query("SELECT key FROM oncewire_receipts"))
    assert stored == ["ok-1", "ok-3"]


def test_a_result_that_could_not_be_replayed_rolls_the_work_back(
    receipts: Receipts, raw: RawDatabase
) -> None:
    def deep_result(tx: Transaction) -> Any:
        tx.execute("INSERT INTO oncewire_receipts_probe (n) VALUES (1)")
        return _nested(150)

    raw.execute("CREATE TABLE oncewire_receipts_probe (n INTEGER)")
    with pytest.raises(InvalidPayload, match="nested too deeply"):
        receipts.run_once("k", {"a": 1}, deep_result)
    assert raw.count("oncewire_receipts") == 0
    assert raw.count("oncewire_receipts_probe") == 0


@pytest.mark.parametrize("bad", [True, False, 0, -1.0, math.nan, math.inf, "60"])
def test_retention_seconds_is_a_positive_finite_number(store_url: str, bad: Any) -> None:
    # Regression: True was accepted as a one-second retention window.
    with pytest.raises(ConfigurationError, match="retention_seconds must be a positive"):
        Receipts(store_url, retention_seconds=bad)


@pytest.mark.parametrize("bad", [0, True, 2.5, "1"])
def test_max_payload_bytes_is_checked(store_url: str, bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="max_payload_bytes must be an integer"):
        Receipts(store_url, max_payload_bytes=bad)
