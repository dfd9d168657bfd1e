"""``Store.group_commit``: commits inside stay atomic and visible one by one; the store's
durability setting is back in force when the block ends, even when it ends in an error."""

from __future__ import annotations

import pytest

from oncewire.storage import Store
from tests.contract.conftest import T0, RawDatabase


def _reserve(store: Store, tx: object, key: str) -> None:
    store.reserve_receipt_in_tx(
        tx,  # type: ignore[arg-type]
        key=key,
        digest="d" * 64,
        payload_json="{}",
        now=T0,
        expires_at=None,
    )


def _flush_setting(store: Store, raw: RawDatabase) -> str:
    if store.dialect == "sqlite":
        return str(store.health()["synchronous"])
    with store.transaction() as tx:
        return str(tx.execute("SHOW synchronous_commit").fetchone()[0])


def test_each_commit_in_a_group_is_atomic_and_visible_at_once(
    store: Store, raw: RawDatabase
) -> None:
    before = _flush_setting(store, raw)
    with store.group_commit():
        with store.transaction() as tx:
            _reserve(store, tx, "first")
        # Another connection sees the first commit before the group ends.
        assert [row[0] for row in raw.query("SELECT key FROM oncewire_receipts")] == ["first"]
        with pytest.raises(RuntimeError), store.transaction() as tx:
            _reserve(store, tx, "rolled-back")
            raise RuntimeError("this transaction fails")
        with store.transaction() as tx:
            _reserve(store, tx, "second")
    keys = [row[0] for row in raw.query("SELECT key FROM oncewire_receipts ORDER BY key")]
    assert keys == ["first", "second"]
    assert _flush_setting(store, raw) == before


def test_the_flush_setting_is_restored_after_an_error(store: Store, raw: RawDatabase) -> None:
    before = _flush_setting(store, raw)
    with pytest.raises(KeyError), store.group_commit():
        raise KeyError("the sweep failed")
    assert _flush_setting(store, raw) == before
    assert before in ("FULL", "on")
