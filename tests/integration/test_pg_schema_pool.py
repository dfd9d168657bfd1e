"""The pool of migrated PostgreSQL schemas the tests share (tests/support/pg.py): a schema goes
back to the pool empty, its ids starting at 1 again, and a schema whose structure a test changed
is dropped, never handed to the next test."""

from __future__ import annotations

import psycopg
import pytest

from oncewire import Ledger
from oncewire.testing import ManualClock
from tests.support import pg


def _schema_of(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        return str(conn.execute("SELECT current_schema()").fetchone()[0])  # type: ignore[index]


def _exists(base: str, schema: str) -> bool:
    with psycopg.connect(base, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        return found.fetchone() is not None


def test_a_used_schema_comes_back_empty_with_its_ids_from_one() -> None:
    base = pg.server_url()
    with pg.migrated_schema(base, "pool") as url:
        first = _schema_of(url)
        with Ledger(url, clock=ManualClock()) as ledger:
            ledger.accept("one", "noop", {})
            ledger.accept("two", "noop", {})
    with pg.migrated_schema(base, "pool") as url:
        assert _schema_of(url) == first  # reused, not built again
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT COUNT(*) FROM oncewire_effects").fetchone() == (0,)
        with Ledger(url, clock=ManualClock()) as ledger:
            ledger.accept("three", "noop", {})
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT id, key FROM oncewire_effects").fetchall() == [(1, "three")]


@pytest.mark.parametrize(
    "change",
    [
        "CREATE INDEX extra_index ON oncewire_effects (kind)",
        "ALTER TABLE oncewire_effects ADD COLUMN extra TEXT",
        "ALTER TABLE oncewire_run_events DISABLE TRIGGER oncewire_run_events_no_truncate",
        "CREATE TABLE app_rows (id INTEGER)",
        "DELETE FROM oncewire_schema WHERE version = 2",
    ],
    ids=["index", "column", "trigger", "table", "migration-row"],
)
def test_a_schema_a_test_altered_is_dropped_not_reused(change: str) -> None:
    base = pg.server_url()
    with pg.migrated_schema(base, "pool") as url:
        altered = _schema_of(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(change)  # type: ignore[arg-type]
    assert not _exists(base, altered)
    with pg.migrated_schema(base, "pool") as url:
        assert _schema_of(url) != altered
