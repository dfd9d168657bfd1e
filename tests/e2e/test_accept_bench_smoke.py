"""The PostgreSQL accept benchmark runs end to end and reports what it measured and counted
(timings unasserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_accept_bench_smoke_on_postgresql(tmp_path: Path) -> None:
    from tests.support.pg import server_url

    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "accept_bench.py"),
            "--db",
            server_url(),
            "--repeat",
            "1",
            "-n",
            "100",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "accept" in done.stdout and "1 round trip" in done.stdout
    figures = json.loads(out.read_text())
    assert figures["bound"] == 1.0 and figures["ratio"] > 0
    # One autocommit INSERT: the server commits it as it runs, no BEGIN and no COMMIT.
    assert figures["per_accept"] == {"statements": 1, "round_trips": 1}
