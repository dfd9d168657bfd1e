"""No lost accepted run: durable_invoke records the run's input before the first node runs; a
process killed (SIGKILL) mid-run leaves it listed by ``oncewire langgraph pending``, and
``oncewire langgraph resume`` finishes it once. Real child processes; rows read directly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.langgraph.conftest import Raw

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
    env.update(extra)
    return env


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oncewire.cli", *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_run_killed_mid_way_is_listed_and_resumed_once(db_url: str, raw: Raw) -> None:
    killed = subprocess.run(
        [sys.executable, "-m", "tests.langgraph.run_child", db_url, "t"],
        cwd=ROOT,
        env=_env(ONCEWIRE_TEST_KILL_IN="s2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert raw.query("SELECT state, attempts FROM oncewire_lg_runs WHERE thread_id = 't'") == [
        ("running", 1)
    ]

    pending = _cli("langgraph", "pending", "--db", db_url, "--json")
    assert pending.returncode == 0, pending.stderr
    (listed,) = json.loads(pending.stdout)
    assert (listed["thread_id"], listed["why"], listed["graph"]) == (
        "t",
        "owner died",
        "tests.langgraph.run_child:builder",
    )

    resumed = _cli("langgraph", "resume", "--db", db_url, "--all", "--yes")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed t: done" in resumed.stdout
    assert raw.query("SELECT state, attempts FROM oncewire_lg_runs WHERE thread_id = 't'") == [
        ("done", 2)
    ]
    again = _cli("langgraph", "pending", "--db", db_url, "--json")
    assert json.loads(again.stdout) == []

    # s1 ran once (its writes were durable before the kill), s2 and s3 once each after it.
    from oncewire.langgraph import OncewireSaver
    from oncewire.ledger import Ledger

    with Ledger(db_url) as ledger:
        state = OncewireSaver(ledger).get_tuple({"configurable": {"thread_id": "t"}})
    assert state is not None
    assert state.checkpoint["channel_values"]["log"] == ["input", "s1", "s2", "s3"]
    doctor = _cli("doctor", "--db", db_url, "--deep", "--json")
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert checks["langgraph"]["status"] == "ok", checks["langgraph"]


def test_a_run_killed_before_its_first_checkpoint_starts_from_its_input(
    db_url: str, raw: Raw
) -> None:
    killed = subprocess.run(
        [sys.executable, "-m", "tests.langgraph.run_child", db_url, "t"],
        cwd=ROOT,
        env=_env(ONCEWIRE_TEST_KILL_IN="s1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = _cli("langgraph", "resume", "--db", db_url, "t", "--yes")
    assert resumed.returncode == 0, resumed.stderr
    rows = raw.query("SELECT state FROM oncewire_lg_runs WHERE thread_id = 't'")
    assert rows == [("done",)]
    from oncewire.langgraph import OncewireSaver
    from oncewire.ledger import Ledger

    with Ledger(db_url) as ledger:
        state = OncewireSaver(ledger).get_tuple({"configurable": {"thread_id": "t"}})
    assert state is not None
    assert state.checkpoint["channel_values"]["log"] == ["input", "s1", "s2", "s3"]


def test_a_tampered_thread_fails_doctor_deep(db_url: str, raw: Raw) -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "tests.langgraph.run_child", db_url, "t"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    raw.execute("UPDATE oncewire_lg_chain SET material = material || ' ' WHERE seq = 2")
    doctor = _cli("doctor", "--db", db_url, "--deep", "--json")
    assert doctor.returncode == 1
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert checks["langgraph"]["status"] == "fail"
    assert "t (" in checks["langgraph"]["detail"]
