"""A stored row that does not decode is shown as such; it never fails a reader for the store.

Rows are damaged around oncewire (``raw``), as an older version or a hand-written UPDATE would
leave them; every reader then still lists the others normally.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

from oncewire import Ledger, Receipts
from oncewire.cli import main
from oncewire.core.canonical import loads
from oncewire.core.errors import InvalidPayload
from tests.contract.conftest import RawDatabase
from tests.support.claims import settle_and_claim

DEEP = "[" * 5000 + "]" * 5000


@pytest.fixture
def low_recursion_limit() -> Iterator[None]:
    """Deep enough for the readers themselves, far too shallow for 5,000 nested lists."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(400)
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


@pytest.mark.parametrize("stored", ["{", DEEP, '{"a":NaN}'], ids=["truncated", "deep", "nan"])
def test_one_undecodable_payload_leaves_the_other_rows_readable(
    ledger: Ledger, raw: RawDatabase, stored: str, low_recursion_limit: None
) -> None:
    for n in range(3):
        ledger.accept(f"k-{n}", "send", {"n": n})
    raw.execute("UPDATE oncewire_effects SET payload = ? WHERE key = 'k-1'", (stored,))

    effects = ledger.effects.list()
    assert [e.key for e in effects] == ["k-0", "k-1", "k-2"]
    data = {e.key: e.as_dict() for e in effects}
    assert data["k-1"]["payload"] is None
    assert data["k-1"]["payload_error"].startswith("undecodable payload: ")
    assert data["k-0"]["payload"] == {"n": 0} and "payload_error" not in data["k-0"]
    assert data["k-2"]["payload"] == {"n": 2}
    paged = [ledger.effects.list(limit=1, after_id=e.id - 1)[0].key for e in effects]
    assert paged == ["k-0", "k-1", "k-2"]  # one at a time, the undecodable one included
    assert ledger.effects.get("k-1").as_dict()["payload_error"]
    json.dumps(data)  # what --json prints
    with pytest.raises(InvalidPayload):
        _ = ledger.effects.get("k-1").payload  # asking for that one payload says why


def test_an_undecodable_result_is_shown_as_such(ledger: Ledger, raw: RawDatabase) -> None:
    ledger.accept("k-1", "send", {})
    raw.execute(
        "UPDATE oncewire_effects SET state = 'done', result = ? WHERE key = 'k-1'", ("[1,",)
    )
    data = ledger.effects.get("k-1").as_dict()
    assert data["result"] is None and data["result_error"].startswith("undecodable result")
    assert data["payload"] == {}


def test_a_receipt_with_an_undecodable_payload_or_result(
    ledger: Ledger, raw: RawDatabase, low_recursion_limit: None
) -> None:
    receipts = Receipts(ledger.store)
    for key in ("r-0", "r-1", "r-2"):
        receipts.run_once(key, {"k": key}, lambda tx: {"ok": True})
    raw.execute("UPDATE oncewire_receipts SET payload = ? WHERE key = 'r-1'", (DEEP,))
    raw.execute("UPDATE oncewire_receipts SET result = '{' WHERE key = 'r-2'")
    data = {r.key: r.as_dict() for r in receipts.list()}
    assert data["r-0"] == {**data["r-0"], "payload": {"k": "r-0"}, "result": {"ok": True}}
    assert data["r-1"]["payload"] is None and data["r-1"]["payload_error"]
    assert data["r-1"]["result"] == {"ok": True}
    assert data["r-2"]["result"] is None and data["r-2"]["result_error"]
    json.dumps(data)


def test_the_cli_readers_show_the_bad_row_and_the_others(
    ledger: Ledger,
    raw: RawDatabase,
    store_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for n in range(3):
        ledger.accept(f"k-{n}", "send", {"n": n})
    raw.execute("UPDATE oncewire_effects SET payload = '{' WHERE key = 'k-1'")

    assert main(["effects", "list", "--db", store_url, "--json"]) == 0
    rows = {row["key"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"k-0", "k-1", "k-2"}
    assert rows["k-1"]["payload"] is None and rows["k-1"]["payload_error"]
    assert rows["k-2"]["payload"] == {"n": 2}

    assert main(["effects", "show", "k-1", "--db", store_url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    effect = shown.get("effect", shown)
    assert effect["payload"] is None and effect["payload_error"]

    assert main(["effects", "show", "k-1", "--db", store_url]) == 0
    assert "undecodable payload" in capsys.readouterr().out


def test_a_payload_that_is_not_utf8_is_shown_and_claimed_as_undecodable(
    ledger: Ledger, raw: RawDatabase, backend: str
) -> None:
    """Only SQLite can hold such text (PostgreSQL refuses invalid UTF-8 on the way in)."""
    if backend != "sqlite":
        pytest.skip("PostgreSQL stores no invalid UTF-8")
    for n in range(3):
        ledger.accept(f"k-{n}", "send", {"n": n})
    raw.execute(
        "UPDATE oncewire_effects SET payload = CAST(X'7B22FF223A317D' AS TEXT) WHERE key = 'k-1'"
    )
    data = {e.key: e.as_dict() for e in ledger.effects.list()}
    assert data["k-1"]["payload"] is None
    assert "not valid UTF-8" in data["k-1"]["payload_error"]
    assert data["k-0"]["payload"] == {"n": 0}

    # The dispatcher's claim gets it too, as text no JSON decoder accepts (it goes to dead
    # there) instead of failing every step of the dispatcher.
    _, claims = settle_and_claim(
        ledger.store, [], owner="w1", now=ledger.clock.now(), lease_seconds=30, limit=10
    )
    by_key = {c.key: c for c in claims}
    assert set(by_key) == {"k-0", "k-1", "k-2"}
    with pytest.raises(InvalidPayload):
        loads(by_key["k-1"].payload_json)
    assert loads(by_key["k-2"].payload_json) == {"n": 2}
    assert raw.query("SELECT state FROM oncewire_effects WHERE key = 'k-1'") == [("claimed",)]
