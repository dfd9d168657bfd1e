"""The HTTP benchmark runs end to end with tiny counts and reports every row it promises.

Timings are not asserted. The benchmark itself fails when the counting server did not receive
every effect exactly once, or when a repeated key was not replayed; this test checks that it
finished, printed its table, and wrote each figure with its floor comparison.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("httpx2")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[2]
ROWS = (
    "raw httpx2 POST loop",
    "HttpSink, called directly",
    "Dispatcher + HttpSink, concurrency 1",
    "Dispatcher + HttpSink, concurrency 8",
    "Starlette, no middleware",
    "Starlette + middleware, new key each",
    "Starlette + middleware, one key replayed",
)


@pytest.mark.timeout(300)
def test_http_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "http.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "http_bench.py"),
            "--quick",
            "--n",
            "12",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    assert (document["n"], document["rounds"]) == (12, 1)
    assert list(document["figures"]) == list(ROWS)
    for row in ROWS:
        assert row in done.stdout, row
        figures = document["figures"][row]
        assert figures["per_second"] > 0 and figures["ms_per_op"] > 0, row
        assert len(figures["rounds"]) == 1, row
    assert document["figures"]["raw httpx2 POST loop"]["x_floor"] == 1.0
    assert document["figures"]["Starlette, no middleware"]["x_floor"] == 1.0
