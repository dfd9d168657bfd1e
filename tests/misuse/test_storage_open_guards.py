"""Opening a store through the Python API: what it refuses, and that a refusal changes nothing.

A store that fails SQLite's integrity check is not opened for writing; ``read_only=True`` opens
a store without writing to it (and without migrating it), on both backends; a database that
holds other tables becomes a store by default (the outbox beside the application's tables is
the documented use) and is refused with ``adopt=False``; a failed install leaves the file's
journal as it was.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from oncewire import Ledger
from oncewire.core.errors import SchemaError, StatementError, StoreUnusable
from oncewire.storage import open_store
from tests.contract.conftest import RawDatabase
from tests.support.store_files import (
    digest,
    journal_mode,
    made_store,
    quick_check,
    scribble_pages,
    tables,
)


@pytest.fixture
def app_db(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
        conn.execute("INSERT INTO orders VALUES (1, 9.5)")
        conn.commit()
    return path


def test_a_writer_refuses_a_corrupt_store(tmp_path: Path) -> None:
    path = made_store(tmp_path / "corrupt.db", effects=1500)
    scribble_pages(path)
    sqlite_says = quick_check(path)
    before = digest(path)
    with pytest.raises(StoreUnusable, match="malformed") as caught:
        Ledger(str(path))
    assert caught.value.fields["reason"] == "corrupt"
    assert sqlite_says[0] in str(caught.value)
    assert digest(path) == before
    # Read-only, what is left can still be read (the newest effects are on sound pages).
    with Ledger(str(path), read_only=True) as ledger:
        assert ledger.effects.get("order-01499").state == "pending"
    assert digest(path) == before


def test_read_only_writes_nothing_and_refuses_writes(
    store_url: str, backend: str, raw: RawDatabase, ledger: Ledger
) -> None:
    ledger.accept("k-1", "email", {"n": 1})
    ledger.close()
    with Ledger(store_url, read_only=True) as reader:
        assert reader.effects.get("k-1").payload == {"n": 1}
        with pytest.raises(StoreUnusable, match="read-only"):
            reader.accept("k-2", "email", {})
    assert raw.query("SELECT key FROM oncewire_effects") == [("k-1",)]


def test_read_only_does_not_migrate_an_older_schema(
    store_url: str, backend: str, raw: RawDatabase, ledger: Ledger
) -> None:
    ledger.close()
    newest = raw.query("SELECT MAX(version) FROM oncewire_schema")[0][0]
    raw.execute("DELETE FROM oncewire_schema WHERE version = ?", (newest,))
    with pytest.raises(SchemaError, match="read-only"):
        Ledger(store_url, read_only=True)
    assert raw.query("SELECT MAX(version) FROM oncewire_schema")[0][0] == newest - 1


def test_read_only_never_creates(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    with pytest.raises(StoreUnusable, match="no database"):
        Ledger(str(path), read_only=True)
    assert not path.exists()


def test_the_documented_shared_database_is_adopted_by_default(app_db: Path) -> None:
    with Ledger(str(app_db)) as ledger, ledger.transaction() as tx:
        tx.execute("INSERT INTO orders VALUES (:id, :total)", {"id": 2, "total": 3.0})
        tx.accept("order-2", "email", {"order": 2})
    assert {"orders", "oncewire_effects"} <= set(tables(app_db))


@pytest.mark.empty_store
def test_adopt_false_refuses_a_database_holding_other_tables(store_url: str, backend: str) -> None:
    if backend == "sqlite":
        with closing(sqlite3.connect(store_url)) as conn:
            conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
            conn.commit()
        before = digest(Path(store_url))
    else:
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    with pytest.raises(SchemaError, match="orders") as caught:
        open_store(store_url, adopt=False)
    assert caught.value.fields["tables"] == ["orders"]
    if backend == "sqlite":
        assert digest(Path(store_url)) == before
        assert tables(Path(store_url)) == ["orders"]
    else:
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as conn:
            found = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            ).fetchall()
        assert found == [("orders",)]
    open_store(store_url, adopt=True).close()


def test_a_failed_install_leaves_the_journal_as_it_was(app_db: Path) -> None:
    with closing(sqlite3.connect(app_db)) as conn:  # the app's own table, under oncewire's name
        conn.execute("CREATE TABLE oncewire_effects (id INTEGER PRIMARY KEY, note TEXT)")
        conn.commit()
    before = digest(app_db)
    with pytest.raises(StatementError, match="oncewire_effects"):
        Ledger(str(app_db))
    assert journal_mode(app_db) == "delete"
    assert tables(app_db) == ["oncewire_effects", "orders"]
    assert digest(app_db) == before


def test_a_file_cut_short_after_its_check_is_checked_again(tmp_path: Path) -> None:
    """The quick check runs once per file and process, and again when the header looks wrong:
    a file that lost its tail (not a whole number of pages) is checked and refused."""
    path = made_store(tmp_path / "cut.db", effects=600)
    Ledger(str(path)).close()  # checked and found sound by this process
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(size - 100)  # the last page, cut short
    before = digest(path)
    with pytest.raises(StoreUnusable, match="quick_check") as caught:
        Ledger(str(path))
    assert caught.value.fields["reason"] == "corrupt"
    assert digest(path) == before
