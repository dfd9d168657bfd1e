"""The asyncio benchmark runs end to end and reports every figure against its synchronous twin.

Timings are never asserted: this only checks that each figure was measured on both sides, in
the same run, and compared (a positive, finite ratio).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.pg import server_url

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "aio_bench.py"
FIGURES = {"accept", "transaction", "accept, 8 at once", "end to end"}


def _run(tmp_path: Path, *extra: str) -> tuple[str, dict[str, object]]:
    out = tmp_path / "aio.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--count", "12", "--rounds", "1", "--json", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, json.loads(out.read_text())


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_aio_benchmark_measures_each_figure_on_both_sides(tmp_path: Path, backend: str) -> None:
    extra = ("--db", server_url()) if backend == "postgresql" else ()
    table, report = _run(tmp_path, *extra)
    assert report["backend"] == backend and report["count"] == 12
    figures = report["figures"]
    assert isinstance(figures, dict) and set(figures) == FIGURES
    for name, figure in figures.items():
        for field in ("sync_per_second", "async_per_second", "ratio"):
            value = figure[field]
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (name, field)
        assert len(figure["rounds"]["ratio"]) == 1
        assert name in table
    assert "async/sync" in table
