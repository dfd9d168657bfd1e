"""The replies benchmark runs end to end and reports what it measured (timings unasserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_replies_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "replies_bench.py"),
            "--quick",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "raw SQLite floor" in done.stdout and "commits/reply" in done.stdout
    results = json.loads(out.read_text())["results"]
    short = results["short reply, ledger only"]
    assert short["commits_per_reply_without_admission"] == 3
    assert short["bound"] == 0.25  # four commits inside the clock, the admission's included
    # Each commit's BEGIN and COMMIT at least, and at least one page written by each commit.
    assert short["statements_per_reply"] >= 8 and short["wal_frames_per_reply"] >= 4
    streamed = results["8,000 chars streamed (20 deltas), journaled fake"]
    assert streamed["wire_ops_per_reply"] >= 20
