"""The ``gateway`` lab suite: the real gateway process killed with SIGKILL and restarted, on a
SQLite file and on PostgreSQL, with its evidence read back here (the fakes' journals and the
store, both kept in the lab's folder or schema).

The lab is the one home of the gateway's crash evidence: its scenario table (the seed 002 cells
C1-C6 of :data:`~oncewire.lab.suites.gateway_cells.CELLS`, the streaming ones C3, C5 and C6 on
Telegram and on Discord, the kills, the idle restart and every ``replies.*`` crash point) and
its one verdict (:func:`~oncewire.lab.suites.gateway_verdict.check_answer`, with
:func:`~oncewire.lab.suites.gateway_verdict.check_asked`). The default run has the whole suite
on SQLite (through ``oncewire lab``) and, on PostgreSQL, one scenario per outcome class the
verdict knows (``exact``, ``one_copy``, ``marked_dupes``) plus the crash points the gateway's
path must reach (:data:`ON_POSTGRESQL`), each a test of its own (through the suite's own
``run_scenario``). Every other scenario on PostgreSQL, the Discord cells among them, is a soak
test (``make soak``): the store's verbs are the same on both backends, and the contract tests
hold them to it.
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
from oncewire.lab.suites.gateway import (
    SCENARIOS,
    check_answer,
    crash_point_scenarios,
    run_scenario,
)
from oncewire.lab.suites.gateway_cells import CELLS, STREAMING_PLATFORMS
from oncewire.lab.suites.gateway_verdict import check_asked
from oncewire.testing.fake_platform import ChatView
from tests.conftest import _child_env
from tests.support.pg import server_url

# The whole suite, each scenario starting the fakes and a gateway or two: minutes on a busy host.
pytestmark = [pytest.mark.crash, pytest.mark.timeout(400)]
# Crash points the gateway's path must reach (each scenario then checks the restart).
REACHED = ("commit_before_commit", "send_in_flight", "sent_ack_lost", "edit_ack_lost")

KILLED = -signal.SIGKILL
# The scenarios the default run keeps on PostgreSQL: one per outcome class of the verdict (C1
# exact, C2 one copy, C4 the original and a marked copy), a crash point armed in the process,
# and the crash points the gateway's path must reach.
ON_POSTGRESQL = (
    "completed_not_ledgered",
    "killed_with_send_held",
    "killed_with_send_ack_lost",
    "crash_point_send_in_flight",
    *(f"armed_{point}" for point in REACHED),
)
EVERY = SCENARIOS + crash_point_scenarios()


def soak_only(test: str, params: dict[str, Any]) -> bool:
    """The scenarios beyond :data:`ON_POSTGRESQL` run on PostgreSQL in the soak run only (the
    tests/conftest.py marks them ``slow``); SQLite runs the whole suite through the CLI."""
    return test.endswith("_on_postgresql") and params.get("name") not in ON_POSTGRESQL


def _scenarios(evidence: dict[str, Any], backend: str) -> dict[str, Any]:
    suite = evidence["suites"]["gateway"]
    assert evidence["passed"], json.dumps(suite, indent=1)[:6000]
    scenarios: dict[str, Any] = suite["scenarios"]
    assert set(scenarios) == {f"{s.name}[{backend}]" for s in EVERY}
    for point in REACHED:
        armed = scenarios[f"armed_{point}[{backend}]"]
        assert armed["skipped"] is None, armed["skipped"]
    return scenarios


def _check_processes(name: str, scenario: dict[str, Any]) -> None:
    codes = [p["exit_code"] for p in scenario["processes"]]
    if not name.startswith("plain_message"):
        # The first gateway died from SIGKILL (from outside, or at its armed crash point).
        assert codes[0] == KILLED, (name, codes)
    # Every gateway still running at the end drained to exit 0.
    assert codes[-1] == 0, (name, codes)


def _check_evidence(scenarios: dict[str, Any], backend: str) -> None:
    for name, scenario in scenarios.items():
        if not scenario["skipped"]:
            _check_processes(name, scenario)
    held = scenarios[f"crash_point_send_in_flight[{backend}]"]
    assert held["processes"][0]["armed"] == "replies.send_in_flight"
    ack_lost = scenarios[f"killed_with_send_ack_lost[{backend}]"]["summary"]["visible"]
    assert sorted(marked for _, marked in ack_lost) == [False, True]
    for cell in CELLS:  # each cell ran on the fake of its platform
        platform = {"telegram": "fk_tg", "webhook": "fk_ne", "discord": "fk_dc"}[cell.platform]
        assert scenarios[f"{cell.name}[{backend}]"]["summary"]["platform"] == platform


def test_the_default_run_keeps_one_scenario_per_outcome_class_on_postgresql() -> None:
    """ON_POSTGRESQL names scenarios of the table, and among them C1-C6's three outcome
    classes: a renamed scenario cannot silently leave the default run."""
    assert set(ON_POSTGRESQL) <= {s.name for s in EVERY}
    kept = {c.name for c in CELLS} & set(ON_POSTGRESQL)
    assert sorted(kept) == sorted(
        ["completed_not_ledgered", "killed_with_send_held", "killed_with_send_ack_lost"]
    )


def test_the_streaming_cells_run_on_every_streaming_platform() -> None:
    """C3, C5 and C6, the cells the seed sets on a streaming platform, are one scenario function
    each, on Telegram and on Discord: the table holds each function once per platform."""
    assert STREAMING_PLATFORMS == ("telegram", "discord")
    streaming = [c for c in CELLS if c.platform in STREAMING_PLATFORMS]
    by_run = {c.run: sorted(s.platform for s in streaming if s.run is c.run) for c in streaming}
    assert len(by_run) == 3
    assert all(platforms == ["discord", "telegram"] for platforms in by_run.values())
    assert sorted(c.description.split(":")[0] for c in streaming) == [
        f"{cell} on {name}" for cell in ("C3", "C5", "C6") for name in ("Discord", "Telegram")
    ]


@pytest.mark.parametrize("name", [s.name for s in EVERY])
def test_a_gateway_scenario_passes_on_postgresql(name: str, tmp_path: Path) -> None:
    """One scenario of the lab's table on PostgreSQL, run by the suite's own run_scenario in a
    lab context on the server, judged by the lab's verdict, its schemas dropped after."""
    pytest.importorskip("psycopg")
    (scenario,) = [s for s in EVERY if s.name == name]
    backend = Backend("postgresql", server_url(), run_id=f"gateway-{tmp_path.name[-6:]}")
    ctx = LabContext(tmp_path / "lab", seed=1, backend=backend)
    try:
        result = run_scenario(ctx, scenario).as_dict()
    finally:
        ctx.cleanup()
    assert result["passed"], json.dumps(result, indent=1)[:6000]
    if name.startswith("armed_") and name.removeprefix("armed_") not in REACHED:
        return  # a point the gateway's path may not reach is reported as not applicable
    assert result["skipped"] is None, (name, result["skipped"])
    _check_processes(name, result)
    if name == "crash_point_send_in_flight":
        assert result["processes"][0]["armed"] == "replies.send_in_flight"
    if name == "killed_with_send_ack_lost":
        visible = result["summary"]["visible"]
        assert sorted(marked for _, marked in visible) == [False, True]


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
        asked = ScenarioResult("asked")
        check_asked(asked, rig, resumed=False)
        assert asked.passed, asked.failures
        resumed = ScenarioResult("a resume expected")
        check_asked(resumed, rig, resumed=True)
        assert not resumed.passed
        rig.injected.append("999")  # a message the user sent that the store never admitted
        unadmitted = ScenarioResult("unadmitted")
        check_answer(unadmitted, rig, answer, "exact")
        assert any("the store admitted" in f for f in unadmitted.failures), unadmitted.failures
        rig.injected.pop()
        rig.terminate()
        # A copy of the answer the store never sent (a duplicate send it did not record)...
        journal = rig.platform_dir / "chat.jsonl"
        entries = [json.loads(line) for line in journal.read_text().splitlines()]
        (sent,) = [e for e in entries if e["event"] == "send"]
        with journal.open("a", encoding="utf-8") as out:
            out.write(json.dumps({**sent, "message_id": "77"}) + "\n")
        duplicate = ScenarioResult("duplicate")
        check_answer(duplicate, rig, answer, "marked_dupes")
        assert any("a duplicate send" in f for f in duplicate.failures), duplicate.failures
        # ...and a marker the record gives a send no earlier send of which may have landed.
        with closing(sqlite3.connect(rig.db)) as db, db:
            db.execute("UPDATE oncewire_reply_ops SET marked = 1 WHERE kind = 'send'")
        flagged = ScenarioResult("flagged")
        check_answer(flagged, rig, answer, "marked_dupes")
        assert any("no earlier send of it may have landed" in f for f in flagged.failures)
        assert any("marker decision" in f for f in flagged.failures), flagged.failures


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
    evidence = json.loads(output.read_text(encoding="utf-8")) if output.exists() else {}
    failed = {
        name: {k: scenario[k] for k in ("failures", "summary", "processes")}
        for name, scenario in evidence.get("suites", {})
        .get("gateway", {})
        .get("scenarios", {})
        .items()
        if scenario["failures"]
    }
    assert ran.returncode == 0, ran.stdout + ran.stderr + json.dumps(failed, indent=1)[:20000]
    assert ran.stdout.strip().splitlines()[-1].startswith("PASS: ")
    _check_evidence(_scenarios(evidence, "sqlite"), "sqlite")
    # What the user saw in one kill scenario, read back from the journal the lab kept.
    folder = lab / "gateway" / "killed_while_model_hangs"
    shown = ChatView([folder / "telegram" / "chat.jsonl"]).visible("fk_tg")
    assert [m.text for m in shown] == ["The complete answer, after the restart."]
    with closing(sqlite3.connect(folder / "gateway.db")) as db:
        rows = db.execute("SELECT status, attempts FROM oncewire_inbound").fetchall()
    assert rows == [("delivered", 2)]
