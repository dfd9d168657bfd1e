"""The benchmark command runs end to end and reports every figure with a ratio.

Wall-clock figures are never asserted against thresholds here: shared machines vary by tens of
percent from run to run. This only checks that each figure was measured and compared.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.pg import server_url

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks" / "run.py"

FIGURES = {
    "floor",
    "floor_batched",
    "accept",
    "accept_sql",
    "e2e_single",
    "e2e_batched",
    "e2e_single_receipts",
    "e2e_batched_receipts",
    "huey",
    "start_first_process",
    "recovery_first_process",
    "start_all_process",
    "recovery_all_process",
    "start_first_run",
    "recovery_first_run",
    "start_all_run",
    "recovery_all_run",
}
OPTIONAL = {"huey"}  # a reference that is measured only where huey is installed
TARGETED = {
    "accept",
    "e2e_single",
    "e2e_batched",
    "e2e_single_receipts",
    "e2e_batched_receipts",
    "recovery_first_process",
    "recovery_first_run",
}

PG_FIGURES = {
    "floor",
    "floor_batched",
    "accept",
    "pgqueuer_1",
    "pgqueuer_2",
    "pgqueuer_2_batch",
    "e2e_workers_1",
    "e2e_workers_2",
    "e2e_workers_4",
    "duplicates_pgqueuer",
    "redeliveries_oncewire",
    "duplicates_oncewire",
    "failover_none",
    "failover_same_host",
    "failover_lease_expiry",
    "release_same_host",
    "release_lease_expiry",
}
# References measured only where pgqueuer (and asyncpg) are installed.
PG_OPTIONAL = {"pgqueuer_1", "pgqueuer_2", "pgqueuer_2_batch", "duplicates_pgqueuer"}
PG_COUNTS = {"duplicates_pgqueuer", "redeliveries_oncewire", "duplicates_oncewire"}
PG_TARGETED = {"e2e_workers_2", "duplicates_oncewire"}

pytestmark = pytest.mark.crash  # the recovery figures SIGKILL a child process


def test_quick_run_reports_every_figure_with_a_ratio(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    command = [sys.executable, str(RUN), "--quick", "--repeat", "1", "--json", str(out)]
    proc = subprocess.run(
        [*command, "--dir", str(tmp_path / "files")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "[1/1]" in proc.stderr  # progress went to stderr

    doc = json.loads(out.read_text(encoding="utf-8"))
    env = doc["environment"]
    for key in ("python", "sqlite", "platform", "cpu_count", "date"):
        assert env[key], key
    params = doc["parameters"]
    assert params["repeat"] == 1 and params["quick"] is True
    assert params["pragmas"] == {"journal_mode": "wal", "synchronous": 2, "busy_timeout": 10000}
    for engine, seen in params["pragmas_seen"].items():
        assert seen == params["pragmas"], engine

    figures = doc["figures"]
    assert set(figures) == FIGURES
    for name, figure in figures.items():
        assert figure["unit"], name
        assert figure["baseline"] in figures, name
        assert name in proc.stdout, name  # the table lists it
        if figure["skipped"]:
            assert name in OPTIONAL, f"{name} was skipped: {figure.get('note')}"
            assert figure["note"], name
            continue
        assert figure["value"] > 0, name
        assert figure["ratio"] > 0, name
        assert figure["runs"], name
        if figure["baseline"] == "floor" and name != "floor":
            bracket = figure["rounds"][0]
            assert bracket["floor_before"] > 0 and bracket["floor_after"] > 0, name
        if name in TARGETED:
            assert figure["target"], name
            assert figure["met"] in (True, False), name
        else:
            assert figure["met"] is None, name

    # The recovery really recovered: every effect claimed by the killed child came back as a
    # redelivery, released because its owner was seen dead (not because a lease ran out).
    for name in ("recovery_first_process", "recovery_first_run"):
        details = figures[name]["rounds"][0]
        assert details["returncode"] == -9, name
        assert details["released"] == details["effects"] == params["recovery"], name
    assert not any((tmp_path / "files").iterdir())  # the database files were cleaned up


def _bench_schemas(url: str) -> set[str]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'oncewire_bench_%'"
        ).fetchall()
    return {str(row[0]) for row in rows}


def test_quick_postgresql_run_reports_every_figure(tmp_path: Path) -> None:
    url = server_url()
    before = _bench_schemas(url)
    out = tmp_path / "bench-pg.json"
    command = [
        sys.executable,
        str(RUN),
        "--backend",
        "postgresql",
        "--db",
        url,
        "--quick",
        "--repeat",
        "1",
        "--json",
        str(out),
        "--dir",
        str(tmp_path / "files"),
    ]
    proc = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=110, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "[1/1]" in proc.stderr

    doc = json.loads(out.read_text(encoding="utf-8"))
    params = doc["parameters"]
    assert params["backend"] == "postgresql" and params["quick"] is True
    settings = params["server_settings"]
    assert settings["fsync"] == "on" and settings["synchronous_commit"] == "on"
    assert doc["environment"]["postgresql"]

    figures = doc["figures"]
    assert set(figures) == PG_FIGURES
    for name, figure in figures.items():
        assert figure["unit"], name
        assert figure["baseline"] in figures, name
        assert name in proc.stdout, name
        if figure["skipped"]:
            assert name in PG_OPTIONAL, f"{name} was skipped: {figure.get('note')}"
            assert figure["note"], name
            continue
        assert figure["runs"], name
        if name in PG_COUNTS:
            assert figure["value"] >= 0, name
        else:
            assert figure["value"] > 0, name
            assert figure["ratio"] > 0, name
        if figure["baseline"] == "floor" and name != "floor":
            bracket = figure["rounds"][0]
            assert bracket["floor_before"] > 0 and bracket["floor_after"] > 0, name
        if name in PG_TARGETED:
            assert figure["target"], name
            assert figure["met"] in (True, False), name

    # Every worker workload did the work it was timed for (checked in the run against the
    # database; the details say what was found).
    for workers in (1, 2, 4):
        details = figures[f"e2e_workers_{workers}"]["rounds"][0]
        assert sum(details["done_per_worker"]) == details["effects"] == params["batched"]
        assert len(details["done_per_worker"]) == workers
    # Under the same SIGKILL, a receipts-backed sink applied no effect twice.
    duplicates = figures["duplicates_oncewire"]["rounds"][0]
    assert figures["duplicates_oncewire"]["value"] == 0
    assert duplicates["returncode"] == -9
    assert duplicates["downstream_rows"] == duplicates["effects"] == params["failover"]
    # Failover: the survivor released exactly what the killed worker held, and redelivered
    # exactly the claims it had recorded as starting (the others' sinks never ran).
    for name in ("failover_same_host", "failover_lease_expiry"):
        details = figures[name]["rounds"][0]
        assert details["held"] > 0, name
        assert details["released"] == details["held"], name
        assert details["redeliveries"] == details["started_at_kill"] <= details["held"], name
    assert figures["failover_lease_expiry"]["rounds"][0]["owner_host"] != "this host"

    assert _bench_schemas(url) <= before  # every schema the run created was dropped
    assert not any((tmp_path / "files").iterdir())
