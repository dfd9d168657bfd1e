"""``oncewire runs list|show|verify|reconcile`` against a real SQLite file and a real
PostgreSQL schema."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from oncewire import Ledger
from oncewire.cli import main
from oncewire.testing import ManualClock
from tests.support.runs_db import RunsDatabase


@pytest.fixture
def database(store_url: str) -> Iterator[RunsDatabase]:
    opened = RunsDatabase(store_url)
    clock = ManualClock()
    with Ledger(opened.url, clock=clock) as ledger:
        ledger.runs.start("run-a", key="start", scope="scope-a", owner="w", lease_seconds=5)
        ledger.runs.start("run-b", key="start", scope="scope-b", owner="w", lease_seconds=1e9)
    yield opened


@pytest.fixture
def db(database: RunsDatabase) -> str:
    return database.url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_and_show_mirror_the_api(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "runs", "list", "--db", db, "--json")
    assert code == 0
    assert [r["run_id"] for r in json.loads(out)] == ["run-a", "run-b"]
    code, out, _ = run(capsys, "runs", "show", "run-a", "--db", db, "--json")
    shown = json.loads(out)
    assert code == 0 and shown["run"]["status"] == "running" and shown["verification"]["ok"]
    assert [e["type"] for e in shown["events"]] == ["run_started"]
    code, out, _ = run(capsys, "runs", "show", "run-a", "--db", db)
    assert code == 0 and "verification: ok" in out


def test_verify_exits_non_zero_and_names_the_first_bad_event(
    database: RunsDatabase, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "runs", "verify", "--db", db)[0] == 0
    database.tamper(
        ("UPDATE oncewire_run_events SET payload = replace(payload, '\"w\"', '\"x\"')", ())
    )
    code, out, err = run(capsys, "runs", "verify", "--db", db)
    assert code == 1
    assert "run-a: FAILED at event 1" in out
    assert "run run-a failed verification at event 1" in err
    code, out, _ = run(capsys, "runs", "verify", "run-b", "--db", db, "--json")
    assert code == 1 and json.loads(out)["runs"][0]["first_bad_seq"] == 1


def test_reconcile_takes_yes_and_reports(
    db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("time.time", lambda: 1_800_000_100.0)  # run-a's lease has run out
    code, out, _ = run(capsys, "runs", "reconcile", "--db", db, "--owner", "cli", "--yes", "--json")
    assert code == 0
    assert [(r["subject_id"], r["status"]) for r in json.loads(out)] == [
        ("run-a", "review_unavailable")
    ]
    code, out, _ = run(capsys, "runs", "reports", "--db", db, "--json")
    assert code == 0 and [(r["subject_id"], r["outcome"]) for r in json.loads(out)] == [
        ("run-a", "terminal")
    ]
    code, _, err = run(capsys, "runs", "show", "nope", "--db", db)
    assert code == 1 and "run_not_found" in err
