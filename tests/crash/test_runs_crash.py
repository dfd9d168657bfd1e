"""The run ledger under real SIGKILL: the ``runs`` lab suite, and a direct kill of a worker
in the middle of a review, with the database read back by this test."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from oncewire.lab.runner import run_lab

pytestmark = pytest.mark.crash

WORKER = [sys.executable, "-m", "oncewire.lab.children.runs"]


def _rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute(sql).fetchall()


def test_the_runs_suite_passes_and_its_databases_agree(tmp_path: Path) -> None:
    evidence = run_lab(["runs"], directory=tmp_path / "lab")
    suite = evidence["suites"]["runs"]
    assert evidence["passed"], json.dumps(suite, indent=1)[:4000]
    assert set(suite["scenarios"]) == {
        "mid_review",
        "mid_repair",
        "candidate_before_delivery",
        "delivery_before_publish",
    }
    for name, scenario in suite["scenarios"].items():
        assert scenario["summary"]["crash_exit"] == -signal.SIGKILL
        db = tmp_path / "lab" / "runs" / name / "runs.db"
        statuses = _rows(db, "SELECT status FROM oncewire_runs")
        assert statuses == [(scenario["summary"]["status"],)]
        assert _rows(db, "SELECT COUNT(*) FROM oncewire_run_events WHERE terminal = 1") == [(1,)]


def test_a_worker_killed_mid_review_is_closed_once_after_its_lease(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    env_arm = {"ONCEWIRE_CRASH": "runs.command_after_commit@3"}
    killed = subprocess.run(
        [*WORKER, "review", "--db", str(db), "--lease-seconds", "0.5"],
        env={**_env(), **env_arm},
        capture_output=True,
        timeout=60,
    )
    assert killed.returncode == -signal.SIGKILL
    assert _rows(db, "SELECT status, finished_at FROM oncewire_runs") == [("reviewing", None)]
    time.sleep(0.7)
    for owner in ("restart-1", "restart-2"):
        done = subprocess.run(
            [*WORKER, "reconcile", "--db", str(db), "--owner", owner],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    assert _rows(db, "SELECT status, terminal_reason, owner FROM oncewire_runs") == [
        ("review_unavailable", "lease_expired", "restart-1")
    ]
    assert _rows(db, "SELECT type FROM oncewire_run_events ORDER BY seq")[-2:] == [
        ("review_completed",),
        ("run_terminated",),
    ]
    assert _rows(db, "SELECT COUNT(*) FROM oncewire_run_reports") == [(1,)]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_CRASH")}


def test_two_processes_booting_at_once_close_each_orphan_exactly_once(tmp_path: Path) -> None:
    from oncewire import Ledger

    db = tmp_path / "boot-race.db"
    with Ledger(str(db)) as ledger:
        for i in range(40):
            ledger.runs.start(f"orphan-{i}", key="start", scope=f"s-{i}", lease_seconds=0.05)
    time.sleep(0.1)
    command = [*WORKER, "reconcile", "--db", str(db), "--owner"]
    first = subprocess.Popen([*command, "boot-a"], env=_env(), stdout=subprocess.PIPE, text=True)
    second = subprocess.Popen([*command, "boot-b"], env=_env(), stdout=subprocess.PIPE, text=True)
    outputs = [p.communicate(timeout=60)[0] for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0
    reports = [r for out in outputs for r in json.loads(out)["reports"]]
    assert sorted(r["run_id"] for r in reports) == sorted(f"orphan-{i}" for i in range(40))
    assert _rows(db, "SELECT COUNT(*) FROM oncewire_run_events WHERE terminal = 1") == [(40,)]
    assert _rows(db, "SELECT COUNT(*) FROM oncewire_run_reports") == [(40,)]


def test_the_runs_suite_passes_on_postgresql(tmp_path: Path) -> None:
    from oncewire.lab.fixtures import Backend
    from tests.support.pg import server_url

    evidence = run_lab(["runs"], backend=Backend("postgresql", server_url()))
    suite = evidence["suites"]["runs"]
    assert evidence["passed"] and evidence["backend"] == "postgresql", json.dumps(suite)[:4000]
    assert {name: s["skipped"] for name, s in suite["scenarios"].items()} == {
        "mid_review": None,
        "mid_repair": None,
        "candidate_before_delivery": None,
        "delivery_before_publish": None,
    }


def test_two_processes_booting_at_once_on_postgresql_close_each_orphan_once() -> None:
    import psycopg

    from oncewire import Ledger
    from tests.support.pg import fresh_schema, server_url

    with fresh_schema(server_url(), "boot") as url:
        with Ledger(url) as ledger:
            for i in range(40):
                ledger.runs.start(f"orphan-{i}", key="start", scope=f"s-{i}", lease_seconds=0.05)
        time.sleep(0.1)
        command = [*WORKER, "reconcile", "--db", url, "--owner"]
        children = [
            subprocess.Popen([*command, owner], env=_env(), stdout=subprocess.PIPE, text=True)
            for owner in ("boot-a", "boot-b")
        ]
        outputs = [p.communicate(timeout=60)[0] for p in children]
        assert [p.returncode for p in children] == [0, 0]
        reports = [r for out in outputs for r in json.loads(out)["reports"]]
        assert sorted(r["run_id"] for r in reports) == sorted(f"orphan-{i}" for i in range(40))
        with psycopg.connect(url) as conn:
            counts = conn.execute(
                "SELECT (SELECT COUNT(*) FROM oncewire_run_events WHERE terminal), "
                "(SELECT COUNT(*) FROM oncewire_run_reports)"
            ).fetchone()
        assert counts == (40, 40)
