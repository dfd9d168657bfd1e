"""The observation benchmark runs with tiny counts on both backends and measures every mode;
its timings are not checked, only that each figure was measured and each mode observed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.pg import server_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_observe_bench_quick(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "observe.json"
    args = [sys.executable, str(ROOT / "benchmarks" / "observe_bench.py"), "--quick"]
    if backend == "postgresql":
        args += ["--db", server_url()]
    done = subprocess.run(
        [*args, "--json", str(out)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["backend"] == backend
    for row in ("accept", "end to end"):
        measured = figures["rows"][row]
        assert set(measured["per_second"]) == {"off", "listener", "otel"}
        assert all(rate > 0 for rate in measured["per_second"].values())
        assert measured["observed"]["listener"] > 0 and measured["observed"]["otel"] > 0
