"""Store contract: the receiver's receipts."""

from __future__ import annotations

import pytest

from oncewire.storage import Store
from oncewire.storage.records import Receipt

from .conftest import T0, Arrange, RawDatabase


def reserve(
    store: Store,
    key: str,
    *,
    digest: str = "a" * 64,
    payload_json: str = "{}",
    now: float = T0,
    expires_at: float | None = T0 + 3600,
    result_json: str | None = None,
) -> Receipt | None:
    with store.transaction() as tx:
        existing = store.reserve_receipt_in_tx(
            tx, key=key, digest=digest, payload_json=payload_json, now=now, expires_at=expires_at
        )
        if existing is None and result_json is not None:
            store.complete_receipt_in_tx(tx, key=key, result_json=result_json)
    return existing


def test_reserving_a_new_key_returns_none_and_writes_a_pending_receipt(
    store: Store, raw: RawDatabase
) -> None:
    assert reserve(store, "r1", payload_json='{"n":1}', expires_at=T0 + 60) is None
    assert raw.query(
        "SELECT key, digest, payload, result, created_at, expires_at FROM oncewire_receipts"
    ) == [("r1", "a" * 64, '{"n":1}', None, T0, T0 + 60)]
    receipt = store.get_receipt("r1")
    assert receipt == Receipt("r1", "a" * 64, '{"n":1}', None, T0, T0 + 60)
    assert receipt.result is None


def test_complete_stores_the_result(store: Store) -> None:
    reserve(store, "r1", result_json='{"ticket":7}')
    receipt = store.get_receipt("r1")
    assert receipt is not None
    assert receipt.result_json == '{"ticket":7}'
    assert receipt.result == {"ticket": 7}
    assert receipt.as_dict() == {
        "key": "r1",
        "digest": "a" * 64,
        "payload": {},
        "result": {"ticket": 7},
        "created_at": T0,
        "expires_at": T0 + 3600,
    }


def test_reserving_an_existing_key_returns_the_stored_receipt_and_changes_nothing(
    store: Store, raw: RawDatabase
) -> None:
    reserve(store, "r1", digest="a" * 64, payload_json='{"n":1}', result_json='"first"')
    before = raw.query("SELECT * FROM oncewire_receipts")
    existing = reserve(
        store, "r1", digest="b" * 64, payload_json='{"n":2}', now=T0 + 5, expires_at=None
    )
    assert existing == Receipt("r1", "a" * 64, '{"n":1}', '"first"', T0, T0 + 3600)
    assert raw.query("SELECT * FROM oncewire_receipts") == before


def test_a_reservation_rolls_back_with_its_transaction(store: Store, raw: RawDatabase) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), store.transaction() as tx:
        store.reserve_receipt_in_tx(
            tx, key="r1", digest="a" * 64, payload_json="{}", now=T0, expires_at=None
        )
        store.complete_receipt_in_tx(tx, key="r1", result_json="1")
        raise Boom
    assert store.get_receipt("r1") is None
    assert raw.count("oncewire_receipts") == 0


def test_a_receipt_and_an_effect_commit_in_one_transaction(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    with store.transaction() as tx:
        store.reserve_receipt_in_tx(
            tx, key="in/1", digest="a" * 64, payload_json="{}", now=T0, expires_at=None
        )
        store.insert_effect_in_tx(
            tx,
            key="out/1",
            kind="send",
            payload_json="{}",
            digest="b" * 64,
            max_attempts=1,
            not_before=T0,
            deadline=None,
            now=T0,
        )
        store.complete_receipt_in_tx(tx, key="in/1", result_json='"forwarded"')
    assert raw.count("oncewire_receipts") == 1
    assert arrange.get("out/1").key == "out/1"


def test_get_unknown_is_none(store: Store) -> None:
    assert store.get_receipt("nope") is None


def test_list_is_ordered_by_key_and_pages(store: Store) -> None:
    for key in ["c", "a", "e", "b", "d"]:
        reserve(store, key)
    assert [r.key for r in store.list_receipts()] == ["a", "b", "c", "d", "e"]
    assert [r.key for r in store.list_receipts(limit=2)] == ["a", "b"]
    assert [r.key for r in store.list_receipts(limit=2, after_key="b")] == ["c", "d"]
    assert [r.key for r in store.list_receipts(after_key="e")] == []


def test_purge_deletes_only_receipts_whose_retention_ended(store: Store, raw: RawDatabase) -> None:
    reserve(store, "old", expires_at=T0 + 10)
    reserve(store, "boundary", expires_at=T0 + 20)
    reserve(store, "young", expires_at=T0 + 30)
    reserve(store, "forever", expires_at=None)
    assert store.purge_receipts(expired_before=T0 + 20) == 1
    assert [r.key for r in store.list_receipts()] == ["boundary", "forever", "young"]
    assert store.purge_receipts(expired_before=T0 + 20) == 0
    assert store.purge_receipts(expired_before=T0 + 10_000) == 2
    assert [row[0] for row in raw.query("SELECT key FROM oncewire_receipts")] == ["forever"]
