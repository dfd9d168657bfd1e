"""The real ``oncewire`` command pointed at a database that is not (yet) an oncewire store.

A database that holds another application's tables gains oncewire's only when the operator
says so (``--adopt``); a file that is not SQLite at all is refused; a command that fails changes
nothing (no journal switched to WAL, no oncewire table). An empty file and a new path become a
store as they always did.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from tests.support.pg import fresh_schema, server_url
from tests.support.store_files import cli, digest, journal_mode, one_error_line, tables

APP = """
def note(attempt):
    return {"noted": attempt.key}
SINKS = {"note": note}
"""


@pytest.fixture
def app_db(tmp_path: Path) -> Path:
    """Another application's SQLite file: its own tables and rows, the default journal."""
    path = tmp_path / "app.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO orders VALUES (1, 9.5)")
        conn.commit()
    return path


def test_accept_refuses_a_file_holding_other_tables(app_db: Path) -> None:
    before = digest(app_db)
    line = one_error_line(cli("effects", "accept", "k-1", "email", "{}", "--db", app_db))
    assert str(app_db) in line and "customers, orders" in line and "--adopt" in line, line
    assert digest(app_db) == before
    assert journal_mode(app_db) == "delete"
    assert tables(app_db) == ["customers", "orders"]


def test_adopt_adds_the_outbox_beside_the_apps_tables(app_db: Path) -> None:
    result = cli("effects", "accept", "k-1", "email", "{}", "--db", app_db, "--adopt")
    assert result.returncode == 0, result.stderr
    with closing(sqlite3.connect(app_db)) as conn:
        assert conn.execute("SELECT id, total FROM orders").fetchall() == [(1, 9.5)]
        assert conn.execute("SELECT key FROM oncewire_effects").fetchall() == [("k-1",)]
    assert journal_mode(app_db) == "wal"
    # Adopted once, it is an oncewire store: the flag is not needed again.
    again = cli("effects", "accept", "k-2", "email", "{}", "--db", app_db)
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize(
    "arguments",
    [("", "email", "{}"), ("k-1", "", "{}"), ("k-1", "email", '{"a": 1, "a": 2}')],
    ids=["empty-key", "empty-kind", "duplicate-json-key"],
)
def test_a_failed_accept_with_adopt_changes_nothing(
    app_db: Path, arguments: tuple[str, ...]
) -> None:
    before = digest(app_db)
    one_error_line(cli("effects", "accept", *arguments, "--db", app_db, "--adopt"))
    assert digest(app_db) == before
    assert journal_mode(app_db) == "delete"
    assert tables(app_db) == ["customers", "orders"]


def test_a_failed_accept_on_a_new_path_creates_no_file(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    one_error_line(cli("effects", "accept", "", "email", "{}", "--db", path))
    assert not path.exists()


def test_dispatch_refuses_a_file_holding_other_tables(app_db: Path, tmp_path: Path) -> None:
    (tmp_path / "myapp.py").write_text(APP)
    before = digest(app_db)
    env = {"PYTHONPATH": str(tmp_path)}
    refused = cli("dispatch", "--db", app_db, "--app", "myapp:SINKS", "--until-idle", env=env)
    assert refused.returncode == 1
    assert "customers, orders" in refused.stderr and "--adopt" in refused.stderr
    assert digest(app_db) == before
    assert journal_mode(app_db) == "delete"
    adopted = cli(
        "dispatch", "--db", app_db, "--app", "myapp:SINKS", "--until-idle", "--adopt", env=env
    )
    assert adopted.returncode == 0, adopted.stderr
    assert "oncewire_effects" in tables(app_db)


@pytest.mark.parametrize(
    "content",
    [
        b"these are my notes, not a database\n" * 100,
        b"x",  # one byte: SQLite itself would take it for an empty file and write over it
        b"\x00" * 8192,
        b"\x00" * 40,
        b"SQLite format 3\x00" + b"\xff" * 30,  # SQLite's header, cut short
    ],
    ids=["text", "one-byte", "zeros", "few-zeros", "truncated-header"],
)
def test_a_file_that_is_not_sqlite_is_refused_unchanged(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    for command in (
        ("effects", "accept", "k-1", "email", "{}"),
        ("effects", "accept", "k-1", "email", "{}", "--adopt"),
        ("effects", "list"),
        ("effects", "list", "--read-only"),
    ):
        line = one_error_line(cli(*command, "--db", path))
        assert str(path) in line, line
        assert path.read_bytes() == content, command
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


@pytest.mark.parametrize("how", ["empty-file", "new-path"])
def test_an_empty_file_or_a_new_path_becomes_a_store(tmp_path: Path, how: str) -> None:
    path = tmp_path / "fresh.db"
    if how == "empty-file":
        path.write_bytes(b"")
    result = cli("effects", "accept", "k-1", "email", "{}", "--db", path, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["key"] == "k-1"
    assert journal_mode(path) == "wal"
    assert "oncewire_effects" in tables(path)


# -- PostgreSQL: a schema that holds the application's tables ---------------------------------


@pytest.fixture
def app_schema() -> Iterator[str]:
    import psycopg

    with fresh_schema(server_url(), "foreign") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
            conn.execute("INSERT INTO orders VALUES (1, 9.5)")
        yield url


def _pg_tables(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1"
        ).fetchall()
    return [str(name) for (name,) in rows]


def test_postgresql_accept_refuses_a_schema_holding_other_tables(app_schema: str) -> None:
    line = one_error_line(cli("effects", "accept", "k-1", "email", "{}", "--db", app_schema))
    assert "orders" in line and "--adopt" in line, line
    assert _pg_tables(app_schema) == ["orders"]
    adopted = cli("effects", "accept", "k-1", "email", "{}", "--db", app_schema, "--adopt")
    assert adopted.returncode == 0, adopted.stderr
    assert {"orders", "oncewire_effects", "oncewire_schema"} <= set(_pg_tables(app_schema))
