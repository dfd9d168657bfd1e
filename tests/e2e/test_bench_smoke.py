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

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks" / "run.py"

FIGURES = {
    "floor",
    "floor_batched",
    "accept",
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
