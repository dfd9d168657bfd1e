"""The gateway benchmark runs end to end (gateway, fake Bot API and fake model as processes) and
reports every figure it promises; timings are not asserted, counts must be counted."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMES = ("turns_per_second", "floor", "cold_start", "ready_after_kill", "turns_per_s_backlog")
LATENCY = ("turn_latency_p50", "turn_latency_p90", "turn_latency_p99")
RECOVERY = ("recovery_first", "recovery_last")


@pytest.mark.crash
@pytest.mark.timeout(300)
def test_gateway_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gateway_bench.py"),
            "--quick",
            "--json",
            str(out),
            "--dir",
            str(tmp_path / "files"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    figures = document["figures"]
    # fsyncs are counted with strace; without it (or where ptrace is refused) the figure is
    # left out, and the document says so.
    strace = document["fsyncs_counted_with"]
    assert strace is None or Path(strace).name == "strace"
    assert (strace is None) == ("fsyncs_per_reply" not in figures)
    if shutil.which("strace") is None:
        assert strace is None
    counted = ["commits_per_reply"] + (["fsyncs_per_reply"] if strace else [])
    for name in (*counted, *TIMES, *RECOVERY, *LATENCY, "backlog_vs_empty", "duplicate_sends"):
        assert name in figures, name
        assert name in done.stdout, name
    for name in counted:
        value = figures[name]["value"]
        assert isinstance(value, int) and value > 0, (name, value)
        assert all(isinstance(n, int) and n > 0 for n in figures[name]["rounds"]), name
        assert figures[name]["baseline_value"] == 5  # the design's T1, T2, T5 and two op commits
    for reply in document["per_reply"]:
        # Every transaction the trace saw is named by its thread and the tables it wrote; the
        # poller's admission (T1) writes the inbox alone.
        admissions = [t for t in reply["transactions"] if t["thread"].startswith("poller")]
        assert [t["tables"] for t in admissions] == ["inbound"]
        assert reply["commits_writing_rows"] <= reply["commits"]
    for name in (*TIMES, *RECOVERY, *LATENCY, "backlog_vs_empty"):
        assert figures[name]["value"] > 0, name
    p50, p90, p99 = (figures[name]["value"] for name in LATENCY)
    assert p50 <= p90 <= p99
    assert document["params"]["backlog"] == 2000 and document["params"]["latency_messages"] == 20
    for name in ("turns_per_second", "ready_after_kill", *RECOVERY):
        assert figures[name]["ratio"] > 0, name
    duplicates = figures["duplicate_sends"]["value"]
    assert isinstance(duplicates, int) and duplicates >= 0
    params = document["params"]
    assert params["pragmas"] == {"journal_mode": "wal", "synchronous": "FULL"}
    assert len(figures["recovery_first"]["rounds"]) == document["rounds"] == 1
