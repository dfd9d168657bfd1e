"""How PostgreSQL runs a command's reads on a long run, checked in the plans it executes.

psycopg prepares a statement from its fifth run, and PostgreSQL then keeps one generic plan for
it, made with the statistics of that moment. A plan made while the run tables were small and
not yet analyzed must stay good when a run has thousands of events: each command reads its
run's head event through the (run_id, seq) index, one row, never the run's whole history.
Before, the head event was joined on ``seq = head_seq`` and such a plan read every event of
the run and filtered them, so commands slowed down with the run's length (until autovacuum
analyzed the table). And every ``run_id`` compares bytewise (``COLLATE "C"``, as
``oncewire_runs.run_id``), so a condition carried over from the run row can use the other
tables' indexes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from oncewire import Ledger
from oncewire.storage.postgres.driver import migrate
from oncewire.testing import ManualClock
from tests.support.pg import fresh_schema, server_url

CANDIDATE: dict[str, Any] = {
    "snapshot_sha256": "a" * 64,
    "evidence_sha256": "e" * 64,
    "artifact_set_sha256": "b" * 64,
    "artifact_ids": ["artifact-1"],
    "version_ids": ["version-1"],
}
EVENTS = 600


@pytest.fixture
def url() -> Iterator[str]:
    with fresh_schema(server_url(), "runs_plan") as schema_url:
        yield schema_url


def _scans(plan: dict[str, Any], table: str) -> Iterator[dict[str, Any]]:
    if plan.get("Relation Name") == table:
        yield plan
    for child in plan.get("Plans", []):
        yield from _scans(child, table)


def _prepared(conn: psycopg.Connection[Any], name: str, text: str, params: list[Any]) -> None:
    """``PREPARE name`` of a rendered statement whose parameters are texts (psycopg's ``%s``
    become ``$1, $2, ...``), as psycopg prepares it."""
    assert all(isinstance(value, str) for value in params)
    numbered = iter(range(1, 100))
    body = re.sub(r"%s", lambda _: f"${next(numbered)}", text)
    types = ", ".join(["text"] * len(params))
    conn.execute(f"PREPARE {name} ({types}) AS {body}")  # type: ignore[arg-type]


@pytest.mark.parametrize("query", ["command_context_locked", "command_context"])
def test_a_plan_cached_on_a_new_table_reads_one_head_event_of_a_long_run(
    url: str, query: str
) -> None:
    with Ledger(url, clock=ManualClock()) as ledger:
        runs = ledger.runs
        runs.start("run-1", key="start", scope="scope", owner="owner", lease_seconds=3600)
        text, params = getattr(ledger.store.db.queries, query).render(
            {"run_id": "run-1", "key": "none"}
        )
        with psycopg.connect(url, autocommit=True) as conn:
            # The generic plan, made now, while the run has one event and nothing is analyzed.
            conn.execute("SET plan_cache_mode = force_generic_plan")
            _prepared(conn, "ctx", text, list(params))
            execute = sql.SQL("EXECUTE ctx ({})").format(
                sql.SQL(", ").join(map(sql.Literal, params))
            )
            with conn.transaction():
                conn.execute(execute)
            for n in range(EVENTS):
                runs.review.record_candidate(
                    "run-1", key=f"c{n}", candidate_id=f"candidate-{n}", **CANDIDATE
                )
            with conn.transaction():
                row = conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + execute).fetchone()
    assert row is not None
    document = row[0] if isinstance(row[0], list) else json.loads(row[0])
    plan = document[0]["Plan"]
    scans = list(_scans(plan, "oncewire_run_events"))
    assert len(scans) == 2, json.dumps(plan, indent=1)  # the head event and the key's event
    for scan in scans:
        # One row read for the head (none for a key not used), none read and thrown away.
        assert scan["Actual Rows"] <= 1, json.dumps(scan, indent=1)
        assert scan.get("Rows Removed by Filter", 0) == 0, json.dumps(scan, indent=1)
        assert "Index" in scan["Node Type"], json.dumps(scan, indent=1)


def test_every_run_id_compares_bytewise_in_a_new_and_in_a_migrated_store(url: str) -> None:
    def collations(conn: psycopg.Connection[Any]) -> dict[str, str | None]:
        rows = conn.execute(
            "SELECT table_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND column_name = 'run_id'"
        ).fetchall()
        return {table: collation for table, collation in rows}

    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)  # schema.sql in one go
        fresh = collations(conn)
    with (
        fresh_schema(server_url(), "runs_plan_migrated") as migrated_url,
        psycopg.connect(migrated_url, autocommit=True) as conn,
    ):
        migrate(conn, use_fresh_schema=False)  # every numbered migration in turn
        migrated = collations(conn)
    assert len(fresh) >= 8
    assert fresh == migrated
    assert set(fresh.values()) == {"C"}, fresh
