"""The ``gateway`` lab suite: the real gateway process killed with SIGKILL and restarted, on a
SQLite file and on PostgreSQL, with its evidence read back here (the fakes' journals and the
store, both kept in the lab's folder or schema).

The default run has the whole suite on SQLite (through ``oncewire lab``) and, on PostgreSQL,
the scenarios in :data:`ON_POSTGRESQL`, each through the suite's own ``run_scenario``: the
kills whose evidence is checked below and the crash points the gateway's path must reach. The
whole suite on PostgreSQL is a soak test (``make soak``); seed 002's crash cells run C1-C6 on
PostgreSQL in the default run as well.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from oncewire.lab.fixtures import Backend
from oncewire.lab.framework import LabContext, ScenarioResult
from oncewire.lab.gateway_rig import GatewayRig
from oncewire.lab.runner import run_lab
from oncewire.lab.suites.gateway import (
    SCENARIOS,
    check_answer,
    crash_point_scenarios,
    run_scenario,
)
from oncewire.platforms.fake import ChatView
from tests.conftest import _child_env
from tests.support.pg import server_url

# The whole suite, each scenario starting the fakes and a gateway or two: minutes on a busy host.
pytestmark = [pytest.mark.crash, pytest.mark.timeout(400)]
# Crash points the gateway's path must reach (each scenario then checks the restart).
REACHED = ("commit_before_commit", "send_in_flight", "sent_ack_lost", "edit_ack_lost")

KILLED = -signal.SIGKILL
# The scenarios the default run keeps on PostgreSQL: the evidence _check_evidence reads and the
# crash points the gateway's path must reach.
ON_POSTGRESQL = (
    "killed_with_send_ack_lost",
    "crash_point_send_in_flight",
    *(f"armed_{point}" for point in REACHED),
)


def _scenarios(evidence: dict[str, Any], backend: str) -> dict[str, Any]:
    suite = evidence["suites"]["gateway"]
    assert evidence["passed"], json.dumps(suite, indent=1)[:6000]
    scenarios: dict[str, Any] = suite["scenarios"]
    every = SCENARIOS + crash_point_scenarios()
    assert set(scenarios) == {f"{s.name}[{backend}]" for s in every}
    for point in REACHED:
        armed = scenarios[f"armed_{point}[{backend}]"]
        assert armed["skipped"] is None, armed["skipped"]
    return scenarios


def _check_evidence(scenarios: dict[str, Any], backend: str) -> None:
    for name, scenario in scenarios.items():
        if scenario["skipped"]:
            continue
        codes = [p["exit_code"] for p in scenario["processes"]]
        if not name.startswith("plain_message"):
            # The first gateway died from SIGKILL (from outside, or at its armed crash point).
            assert codes[0] == KILLED, (name, codes)
        # Every gateway still running at the end drained to exit 0.
        assert codes[-1] == 0, (name, codes)
    held = scenarios[f"crash_point_send_in_flight[{backend}]"]
    assert held["processes"][0]["armed"] == "replies.send_in_flight"
    ack_lost = scenarios[f"killed_with_send_ack_lost[{backend}]"]["summary"]["visible"]
    assert sorted(marked for _, marked in ack_lost) == [False, True]


@pytest.mark.slow
def test_the_gateway_suite_passes_on_postgresql() -> None:
    pytest.importorskip("psycopg")
    backend = Backend("postgresql", server_url(), run_id="gateway-test")
    evidence = run_lab(["gateway"], backend=backend)
    _check_evidence(_scenarios(evidence, "postgresql"), "postgresql")


def test_a_bounded_share_of_the_gateway_suite_passes_on_postgresql(tmp_path: Path) -> None:
    """The default run's share of the suite on PostgreSQL: each scenario of ON_POSTGRESQL run by
    the suite's own run_scenario in a lab context on the server, its schemas dropped after."""
    pytest.importorskip("psycopg")
    chosen = [s for s in SCENARIOS + crash_point_scenarios() if s.name in ON_POSTGRESQL]
    assert sorted(s.name for s in chosen) == sorted(ON_POSTGRESQL)
    backend = Backend("postgresql", server_url(), run_id=f"gateway-{tmp_path.name[-6:]}")
    ctx = LabContext(tmp_path / "lab", seed=1, backend=backend)
    try:
        results = [run_scenario(ctx, scenario) for scenario in chosen]
    finally:
        ctx.cleanup()
    scenarios = {r.name: r.as_dict() for r in results}
    for name, scenario in scenarios.items():
        assert scenario["passed"], json.dumps(scenario, indent=1)[:6000]
        assert scenario["skipped"] is None, (name, scenario["skipped"])
    _check_evidence(scenarios, "postgresql")


def test_the_verdict_fails_on_a_duplicate_or_a_partial_answer(tmp_path: Path) -> None:
    """The oracle is not vacuous: the same rig, a plain answer, judged against other texts."""
    answer = "Only this."
    with GatewayRig(
        tmp_path, str(tmp_path / "gateway.db"), [{"kind": "text", "text": answer}]
    ) as rig:
        rig.start()
        rig.inject("question")
        rig.wait_inbound("delivered")
        good = ScenarioResult("good")
        check_answer(good, rig, answer, "exact")
        assert good.passed, good.failures
        other = ScenarioResult("other text")
        check_answer(other, rig, "Something else.", "one_copy")
        assert not other.passed
        assert any("partial or other" in f for f in other.failures)
        missing = ScenarioResult("another inbound")
        check_answer(missing, rig, answer, "exact", inbound_id=2)
        assert not missing.passed


def test_oncewire_lab_runs_the_gateway_suite_on_sqlite(tmp_path: Path) -> None:
    output = tmp_path / "evidence.json"
    lab = tmp_path / "lab"
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "oncewire",
            "lab",
            "--suite",
            "gateway",
            "--directory",
            str(lab),
            "--output",
            str(output),
        ],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.strip().splitlines()[-1].startswith("PASS: ")
    evidence = json.loads(output.read_text(encoding="utf-8"))
    _check_evidence(_scenarios(evidence, "sqlite"), "sqlite")
    # What the user saw in one kill scenario, read back from the journal the lab kept.
    folder = lab / "gateway" / "killed_while_model_hangs"
    shown = ChatView([folder / "telegram" / "chat.jsonl"]).visible("fk_tg")
    assert [m.text for m in shown] == ["The complete answer, after the restart."]
    with closing(sqlite3.connect(folder / "gateway.db")) as db:
        rows = db.execute("SELECT status, attempts FROM oncewire_inbound").fetchall()
    assert rows == [("delivered", 2)]
