"""SQLite schema files: the numbered migrations build exactly the fresh-install schema, and a
store refuses a schema from the future."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from oncewire.errors import SchemaError
from oncewire.storage.sqlite import SQLiteStore
from oncewire.storage.sqlite.driver import (
    SCHEMA_TABLE,
    fresh_schema,
    migrate,
    migrations,
    split_statements,
)

Connect = Callable[[str], sqlite3.Connection]


@pytest.fixture
def connect(tmp_path: Path) -> Iterator[Connect]:
    opened: list[sqlite3.Connection] = []

    def open_db(name: str) -> sqlite3.Connection:
        conn = sqlite3.connect(str(tmp_path / name), isolation_level=None)
        opened.append(conn)
        return conn

    yield open_db
    for conn in opened:
        conn.close()


def _normalise(sql: str | None) -> str | None:
    if sql is None:
        return None  # automatic indexes have no SQL
    without_comments = re.sub(r"--[^\n]*", "", sql)
    return re.sub(r"\s+", " ", without_comments).replace("( ", "(").replace(" )", ")").strip()


def _schema(conn: sqlite3.Connection) -> list[tuple[str, str, str, str | None]]:
    rows = conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
        "ORDER BY type, name"
    ).fetchall()
    return [(t, n, tbl, _normalise(sql)) for t, n, tbl, sql in rows]


def _versions(conn: sqlite3.Connection) -> list[tuple[int, str]]:
    return conn.execute("SELECT version, name FROM oncewire_schema ORDER BY version").fetchall()


def test_migration_files_are_numbered_forward_and_complete() -> None:
    found = migrations()
    numbers = [number for number, _, _ in found]
    assert numbers, "no migrations shipped"
    assert numbers == sorted(set(numbers))
    for number, name, sql in found:
        assert re.fullmatch(r"\d{4}_[a-z0-9_]+\.sql", name), name
        assert int(name[:4]) == number
        assert split_statements(sql), f"{name} has no statements"


def test_the_migrations_build_the_fresh_schema(connect: Connect) -> None:
    fresh = connect("fresh.db")
    stepped = connect("stepped.db")
    latest = migrations()[-1][0]
    assert migrate(fresh) == latest  # schema.sql in one go
    assert migrate(stepped, use_fresh_schema=False) == latest  # every numbered file in order
    fresh_schema_rows = _schema(fresh)
    assert [name for _, name, _, _ in fresh_schema_rows if name.startswith("oncewire_effects")]
    assert _schema(stepped) == fresh_schema_rows
    expected_versions = [(number, name) for number, name, _ in migrations()]
    assert _versions(fresh) == _versions(stepped) == expected_versions


@pytest.mark.parametrize("applied", range(len(migrations())))
def test_an_older_database_upgrades_to_the_fresh_schema(connect: Connect, applied: int) -> None:
    """A database left at any earlier version ends where a fresh install starts."""
    old = connect("old.db")
    old.execute(SCHEMA_TABLE)
    for number, name, sql in migrations()[:applied]:
        for statement in split_statements(sql):
            old.execute(statement)
        old.execute(
            "INSERT INTO oncewire_schema (version, name, applied_at) VALUES (?, ?, 0)",
            (number, name),
        )
    migrate(old, use_fresh_schema=False)
    reference = connect("reference.db")
    migrate(reference)
    assert _schema(old) == _schema(reference)
    assert _versions(old) == _versions(reference)


def test_migrating_twice_changes_nothing(connect: Connect) -> None:
    conn = connect("twice.db")
    migrate(conn)
    before = (_schema(conn), conn.execute("SELECT * FROM oncewire_schema").fetchall())
    migrate(conn)
    assert (_schema(conn), conn.execute("SELECT * FROM oncewire_schema").fetchall()) == before


def test_the_fresh_schema_file_splits_into_complete_statements() -> None:
    statements = split_statements(fresh_schema())
    assert all(sqlite3.complete_statement(s) for s in statements)
    assert any("CREATE TABLE oncewire_effects" in s for s in statements)


def test_an_incomplete_statement_is_refused() -> None:
    with pytest.raises(SchemaError, match="incomplete statement"):
        split_statements("CREATE TABLE a (x INTEGER);\nCREATE TABLE b (y")
    assert split_statements("CREATE TABLE a (x);\n-- a trailing comment\n") == [
        "CREATE TABLE a (x);"
    ]


def test_a_store_refuses_a_schema_newer_than_it_knows(db_path: Path) -> None:
    SQLiteStore(str(db_path)).close()
    future = migrations()[-1][0] + 1
    conn = sqlite3.connect(str(db_path), isolation_level=None)
    try:
        conn.execute(
            "INSERT INTO oncewire_schema (version, name, applied_at) VALUES (?, 'future', 0)",
            (future,),
        )
    finally:
        conn.close()
    with pytest.raises(SchemaError, match=rf"schema version {future}.*upgrade oncewire"):
        SQLiteStore(str(db_path))
    conn = sqlite3.connect(str(db_path))
    try:  # refusing did not touch it
        assert conn.execute("SELECT MAX(version) FROM oncewire_schema").fetchone() == (future,)
    finally:
        conn.close()
