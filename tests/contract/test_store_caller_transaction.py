"""A caller's own connection, inside the caller's own transaction, carries oncewire's writes.

Every store offers it (``Ledger.accept_in`` is built on it); what it writes commits or rolls back
with the caller, and a connection that is not inside an open transaction is refused.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from oncewire.core.errors import InvalidState
from oncewire.storage import Store
from tests.contract.conftest import T0, RawDatabase


def _connect(store: Store) -> Any:
    if store.dialect == "sqlite":
        return sqlite3.connect(store.path, isolation_level=None)  # type: ignore[attr-defined]
    import psycopg

    return psycopg.connect(store.url)


def _insert(store: Store, tx: Any, key: str) -> None:
    store.insert_effect_in_tx(
        tx,
        key=key,
        kind="send",
        payload_json="{}",
        digest="d" * 64,
        max_attempts=3,
        not_before=T0,
        deadline=None,
        now=T0,
    )


@pytest.mark.parametrize("commit", [True, False])
def test_writes_through_the_callers_transaction_follow_it(
    store: Store, raw: RawDatabase, commit: bool
) -> None:
    conn = _connect(store)
    try:
        if store.dialect == "sqlite":
            conn.execute("BEGIN")
        else:
            conn.execute("SELECT 1")  # psycopg opens the transaction with the first statement
        _insert(store, store.caller_transaction(conn), "mine")
        assert raw.count("oncewire_effects") == 0  # not visible before the caller decides
        conn.commit() if commit else conn.rollback()
    finally:
        conn.close()
    assert raw.count("oncewire_effects") == (1 if commit else 0)


def test_a_connection_outside_a_transaction_is_refused(store: Store, raw: RawDatabase) -> None:
    conn = _connect(store)
    try:
        if store.dialect == "postgresql":
            conn.autocommit = True
        with pytest.raises(InvalidState):
            store.caller_transaction(conn)
        with pytest.raises(InvalidState):
            store.caller_transaction(object())
    finally:
        conn.close()
    assert raw.count("oncewire_effects") == 0


class _Stranger:
    """Looks like a transaction (it has ``execute``) but belongs to no store."""

    def execute(self, sql: str, params: Any = ()) -> None:
        raise AssertionError("a store wrote through a transaction that is not its own")


def test_a_transaction_that_is_not_the_stores_is_refused(store: Store, raw: RawDatabase) -> None:
    with pytest.raises(InvalidState, match="not one of its transactions"):
        _insert(store, _Stranger(), "stray")
    assert raw.count("oncewire_effects") == 0
