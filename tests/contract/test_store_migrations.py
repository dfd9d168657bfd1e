"""One migration rule on every backend: opening a store applies every migration not recorded.

A database that took 0001 and 0003 (0003 was released before 0002) is completed when a store
opens it: 0002 and everything after are applied and recorded. Checked in the database itself,
on both backends, through the one runner (:mod:`oncewire.storage.migrate`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from oncewire.core.errors import ConfigurationError
from oncewire.storage import open_store
from oncewire.storage.postgres import driver as pg_driver
from oncewire.storage.sqlite import driver as sqlite_driver
from tests.support.pg import fresh_schema, server_url

# What 0002 and 0005 created, read from the catalog rather than from oncewire_schema.
_FACTS = (
    "SELECT COUNT(*) FROM oncewire_runs",
    "SELECT COUNT(key_id) FROM oncewire_runs",
    "SELECT COUNT(not_sent) FROM oncewire_effects",
)


@contextmanager
def _gap_database(backend: str, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A database with migrations 0001 and 0003 only; yields its URL and a raw connection."""
    if backend == "sqlite":
        url = str(tmp_path / "gap.db")
        conn: Any = sqlite3.connect(url, isolation_level=None)
        conn.execute(sqlite_driver.SCHEMA_TABLE)
        for number, name, sql in sqlite_driver.migrations():
            if number in (1, 3):
                for statement in sqlite_driver.split_statements(sql):
                    conn.execute(statement)
                conn.execute("INSERT INTO oncewire_schema VALUES (?, ?, 0)", (number, name))
        try:
            yield url, conn
        finally:
            conn.close()
        return
    psycopg = pytest.importorskip("psycopg")
    with fresh_schema(server_url(), "gap") as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute(pg_driver.DIALECT.schema_table)
        for number, name, sql in pg_driver.migrations():
            if number in (1, 3):
                conn.execute(sql)
                conn.execute("INSERT INTO oncewire_schema VALUES (%s, %s, 0)", (number, name))
        yield url, conn


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_opening_a_store_with_a_gap_applies_every_missing_migration(
    backend: str, tmp_path: Path
) -> None:
    available = (sqlite_driver if backend == "sqlite" else pg_driver).migrations()
    with _gap_database(backend, tmp_path) as (url, conn):
        versions = "SELECT version FROM oncewire_schema ORDER BY 1"
        assert [v for (v,) in conn.execute(versions).fetchall()] == [1, 3]
        store = open_store(url)
        try:
            assert store.schema_version() == available[-1][0]
        finally:
            store.close()
        assert [v for (v,) in conn.execute(versions).fetchall()] == [n for n, _, _ in available]
        for fact in _FACTS:
            assert conn.execute(fact).fetchone() == (0,)


@pytest.mark.parametrize("url", ["mysql://x/y", "mongodb://db/oncewire", "http://example.com/db"])
def test_an_unknown_url_scheme_is_refused(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match="scheme"):
        open_store(url)
    assert list(tmp_path.iterdir()) == []  # no SQLite file named after the URL
