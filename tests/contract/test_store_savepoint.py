"""``Store.savepoint_in_tx``: a failing scope rolls back only itself, on every backend."""

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


def test_a_failing_savepoint_rolls_back_only_its_own_writes(store: Store, raw: RawDatabase) -> None:
    with store.transaction() as tx:
        _reserve(store, tx, "before")
        with pytest.raises(RuntimeError), store.savepoint_in_tx(tx, "inner"):
            _reserve(store, tx, "inside")
            raise RuntimeError("this item fails")
        with store.savepoint_in_tx(tx, "kept"):
            _reserve(store, tx, "after")
    keys = [row[0] for row in raw.query("SELECT key FROM oncewire_receipts ORDER BY key")]
    assert keys == ["after", "before"]


def test_a_savepoint_name_must_be_an_identifier(store: Store) -> None:
    with store.transaction() as tx, pytest.raises(ValueError):
        store.savepoint_in_tx(tx, "x; DROP TABLE oncewire_effects")
