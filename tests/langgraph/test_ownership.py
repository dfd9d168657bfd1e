"""Write ownership across real processes: a second process resumes a thread while the first,
whose lease only its writes renew (no heartbeat) and whose node runs past it, still runs. The
first's late writes are refused (thread_lease_lost) before anything is written, the thread's
chain has no fork, and both processes' reads verify. Checked in the tables directly."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.langgraph.conftest import Raw

ROOT = Path(__file__).resolve().parents[2]


def _child(role: str, db_url: str, folder: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.langgraph.owner_child", role, db_url, "t", str(folder)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(what: str, check: object, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_stale_owner_is_refused_and_the_chain_does_not_fork(
    db_url: str, raw: Raw, tmp_path: Path
) -> None:
    first = _child("first", db_url, tmp_path)
    try:
        _wait_for("the first process to enter slow", (tmp_path / "first-in-slow").exists)

        def lease_ran_out() -> bool:
            rows = raw.query(
                "SELECT expires_at FROM oncewire_leases WHERE name = 'langgraph.thread:t'"
            )
            return bool(rows) and float(rows[0][0]) < time.time()

        _wait_for("the first process's lease to run out", lease_ran_out)
        fence_before = raw.query(
            "SELECT fence FROM oncewire_leases WHERE name = 'langgraph.thread:t'"
        )[0][0]
        entries_before = raw.query("SELECT COUNT(*) FROM oncewire_lg_chain")[0][0]
        second = _child("second", db_url, tmp_path)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 0, err[-3000:]
        assert first.poll() is None  # the first is still running, inside slow
        (tmp_path / "go").touch()
        first_out, first_err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 0, first_err[-3000:]
    second_report = json.loads(out.strip().splitlines()[-1])
    first_report = json.loads(first_out.strip().splitlines()[-1])
    assert second_report == {
        "outcome": "done",
        "view": ["n0", "slow-second", "n2-second"],
        "verified": True,
    }
    assert first_report["outcome"] == "thread_lease_lost"
    assert first_report["view"] == ["n0", "slow-second", "n2-second"]  # it reads the truth
    assert first_report["verified"] is True

    # The lease moved once, to the second process.
    (fence_after,) = raw.query(
        "SELECT fence FROM oncewire_leases WHERE name = 'langgraph.thread:t'"
    )[0]
    assert fence_after == fence_before + 1
    # Nothing of the first's slow task was stored: only the second's result.
    values = [
        bytes(r[0])
        for r in raw.query(
            "SELECT value FROM oncewire_lg_writes WHERE thread_id = 't' AND channel = 'log' "
            "AND task_path = '~__pregel_pull, slow'"
        )
    ]
    assert len(values) == 1 and b"slow-second" in values[0]
    everything = b"".join(
        bytes(r[0]) for r in raw.query("SELECT checkpoint FROM oncewire_lg_checkpoints")
    )
    assert b"slow-first" not in everything
    # No fork: every checkpoint has at most one child, and the chain is 1..head, unbroken.
    parents = [
        r[0]
        for r in raw.query(
            "SELECT parent_checkpoint_id FROM oncewire_lg_checkpoints WHERE thread_id = 't' "
            "AND parent_checkpoint_id IS NOT NULL"
        )
    ]
    assert len(parents) == len(set(parents))
    seqs = [r[0] for r in raw.query("SELECT seq FROM oncewire_lg_chain ORDER BY seq")]
    (head,) = raw.query("SELECT head_seq FROM oncewire_lg_threads WHERE thread_id = 't'")[0]
    assert seqs == list(range(1, head + 1))
    assert head > entries_before
