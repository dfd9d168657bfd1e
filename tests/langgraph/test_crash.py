"""A real graph process SIGKILLed inside a tool, then started again on the same files.

The child is the lab's (``oncewire.lab.children.langgraph``): an agent with a scripted model
whose ``open_ticket`` tool writes a ticket into a receiver store; it is killed by a crash point
armed in its environment, just after the first ticket is committed and before the tool
returns. The stores are read with sqlite3 afterwards.

The comparison (LangGraph issues #7417 and #7213): LangGraph's ``ToolNode`` on its own
``SqliteSaver``, killed there and resumed, performs that tool twice, and nothing marks the
second ticket as a repeat. It is shown on purpose, as the negative control of the same harness
in which ``DurableToolNode`` performs it once, with a receipt, the second attempt flagged.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.prebuilt", reason="needs the langgraph extra")
pytest.importorskip("langgraph.checkpoint.sqlite", reason="needs langgraph-checkpoint-sqlite")

pytestmark = pytest.mark.crash

CHILD = "import sys\nfrom oncewire.lab.children.langgraph import main\nsys.exit(main(sys.argv[1:]))"
POINT = "lab.langgraph.ticket_written"


def _run(
    python_child: Callable[..., Any], child_env: Callable[..., Any], *args: str, **env: str
) -> tuple[int, str]:
    child = python_child(CHILD, *args, env=child_env(**env))
    _, err = child.communicate(timeout=60)
    return child.returncode, err


def _graph_killed_then_resumed(
    folder: Path, mode: str, python_child: Callable[..., Any], child_env: Callable[..., Any]
) -> None:
    folder.mkdir()
    assert _run(python_child, child_env, "init", "--folder", str(folder))[0] == 0
    args = ("run", "--folder", str(folder), "--mode", mode)
    code, err = _run(
        python_child,
        child_env,
        *args,
        ONCEWIRE_CRASH=POINT,
        ONCEWIRE_CRASH_TOKEN=str(folder / "token"),
    )
    assert code == -signal.SIGKILL, err
    code, err = _run(python_child, child_env, *args)
    assert code == 0, err


def test_a_tool_killed_after_acting_runs_again_once_flagged_and_lands_once(
    tmp_path: Path, python_child: Any, child_env: Any, peek: Any
) -> None:
    folder = tmp_path / "durable"
    _graph_killed_then_resumed(folder, "durable", python_child, child_env)
    downstream = folder / "downstream.sqlite"
    tickets = peek(downstream, "SELECT tool_call_id, COUNT(*) FROM tickets GROUP BY tool_call_id")
    assert sorted(tickets) == [("call-1", 1), ("call-2", 1), ("call-4", 1)]
    # The killed tool ran twice: killed after its write, then a flagged redelivery whose
    # write the receipt replayed. (The message's tools run side by side: which of them the
    # kill caught first varies.)
    rows = peek(downstream, "SELECT tool_call_id, redelivery FROM tool_attempts ORDER BY id")
    attempts: dict[str, list[int]] = {}
    for call, redelivery in rows:
        attempts.setdefault(call, []).append(redelivery)
    assert [0, 1] in [attempts[call] for call in ("call-1", "call-2")], attempts
    receipts = peek(downstream, "SELECT key FROM oncewire_receipts ORDER BY key")
    assert receipts == [(f"langgraph/lab-thread-1//call-{n}",) for n in (1, 2, 4)]
    effects = peek(folder / "caller.sqlite", "SELECT key, state FROM oncewire_effects ORDER BY key")
    assert effects == [(f"langgraph/lab-thread-1//call-{n}", "done") for n in (1, 2, 3, 4)]
    # Every later attempt of any call carries the flag (a call in flight at the kill may
    # have run: it is flagged whether or not it had).
    assert all(set(flags[1:]) <= {1} for flags in attempts.values()), attempts


def test_upstream_tool_node_performs_the_killed_tool_twice_where_the_durable_node_does_once(
    tmp_path: Path, python_child: Any, child_env: Any, peek: Any
) -> None:
    per_call = "SELECT tool_call_id, COUNT(*), SUM(redelivery) FROM tickets GROUP BY tool_call_id"
    _graph_killed_then_resumed(tmp_path / "plain", "plain", python_child, child_env)
    upstream = dict(
        (c, (n, flagged))
        for c, n, flagged in peek(tmp_path / "plain" / "downstream.sqlite", per_call)
    )
    # The negative control: the killed call's ticket twice, and neither copy says it is one.
    # (The message's two ticket calls run side by side: the kill catches one of them written,
    # sometimes both, and then both are performed twice.)
    assert set(upstream) == {"call-1", "call-2", "call-4"}
    assert (2, 0) in (upstream["call-1"], upstream["call-2"]), upstream
    assert all(flagged == 0 for _, flagged in upstream.values()), upstream
    assert upstream["call-4"] == (1, 0)

    _graph_killed_then_resumed(tmp_path / "durable", "durable", python_child, child_env)
    durable = {c: n for c, n, _ in peek(tmp_path / "durable" / "downstream.sqlite", per_call)}
    assert durable == {"call-1": 1, "call-2": 1, "call-4": 1}
    receipts = peek(
        tmp_path / "durable" / "downstream.sqlite", "SELECT COUNT(*) FROM oncewire_receipts"
    )
    assert receipts == [(3,)]
