"""Four dispatcher processes on one store: random SIGKILLs, a SIGSTOP past the lease, and on
PostgreSQL every worker connection terminated mid-run. Invariants are re-read from the stores."""

from __future__ import annotations

import sqlite3
from collections import Counter
from contextlib import closing
from pathlib import Path

import pytest

from oncewire.lab.fixtures import Backend
from oncewire.lab.runner import run_lab
from tests.support.pg import server_url

pytestmark = pytest.mark.crash


def _check(evidence: dict, backend: str) -> dict:
    scenario = evidence["suites"]["workers"]["scenarios"][f"four_workers[{backend}]"]
    assert evidence["passed"], scenario["failures"]
    summary = scenario["summary"]
    assert summary["kills"] >= 1
    assert summary["stale_outcomes_refused"] >= 1
    assert summary["duplicates"] == 0
    assert summary["done"] == summary["effects"] == summary["tickets"]
    return summary


def test_four_workers_on_sqlite(tmp_path: Path) -> None:
    evidence = run_lab(
        ["workers"], directory=tmp_path / "lab", seed=5, options={"operations": 300, "kills": 2}
    )
    _check(evidence, "sqlite")
    folder = tmp_path / "lab" / "workers" / "sqlite"
    with closing(sqlite3.connect(folder / "downstream.sqlite")) as db:
        per_key = Counter(k for (k,) in db.execute("SELECT operation_id FROM tickets"))
    with closing(sqlite3.connect(folder / "caller.sqlite")) as db:
        states = Counter(s for (s,) in db.execute("SELECT state FROM oncewire_effects"))
    assert states == Counter({"done": 300})
    assert set(per_key.values()) == {1} and len(per_key) == 300


def test_four_workers_on_postgresql(tmp_path: Path) -> None:
    url = server_url()
    evidence = run_lab(
        ["workers"],
        directory=tmp_path / "lab",
        seed=5,
        options={"operations": 300, "kills": 2},
        backend=Backend("postgresql", url, run_id=f"test{tmp_path.name[-6:]}"),
    )
    summary = _check(evidence, "postgresql")
    assert summary["connections_terminated"] >= 1
    schemas = (tmp_path / "lab" / "workers" / "postgresql" / "schemas.txt").read_text().split()
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True) as conn:
            states = Counter(
                s for (s,) in conn.execute(f"SELECT state FROM {schemas[0]}.oncewire_effects")
            )
            per_key = Counter(
                k for (k,) in conn.execute(f"SELECT operation_id FROM {schemas[1]}.tickets")
            )
        assert states == Counter({"done": 300})
        assert set(per_key.values()) == {1} and len(per_key) == 300
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            for schema in schemas:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
