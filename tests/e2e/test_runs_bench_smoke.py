"""The run-ledger benchmark runs end to end and reports what it measured (timings unasserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_runs_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "runs_bench.py"), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "raw SQLite floor" in done.stdout and "commands/s" in done.stdout
    figures = json.loads(out.read_text())
    assert figures["pragmas"] == {"journal_mode": "wal", "synchronous": 2}
    assert figures["verification"]["events"] == 2_001
    assert figures["reconciliation"]["runs"] == 100
    assert figures["commands_ratio_to_floor"] > 0
    assert figures["bound"] == 1.0
    # BEGIN, the context read, the event insert, the run update, COMMIT.
    assert figures["per_command"]["candidate"] == {"statements": 5}


# The smoke counts build a 2,001-event history one command (one round trip) at a time; the quick
# mode's 20,001 took 30 s on a quiet machine and over 100 s on a loaded one. Timings unasserted.
@pytest.mark.timeout(330)
def test_runs_bench_smoke_on_postgresql(tmp_path: Path) -> None:
    from tests.support.pg import server_url

    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "runs_bench.py"),
            "--smoke",
            "--db",
            server_url(),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "raw PostgreSQL floor" in done.stdout and "commands/s" in done.stdout
    figures = json.loads(out.read_text())
    assert figures["backend"] == "postgresql" and "synchronous_commit" in figures["pragmas"]
    assert figures["verification"]["events"] == 2_001
    assert figures["reconciliation"]["runs"] == 100
    # A candidate command: BEGIN with the context read, the writes in one pipeline, COMMIT.
    assert figures["per_command"]["candidate"] == {"statements": 5, "round_trips": 3}
