"""What the layers above storage ask of the store about its backend, so that none of them
reaches a driver: its label, whether it reads a snapshot, its shared commits, the schema
version it migrates to, an awaited caller transaction where the backend has none to give, and
the integrity check of a SQLite file that does not open as a store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from oncewire.core.errors import InvalidState
from oncewire.storage import Store, file_integrity, latest_schema_version, open_store
from tests.contract.conftest import T0, RawDatabase


def _reserve(store: Store, key: str) -> None:
    with store.transaction() as tx:
        store.reserve_receipt_in_tx(
            tx, key=key, digest="d" * 64, payload_json="{}", now=T0, expires_at=None
        )


def test_a_fresh_store_is_at_the_latest_schema_version(store: Store) -> None:
    assert store.schema_version() == latest_schema_version(store.dialect)


def test_the_label_names_a_sqlite_file_and_never_a_postgresql_url(store: Store) -> None:
    assert store.snapshot is False
    if store.dialect == "sqlite":
        assert store.label == store.url
        assert Path(store.label).exists()
    else:
        assert store.label == "the PostgreSQL store"
        assert "postgresql://" not in store.label


def test_commits_one_by_one_are_not_shared(store: Store) -> None:
    _reserve(store, "alone")
    assert store.shared_commits() is None


def test_a_grouped_sqlite_store_counts_its_shared_commits(tmp_path: Path) -> None:
    grouped = open_store(str(tmp_path / "grouped.db"), group_commit=True)
    try:
        assert grouped.shared_commits() == {"commits": 0, "committed": 0}
        for number in range(3):
            _reserve(grouped, f"k{number}")  # one after another: a commit each
        assert grouped.shared_commits() == {"commits": 3, "committed": 3}
    finally:
        grouped.close()


def test_an_awaited_caller_transaction_is_refused_before_anything_is_written(
    store: Store, raw: RawDatabase
) -> None:
    def never(coroutine: object) -> object:
        raise AssertionError("nothing is awaited for a refused connection")

    with pytest.raises(InvalidState) as refused:
        store.awaited_caller_transaction(object(), never)
    message = str(refused.value)
    assert "nothing was written" in message
    if store.dialect == "sqlite":
        assert "this ledger's store is SQLite" in message
    else:
        assert "psycopg.AsyncConnection, not object" in message
    assert raw.count("oncewire_effects") == 0


def test_the_integrity_check_of_a_file_that_does_not_open(tmp_path: Path) -> None:
    sound = tmp_path / "plain.db"
    with sqlite3.connect(sound) as conn:
        conn.execute("CREATE TABLE t (x)")
    check, problems = file_integrity(str(sound))
    assert check == "PRAGMA quick_check"
    assert problems == ()
    noise = tmp_path / "noise.db"
    noise.write_bytes(b"not a database at all" * 200)
    assert file_integrity(str(noise)) == ("PRAGMA quick_check", ("file is not a database",))
    assert file_integrity(str(tmp_path / "nowhere" / "x.db")) == ("PRAGMA quick_check", None)
