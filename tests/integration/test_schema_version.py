"""A schema version names the same schema on SQLite and on PostgreSQL.

The migrations were numbered per dialect: PostgreSQL's 0010 changed the run tables' collation
(SQLite's TEXT already compared bytewise and needed nothing), so SQLite's history indexes were its
0010 and PostgreSQL's 0011, and a store with every migration reported schema version 10 on one
backend and 11 on the other (``oncewire doctor``, ``store.health()``, ``oncewire gateway
check``). Now each number is one change on both backends (SQLite's 0010 records that it needs
nothing), every backend reports the same version for the same schema, and a SQLite store that an
earlier oncewire took to its old version 10 upgrades to the same version and schema as a fresh
one. Versions are read from ``oncewire_schema`` directly, and doctor runs as a real process.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg

from oncewire.storage import open_store
from oncewire.storage.postgres import driver as pg
from oncewire.storage.sqlite import driver as lite
from tests.support.pg import fresh_schema, server_url


def _schema(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    rows = conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
    ).fetchall()
    # As the migration test compares them: without comments and layout.
    return sorted(
        (kind, name, re.sub(r"\s+", " ", re.sub(r"--[^\n]*", "", sql or "")))
        for kind, name, _, sql in rows
    )


def test_each_migration_number_is_the_same_change_on_both_backends() -> None:
    sqlite_names = [name for _, name, _ in lite.migrations()]
    postgres_names = [name for _, name, _ in pg.migrations()]
    assert sqlite_names == postgres_names


def test_both_backends_report_the_same_schema_version(tmp_path: Path) -> None:
    sqlite_url = str(tmp_path / "app.db")
    with fresh_schema(server_url(), "version") as pg_url:
        reported = {}
        for url in (sqlite_url, pg_url):
            store = open_store(url)
            try:
                reported[store.dialect] = (store.schema_version(), store.health()["schema_version"])
            finally:
                store.close()
            doctor = subprocess.run(
                [sys.executable, "-m", "oncewire", "doctor", "--db", url, "--json"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            (schema,) = [c for c in json.loads(doctor.stdout) if c["name"] == "schema"]
            assert schema["status"] == "ok", schema
            (shown,) = re.findall(r"^schema version (\d+)$", schema["detail"])
            reported[f"{store.dialect} doctor"] = (int(shown), int(shown))
        with psycopg.connect(pg_url, autocommit=True) as conn:
            pg_recorded = conn.execute("SELECT MAX(version) FROM oncewire_schema").fetchone()
    with sqlite3.connect(sqlite_url) as conn:
        sqlite_recorded = conn.execute("SELECT MAX(version) FROM oncewire_schema").fetchone()
    assert sqlite_recorded == pg_recorded
    assert set(reported.values()) == {(pg_recorded[0], pg_recorded[0])}, reported


def test_a_sqlite_store_at_the_old_version_10_upgrades_to_the_fresh_schema(tmp_path: Path) -> None:
    """What an earlier oncewire left: 0001-0009, then the history indexes as version 10."""
    old = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    old.execute(lite.SCHEMA_TABLE)
    for number, name, sql in lite.migrations():
        if number <= 9:
            for statement in lite.split_statements(sql):
                old.execute(statement)
            old.execute("INSERT INTO oncewire_schema VALUES (?, ?, 0)", (number, name))
    history_indexes = next(sql for _, name, sql in lite.migrations() if "history_indexes" in name)
    for statement in lite.split_statements(history_indexes):
        old.execute(statement)
    old.execute("INSERT INTO oncewire_schema VALUES (10, '0010_history_indexes.sql', 0)")
    store = open_store(str(tmp_path / "old.db"))
    try:
        upgraded = store.schema_version()
    finally:
        store.close()
    fresh = open_store(str(tmp_path / "fresh.db"))
    try:
        assert upgraded == fresh.schema_version() == lite.migrations()[-1][0]
    finally:
        fresh.close()
    reference = sqlite3.connect(tmp_path / "fresh.db")
    try:
        assert _schema(old) == _schema(reference)
        versions = "SELECT version FROM oncewire_schema ORDER BY version"
        assert old.execute(versions).fetchall() == reference.execute(versions).fetchall()
    finally:
        old.close()
        reference.close()
