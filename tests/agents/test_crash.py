"""A real child process running a durable Agents SDK run, SIGKILLed at each of the run's crash
points, then started again with the same run_key until it ends. Read from the stores: no model
step was requested twice once recorded, each ticket was opened once (with a receipt, the
attempt after the kill flagged), and the final output is the uninterrupted run's."""

from __future__ import annotations

import json
import signal
import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.crash

CHILD = "import sys\nfrom tests.agents.scenario import main\nsys.exit(main(sys.argv[1:]))"
FINAL = "done after 3 tool results"
POINTS = [
    "agents.step_recorded",
    "agents.tool_accepted",
    "agents.tool_performing",
    "agents.tool_returned",
    "agents.tool_settled",
    "dispatch.after_sink_before_record",
]


def _run(
    python_child: Callable[..., Any], child_env: Callable[..., Any], *args: str, **env: str
) -> tuple[int, str, str]:
    child = python_child(CHILD, *args, env=child_env(**env), cwd=str(Path(__file__).parents[2]))
    out, err = child.communicate(timeout=90)
    return child.returncode, out, err


def _killed_then_resumed(
    folder: Path, db: str, mode: str, point: str, python_child: Any, child_env: Any
) -> str:
    args = ("--folder", str(folder), "--db", db, "--mode", mode)
    code, _, err = _run(
        python_child,
        child_env,
        *args,
        ONCEWIRE_CRASH=point,
        ONCEWIRE_CRASH_TOKEN=str(folder / "token"),
    )
    assert code == -signal.SIGKILL, err
    code, out, err = _run(python_child, child_env, *args)
    assert code == 0, err
    return str(json.loads(out.strip().splitlines()[-1])["final_output"])


def _check(folder: Path) -> None:
    # Each step of the script was asked of the model once, across both processes.
    asked = Counter((folder / "calls.log").read_text().split())
    assert asked == Counter({"0": 1, "2": 1, "3": 1}), asked
    with sqlite3.connect(folder / "receiver.sqlite") as conn:
        tickets = conn.execute(
            "SELECT key, COUNT(*) FROM tickets GROUP BY key ORDER BY key"
        ).fetchall()
        receipts = conn.execute("SELECT key FROM oncewire_receipts ORDER BY key").fetchall()
        attempts = conn.execute("SELECT key, redelivery FROM attempts ORDER BY rowid").fetchall()
    assert tickets == [("agents/run-1/call-1", 1), ("agents/run-1/call-3", 1)]
    assert receipts == [("agents/run-1/call-1",), ("agents/run-1/call-3",)]
    flags: dict[str, list[int]] = {}
    for key, redelivery in attempts:
        flags.setdefault(key, []).append(redelivery)
    # Any attempt after the first of a call is flagged: it followed one that may have acted.
    assert all(set(seen[1:]) <= {1} for seen in flags.values()), flags


@pytest.mark.parametrize("point", POINTS)
def test_a_sync_run_killed_at_each_point_resumes_with_nothing_twice(
    tmp_path: Path, point: str, python_child: Any, child_env: Any
) -> None:
    db = str(tmp_path / "caller.sqlite")
    assert _killed_then_resumed(tmp_path, db, "sync", point, python_child, child_env) == FINAL
    _check(tmp_path)


@pytest.mark.parametrize("mode", ["async", "streamed"])
@pytest.mark.parametrize("point", ["agents.step_recorded", "agents.tool_returned"])
def test_async_and_streamed_runs_killed_resume_on_both_backends(
    tmp_path: Path, db: str, mode: str, point: str, python_child: Any, child_env: Any
) -> None:
    assert _killed_then_resumed(tmp_path, db, mode, point, python_child, child_env) == FINAL
    _check(tmp_path)


def test_a_resumed_streamed_run_shows_each_recorded_step_once_and_complete(
    tmp_path: Path, python_child: Any, child_env: Any
) -> None:
    db = str(tmp_path / "caller.sqlite")
    # Killed after the second step is recorded (the first step's tools done, the third asked).
    point = "agents.step_recorded@2"
    assert _killed_then_resumed(tmp_path, db, "streamed", point, python_child, child_env) == FINAL
    runs = (tmp_path / "events.log").read_text().split("agent_updated_stream_event\n")[1:]
    resumed = runs[-1].split()
    # The two recorded steps come back as one completed response each, never as deltas; the
    # third is streamed live.
    completed = [e for e in resumed if e == "raw_response_event:response.completed"]
    assert len(completed) == 3
    first_live = resumed.index("raw_response_event:response.created")
    assert not any("delta" in e for e in resumed[:first_live])
    assert resumed[:first_live].count("raw_response_event:response.completed") == 2
    assert resumed[-1] == "run_item_stream_event:message_output_created"
