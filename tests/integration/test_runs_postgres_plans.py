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
    """``PREPARE name`` of a rendered statement whose parameters are texts or lists of texts
    (psycopg's ``%s`` become ``$1, $2, ...``), as psycopg prepares it."""
    assert all(isinstance(value, str | list) for value in params)
    numbered = iter(range(1, 100))
    body = re.sub(r"%s", lambda _: f"${next(numbered)}", text)
    types = ", ".join("text[]" if isinstance(value, list) else "text" for value in params)
    conn.execute(f"PREPARE {name} ({types}) AS {body}")  # type: ignore[arg-type]


def _plan_after_growth(url: str, query: str, params: dict[str, Any], grow: Any) -> dict[str, Any]:
    """The plan PostgreSQL executes for ``query`` after ``grow(ledger)``, when the generic plan
    was made before it, on a run with one event and tables never analyzed."""
    with Ledger(url, clock=ManualClock()) as ledger:
        ledger.runs.start("run-1", key="start", scope="scope", owner="owner", lease_seconds=3600)
        text, bound = getattr(ledger.store.db.queries, query).render(params)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET plan_cache_mode = force_generic_plan")
            _prepared(conn, "q", text, list(bound))
            execute = sql.SQL("EXECUTE q ({})").format(sql.SQL(", ").join(map(sql.Literal, bound)))
            with conn.transaction():
                conn.execute(execute)  # the generic plan is made now, and kept
            grow(ledger)
            with conn.transaction():
                row = conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + execute).fetchone()
    assert row is not None
    document = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return dict(document[0]["Plan"])


def _read_only_what_they_return(plan: dict[str, Any], table: str, scans: int) -> None:
    found = list(_scans(plan, table))
    assert len(found) == scans, json.dumps(plan, indent=1)
    for scan in found:
        # At most one row each (the head; none for a key or an id not used), none read and
        # thrown away.
        assert scan["Actual Rows"] <= 1, json.dumps(scan, indent=1)
        assert scan.get("Rows Removed by Filter", 0) == 0, json.dumps(scan, indent=1)
        assert "Index" in scan["Node Type"], json.dumps(scan, indent=1)


@pytest.mark.parametrize("query", ["command_context_locked", "command_context"])
def test_a_plan_cached_on_a_new_table_reads_one_head_event_of_a_long_run(
    url: str, query: str
) -> None:
    def candidates(ledger: Ledger) -> None:
        for n in range(EVENTS):
            ledger.runs.review.record_candidate(
                "run-1", key=f"c{n}", candidate_id=f"candidate-{n}", **CANDIDATE
            )

    plan = _plan_after_growth(url, query, {"run_id": "run-1", "key": "none"}, candidates)
    _read_only_what_they_return(plan, "oncewire_run_events", 2)  # the head and the key's event


def test_a_plan_cached_on_a_new_table_looks_one_action_id_up_in_a_long_run(url: str) -> None:
    """A proposal checks that its action id is not used yet: one id, looked up, not the run's
    actions filtered (``{in}`` of one value renders ``= %s``; ``= ANY`` read all 600)."""

    def proposals(ledger: Ledger) -> None:
        for n in range(EVENTS):
            ledger.runs.review.propose_action(
                "run-1",
                key=f"p{n}",
                action_id=f"a{n}",
                kind="write_file",
                arguments={"path": "notes.txt"},
                side_effect_class="workspace_write",
            )

    params = {"run_id": "run-1", "phases": [], "findings": [], "actions": ["a-new"]}
    plan = _plan_after_growth(url, "used_ids", params, proposals)
    _read_only_what_they_return(plan, "oncewire_run_actions", 1)


def test_every_run_id_compares_bytewise_in_a_new_and_in_a_migrated_store(url: str) -> None:
    def collations(conn: psycopg.Connection[Any]) -> dict[str, str | None]:
        rows = conn.execute(
            "SELECT table_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND column_name = 'run_id' "
            # The run ledger's tables; a LangGraph checkpoint's run_id is LangGraph's own.
            "AND table_name LIKE 'oncewire\\_run%'"
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
