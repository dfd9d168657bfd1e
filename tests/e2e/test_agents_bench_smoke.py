"""The Agents SDK benchmark runs end to end on SQLite and reports what it measured (timings
unasserted): a plain and a durable figure per mode, beside the floor of the same round."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("agents", reason="needs the agents extra")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_agents_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "agents_bench.py"),
            "--smoke",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "durable steps/s" in done.stdout and "floor commits" in done.stdout
    figures = json.loads(out.read_text())
    assert figures["steps_per_run"] == 10
    (sqlite,) = figures["results"]
    assert sqlite["backend"] == "sqlite"
    assert set(sqlite["figures"]) == {"sync", "async"}
    for figure in sqlite["figures"].values():
        assert figure["plain_steps_per_s"] > 0 and figure["durable_steps_per_s"] > 0
        assert figure["floor_commit_ms"] > 0
