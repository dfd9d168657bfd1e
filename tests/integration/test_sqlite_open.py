"""Opening SQLite stores: pragmas, concurrent first opens, and files that are not stores."""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncewire import ConfigurationError, Ledger, StorageError
from oncewire.errors import SchemaError, StoreBusy
from oncewire.storage import open_store
from oncewire.storage.sqlite import SQLiteStore
from oncewire.storage.sqlite.driver import migrations, path_from_url

Child = Callable[..., subprocess.Popen[str]]
Peek = Callable[..., list[tuple[Any, ...]]]

NOT_A_DATABASE = b"this is a text file, not a database\n" * 64


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_durability_pragmas(db_path: Path) -> None:
    store = SQLiteStore(str(db_path))
    try:
        with store.transaction() as tx:
            pragmas = {
                name: tx.execute(f"PRAGMA {name}").fetchone()[0]
                for name in ("journal_mode", "synchronous", "busy_timeout", "foreign_keys")
            }
    finally:
        store.close()
    assert pragmas == {
        "journal_mode": "wal",
        "synchronous": 2,
        "busy_timeout": 10_000,
        "foreign_keys": 1,
    }


def test_synchronous_can_be_lowered_but_not_misspelt(db_path: Path) -> None:
    store = SQLiteStore(str(db_path), synchronous="normal")
    try:
        with store.transaction() as tx:
            assert tx.execute("PRAGMA synchronous").fetchone()[0] == 1
    finally:
        store.close()
    with pytest.raises(ConfigurationError):
        SQLiteStore(str(db_path), synchronous="SOMETIMES")


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("app.db", "app.db"),
        ("sqlite:app.db", "app.db"),
        ("sqlite:///tmp/app.db", "/tmp/app.db"),
        ("sqlite:////tmp/app.db", "/tmp/app.db"),
        ("sqlite://relative.db", "relative.db"),
    ],
)
def test_sqlite_urls(url: str, path: str) -> None:
    assert path_from_url(url) == path


def test_open_store_by_url(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'by-url.db'}")
    try:
        assert store.dialect == "sqlite"
    finally:
        store.close()
    assert (tmp_path / "by-url.db").exists()
    with pytest.raises(ConfigurationError, match="ONCEWIRE_DB"):
        open_store("")


OPEN_AT_ONCE = """
import pathlib, sys, time
from oncewire import Ledger
db, go, name = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
while not go.exists():
    time.sleep(0.001)
with Ledger(db) as ledger:
    ledger.accept(name, "send", {"from": name})
    print(ledger.store.schema_version())
"""


def test_processes_opening_one_fresh_file_at_once_all_succeed(
    db_path: Path, tmp_path: Path, python_child: Child, peek: Peek
) -> None:
    go = tmp_path / "go"
    children = [python_child(OPEN_AT_ONCE, str(db_path), str(go), f"proc-{n}") for n in range(4)]
    go.touch()  # release them together onto a file that does not exist yet
    outputs = [child.communicate(timeout=60) for child in children]
    latest = migrations()[-1][0]
    for child, (out, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err
        assert out.strip() == str(latest)
    assert peek(db_path, "SELECT key FROM oncewire_effects ORDER BY key") == [
        (f"proc-{n}",) for n in range(4)
    ]
    versions = peek(db_path, "SELECT version FROM oncewire_schema ORDER BY version")
    assert versions == [(number,) for number, _, _ in migrations()]  # migrated exactly once


@pytest.mark.parametrize("create", [True, False])
def test_a_file_that_is_not_a_database_is_a_clear_error_and_stays_untouched(
    tmp_path: Path, create: bool
) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(NOT_A_DATABASE)
    with pytest.raises(StorageError, match="not a SQLite database"):
        SQLiteStore(str(path), create=create)
    assert path.read_bytes() == NOT_A_DATABASE
    assert _files(tmp_path) == ["notes.txt"]


def test_a_directory_is_not_a_database(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="cannot open"):
        SQLiteStore(str(tmp_path))


def test_create_false_on_a_missing_file_fails_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    with pytest.raises(StorageError, match=f"no database at {missing}"):
        Ledger(str(missing), create=False)
    assert _files(tmp_path) == []


def test_create_false_on_a_foreign_sqlite_database_adds_nothing(tmp_path: Path, peek: Peek) -> None:
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(str(foreign))
    try:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
        conn.commit()
    finally:
        conn.close()
    with pytest.raises(SchemaError, match="not an oncewire store"):
        SQLiteStore(str(foreign), create=False)
    assert peek(foreign, "SELECT name FROM sqlite_master") == [("customers",)]


def test_an_existing_app_database_gains_the_outbox_when_create_is_true(
    tmp_path: Path, peek: Peek
) -> None:
    app = tmp_path / "app.db"
    conn = sqlite3.connect(str(app))
    try:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO customers VALUES (1)")
        conn.commit()
    finally:
        conn.close()
    with Ledger(str(app)) as ledger:
        ledger.accept("k", "send", {})
    assert peek(app, "SELECT COUNT(*) FROM customers") == [(1,)]
    assert peek(app, "SELECT key FROM oncewire_effects") == [("k",)]


def test_a_writer_that_holds_the_lock_too_long_is_store_busy(db_path: Path, peek: Peek) -> None:
    SQLiteStore(str(db_path)).close()
    blocker = sqlite3.connect(str(db_path), isolation_level=None)
    store = SQLiteStore(str(db_path), busy_timeout_ms=50)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreBusy, match="locked by another writer"):
            Ledger(store).accept("k", "send", {})
        blocker.execute("ROLLBACK")
        Ledger(store).accept("k", "send", {})  # and it recovers once the lock is gone
    finally:
        store.close()
        blocker.close()
    assert peek(db_path, "SELECT key FROM oncewire_effects") == [("k",)]


def test_close_really_closes_and_can_be_repeated(db_path: Path) -> None:
    store = SQLiteStore(str(db_path))
    Ledger(store).accept("k", "send", {})
    assert (db_path.parent / f"{db_path.name}-wal").exists()
    store.close()
    # The last connection to a WAL database checkpoints and removes the log when it closes.
    assert not (db_path.parent / f"{db_path.name}-wal").exists()
    store.close()
