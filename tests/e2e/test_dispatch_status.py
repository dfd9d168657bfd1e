"""``oncewire dispatch --status-every``: the periodic status line of a real dispatcher process,
checked against the store it dispatches from (read with sqlite3, not through oncewire)."""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

from oncewire import Ledger
from oncewire.dispatch.reporting import DispatchStats, read_status

APP = """
import time
from oncewire import MaybeSent, NotSent, Rejected

def slow(attempt):
    time.sleep(0.05)
    if attempt.payload.get("refuse"):
        return Rejected("refused by the test")
    if attempt.payload.get("flaky") and attempt.number == 1:
        return NotSent("busy the first time")
    if attempt.payload.get("doomed"):
        return MaybeSent("timed out, may have landed")
    return {"sent": attempt.key}

SINKS = {"slow": slow}
"""

LINE = re.compile(
    r"(?P<which>final status|status): since start: done (?P<done>\d+), retried (?P<retried>\d+), "
    r"rejected (?P<rejected>\d+), dead (?P<dead>\d+), redelivered (?P<redelivered>\d+); "
    r"now: in flight (?P<claimed>\d+), waiting (?P<waiting>\d+)(?: \(oldest (?P<oldest>\d+)s\))?$"
)
PLAIN, REFUSED, FLAKY, DOOMED = 40, 3, 2, 1


def accept_all(db: Path) -> int:
    with Ledger(str(db)) as ledger:
        for i in range(PLAIN):
            ledger.accept(f"plain-{i}", "slow", {})
        for i in range(REFUSED):
            ledger.accept(f"refused-{i}", "slow", {"refuse": True})
        for i in range(FLAKY):
            ledger.accept(f"flaky-{i}", "slow", {"flaky": True})
        for i in range(DOOMED):
            ledger.accept(f"doomed-{i}", "slow", {"doomed": True}, max_attempts=1)
    return PLAIN + REFUSED + FLAKY + DOOMED


def dispatch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "oncewire",
            "dispatch",
            "--db",
            str(tmp_path / "app.db"),
            "--app",
            "myapp:SINKS",
            "--until-idle",
            *args,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    return ran


def statuses(stderr: str) -> list[dict[str, Any]]:
    found = []
    for line in stderr.splitlines():
        if " status: " in line or " final status: " in line:
            match = LINE.search(line)
            assert match, line
            found.append(
                {k: v if k == "which" else int(v or -1) for k, v in match.groupdict().items()}
            )
    return found


def store_counts(db: Path) -> dict[str, int]:
    with closing(sqlite3.connect(db)) as conn:
        states = dict(conn.execute("SELECT state, COUNT(*) FROM oncewire_effects GROUP BY state"))
        retried = conn.execute(
            "SELECT COUNT(*) FROM oncewire_attempts WHERE state IN ('pending', 'uncertain')"
        ).fetchone()[0]
        redelivered = conn.execute(
            "SELECT COUNT(*) FROM oncewire_attempts WHERE redelivery = 1"
        ).fetchone()[0]
    return {
        "done": states.get("done", 0),
        "rejected": states.get("rejected", 0),
        "dead": states.get("dead", 0),
        "retried": retried,
        "redelivered": redelivered,
    }


def test_the_status_line_follows_the_work_and_its_last_line_matches_the_store(
    tmp_path: Path,
) -> None:
    (tmp_path / "myapp.py").write_text(APP)
    total = accept_all(tmp_path / "app.db")
    ran = dispatch(tmp_path, "--status-every", "0.4")
    lines = statuses(ran.stderr)
    periodic = [s for s in lines if s["which"] == "status"]
    assert len(periodic) >= 2, ran.stderr  # ~2.5 s of sink calls
    assert lines[-1]["which"] == "final status" and len(lines) == len(periodic) + 1
    # While it ran: the backlog shrank as the done count grew, and the oldest waiting effect
    # was shown with its age.
    first = periodic[0]
    assert first["waiting"] > 0 and first["oldest"] >= 0 and first["done"] < total
    for earlier, later in itertools.pairwise(lines):
        assert later["done"] >= earlier["done"]
    assert all(s["claimed"] <= 32 for s in lines)  # at most one batch claimed by this worker
    # At the end, every number equals what the store holds.
    final = lines[-1]
    counts = store_counts(tmp_path / "app.db")
    assert counts["done"] == PLAIN + FLAKY and counts["rejected"] == REFUSED
    assert counts["dead"] == DOOMED and counts["retried"] >= FLAKY
    for name, value in counts.items():
        assert final[name] == value, (name, final, counts)
    assert (final["claimed"], final["waiting"], final["oldest"]) == (0, 0, -1)


def test_json_status_records_carry_the_numbers_and_zero_turns_them_off(tmp_path: Path) -> None:
    (tmp_path / "myapp.py").write_text(APP)
    accept_all(tmp_path / "app.db")
    ran = dispatch(tmp_path, "--status-every", "0.4", "--log-format", "json")
    records = [json.loads(line) for line in ran.stderr.splitlines()]
    shown = [r for r in records if r.get("status") in ("periodic", "final")]
    assert shown and shown[-1]["status"] == "final"
    counts = store_counts(tmp_path / "app.db")
    assert {name: shown[-1][name] for name in counts} == counts
    assert shown[-1]["claimed"] == shown[-1]["waiting"] == 0
    assert "oldest_waiting_seconds" not in shown[-1]  # nothing waits: no age to show

    with Ledger(str(tmp_path / "app.db")) as ledger:
        ledger.accept("one-more", "slow", {})
    quiet = dispatch(tmp_path, "--status-every", "0")
    assert "status" not in quiet.stderr
    assert store_counts(tmp_path / "app.db")["done"] == counts["done"] + 1


def test_a_store_that_cannot_be_read_is_named_on_the_line_with_the_counts_kept(
    tmp_path: Path,
) -> None:
    db = tmp_path / "gone.db"
    ledger = Ledger(str(db))
    ledger.accept("a", "slow", {})
    later = ledger.clock.now() + 5
    readable = read_status(DispatchStats(done=2, not_sent=1), ledger.store, ["slow"], later)
    assert (readable.waiting, readable.claimed, readable.retried) == (1, 0, 1)
    assert readable.oldest_waiting_seconds is not None and readable.oldest_waiting_seconds >= 5
    ledger.close()
    for path in tmp_path.glob("gone.db*"):
        path.unlink()
    db.mkdir()  # where the store was, something no driver can open
    status = read_status(DispatchStats(done=2), ledger.store, ["slow"], later)
    assert status.store_error is not None and status.waiting is None
    assert status.line().startswith("since start: done 2, retried 0,")
    assert "; store unreadable: " in status.line() and "in flight" not in status.line()
