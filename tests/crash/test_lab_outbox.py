"""The crash lab's outbox suites, run for real: child processes, SIGKILL, stores read back.

These assert the lab's own evidence *and* re-read the stores the lab kept, so that a lab that
reported success without the stores agreeing would fail here.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections import Counter
from contextlib import closing
from pathlib import Path

import pytest

from oncewire.lab.runner import run_lab
from oncewire.lab.suites.crashpoints import outbox_points

pytestmark = pytest.mark.crash


def _tickets(path: Path) -> list[tuple[int, str, int]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT id, operation_id, redelivery FROM tickets ORDER BY id").fetchall()


def _effects(path: Path) -> list[tuple[str, str, str | None]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT key, state, result FROM oncewire_effects ORDER BY key").fetchall()


def test_outbox_suite_reproduces_the_seed_figures(tmp_path: Path) -> None:
    evidence = run_lab(["outbox"], directory=tmp_path / "lab")
    assert evidence["passed"], json.dumps(evidence["suites"]["outbox"], indent=1)[:4000]
    scenarios = evidence["suites"]["outbox"]["scenarios"]
    figures = {
        name: (s["summary"].get("tickets_before"), s["summary"].get("tickets_after"))
        for name, s in scenarios.items()
    }
    assert figures["crash_before_dispatch"] == (0, 1)
    assert figures["crash_after_downstream_commit"] == (1, 1)
    assert figures["deduplication_disabled"] == (1, 2)
    assert [scenarios[n]["summary"]["ticket_id"] for n in list(scenarios)[:3]] == [1, 1, 2]
    for name in (
        "crash_before_dispatch",
        "crash_after_downstream_commit",
        "deduplication_disabled",
    ):
        assert scenarios[name]["summary"]["crash_exit"] == -9
    acceptance = scenarios["crash_during_acceptance"]["summary"]
    assert (acceptance["partial_operations"], acceptance["partial_outbox"]) == (0, 0)
    assert acceptance["tickets_after"] == 1
    assert scenarios["changed_payload_rejected"]["summary"] == {"exit_code": 3, "tickets_after": 1}

    # Read the kept stores ourselves.
    root = tmp_path / "lab" / "outbox"
    assert [
        t[0] for t in _tickets(root / "crash_after_downstream_commit" / "downstream.sqlite")
    ] == [1]
    negative = _tickets(root / "deduplication_disabled" / "downstream.sqlite")
    assert [(t[0], t[2]) for t in negative] == [(1, 0), (2, 1)], "the duplicate must be flagged"
    for folder in (
        "crash_before_dispatch",
        "crash_after_downstream_commit",
        "deduplication_disabled",
    ):
        assert [e[1] for e in _effects(root / folder / "caller.sqlite")] == ["done"]


# One child process per registered point: about a minute on a quiet machine, more under load.
@pytest.mark.timeout(400)
def test_crashpoint_matrix_covers_every_registered_point(tmp_path: Path) -> None:
    evidence = run_lab(["crashpoints"], directory=tmp_path / "lab")
    scenarios = evidence["suites"]["crashpoints"]["scenarios"]
    assert evidence["passed"], [s["failures"] for s in scenarios.values() if s["failures"]]
    points = outbox_points()
    assert len(points) >= 6
    for point in points:
        assert scenarios[f"{point}[dedup]"]["passed"]
        assert scenarios[f"{point}[dedup]"]["skipped"] is None
        no_dedup = scenarios[f"{point}[no_dedup]"]
        assert no_dedup["skipped"] is None or point.startswith("receipts.")
    root = tmp_path / "lab" / "crashpoints"
    for point in points:
        tickets = _tickets(root / f"{point}-dedup" / "downstream.sqlite")
        per_key = Counter(t[1] for t in tickets)
        assert sorted(per_key.values()) == [1, 1, 1], (point, tickets)
        assert {e[1] for e in _effects(root / f"{point}-dedup" / "caller.sqlite")} == {"done"}


def test_torture_run_is_bounded_and_holds_invariants(tmp_path: Path) -> None:
    evidence = run_lab(
        ["torture"], directory=tmp_path / "lab", seed=11, options={"operations": 120, "kills": 3}
    )
    scenarios = evidence["suites"]["torture"]["scenarios"]
    assert evidence["passed"], [s["failures"] for s in scenarios.values()]
    dedup = scenarios["torture[dedup]"]["summary"]
    assert dedup["kills"] >= 1
    assert dedup["duplicates"] == 0
    root = tmp_path / "lab" / "torture"
    tickets = _tickets(root / "dedup" / "downstream.sqlite")
    assert len(tickets) == len({t[1] for t in tickets})
    effects = _effects(root / "dedup" / "caller.sqlite")
    assert len(effects) == dedup["operations"]
    assert {e[1] for e in effects} == {"done"}
    loose = _tickets(root / "no_dedup" / "downstream.sqlite")
    seen: set[str] = set()
    for _, key, redelivery in loose:
        if key in seen:
            assert redelivery == 1
        seen.add(key)


def test_lab_cli_refuses_an_existing_directory_and_writes_evidence(tmp_path: Path) -> None:
    existing = tmp_path / "exists"
    existing.mkdir()
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "oncewire.cli",
            "lab",
            "--suite",
            "outbox",
            "--directory",
            str(existing),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1
    assert "already exists" in refused.stderr
    assert list(existing.iterdir()) == []

    output = tmp_path / "evidence.json"
    ran = subprocess.run(
        [sys.executable, "-m", "oncewire.cli", "lab", "--suite", "outbox", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().splitlines()[-1].startswith("PASS: 5 scenarios")
    evidence = json.loads(output.read_text())
    assert evidence["signal"] == "SIGKILL" and evidence["passed"] is True
    for key in ("python", "sqlite", "platform", "experiment"):
        assert evidence[key]
    crash = evidence["suites"]["outbox"]["scenarios"]["crash_before_dispatch"]
    assert any(p["exit_code"] == -9 and p["pid"] > 0 for p in crash["processes"])


def test_unknown_suite_is_a_clear_error() -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "oncewire.cli", "lab", "--suite", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 1
    assert ran.stderr.startswith("error: unknown suite(s): nope")
    assert "Traceback" not in ran.stderr
