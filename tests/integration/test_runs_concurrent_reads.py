"""Verified reads while another process appends: each read sees one moment of the store.

A child process appends a bounded number of commands to one run while this process reads it
continuously (``runs.get``, ``runs.verify`` of the run and of the whole store, ``runs.project``,
the ``oncewire runs verify`` command). A healthy run is never reported failed; a real tamper
(an event edited with raw SQL during the same loop) is still reported."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from oncewire import Ledger
from tests.support.runs_db import RunsDatabase

COMMANDS = 300

APPENDER = """
import sys
from oncewire import Ledger

url, commands = sys.argv[1], int(sys.argv[2])
with Ledger(url) as ledger:
    runs = ledger.runs
    runs.start("live", key="start", scope="s", owner="appender", lease_seconds=3600)
    print("started", flush=True)
    for n in range(commands // 2):
        runs.review.propose_action("live", key=f"p{n}", action_id=f"a{n}", kind="read",
                            arguments={"n": n}, side_effect_class="read_only")
        runs.review.resolve_action("live", key=f"r{n}", action_id=f"a{n}", status="succeeded",
                            result={"n": n})
print("done", flush=True)
"""


@pytest.fixture
def db(store_url: str) -> Iterator[RunsDatabase]:
    opened = RunsDatabase(store_url)
    yield opened


def _appender(db: RunsDatabase, python_child: Callable[..., subprocess.Popen[str]]) -> Any:
    child = python_child(APPENDER, db.url, str(COMMANDS))
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "started", child.stderr and child.stderr.read()
    return child


def _cli_verify(db: RunsDatabase, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oncewire", "runs", "verify", "--db", db.url, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_reads_during_appends_never_call_the_healthy_run_failed(
    db: RunsDatabase,
    python_child: Callable[..., subprocess.Popen[str]],
    child_env: Callable[..., dict[str, str]],
) -> None:
    child = _appender(db, python_child)
    reads, failures = 0, []
    seen_heads: set[int] = set()
    with Ledger(db.url) as ledger:
        runs = ledger.runs
        while child.poll() is None or reads < 20:
            run = runs.get("live")
            seen_heads.add(run.head_seq)
            if run.status == "failed" or run.claimed_status is not None:
                failures.append(("get", run.head_seq, run.terminal_reason))
            for verification in (*runs.verify("live"), *runs.verify()):
                if not verification.ok:
                    failures.append(("verify", verification.first_bad_seq, verification.reason))
            projected = runs.project("s").run
            if projected is None or projected.claimed_status is not None:
                failures.append(("project", None, None))
            reads += 1
            if reads % 25 == 0:
                cli = _cli_verify(db, child_env())
                if cli.returncode != 0:
                    failures.append(("cli", cli.returncode, cli.stdout + cli.stderr))
        _, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        final = runs.get("live")
    assert failures == []
    assert final.head_seq == 1 + COMMANDS // 2 * 2
    # The reads really ran while the run grew (not only before or after it).
    assert len(seen_heads) > 3
    assert _cli_verify(db, child_env()).returncode == 0


def test_a_real_tamper_during_appends_is_still_reported(
    db: RunsDatabase, python_child: Callable[..., subprocess.Popen[str]]
) -> None:
    child = _appender(db, python_child)
    with Ledger(db.url) as ledger:
        runs = ledger.runs
        while runs.get("live").head_seq < 3:
            pass
        # Someone with database access edits the second event's payload under the appender.
        db.tamper(
            (
                "UPDATE oncewire_run_events SET payload = REPLACE(payload, '\"n\":0', '\"n\":7') "
                "WHERE run_id = ? AND seq = 2",
                ("live",),
            )
        )
        reports = []
        while child.poll() is None or len(reports) < 20:
            (verification,) = runs.verify("live")
            run = runs.get("live")
            reports.append((verification.ok, verification.first_bad_seq, run.status))
        child.communicate(timeout=60)
    assert all(report == (False, 2, "failed") for report in reports), set(reports)
