"""``DurableToolNode(dispatch="workers")`` served by real ``oncewire dispatch`` processes: the
worker is SIGKILLed inside a tool (after the tool wrote its ticket, before the outcome was
recorded) and a new worker takes over. The graph, waiting in this process, gets the tool's
answer; the ticket exists once, and the second attempt was flagged. Stores read directly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.prebuilt", reason="needs the langgraph extra")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

import oncewire
from oncewire.langgraph import DurableToolNode
from tests.langgraph.conftest import Raw, ScriptedModel, agent
from tests.langgraph.worker_tools import TOOLS, create_tables

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
THREAD = "w-thread"
CALLS = AIMessage(
    "",
    id="ai-1",
    tool_calls=[
        {"id": "call-1", "name": "open_ticket", "args": {"title": "printer on fire"}},
        {"id": "call-2", "name": "add", "args": {"a": 2, "b": 3}},
    ],
)
DONE = AIMessage("Opened it; 5.", id="ai-2")


class Workers:
    """``oncewire dispatch`` processes on one store; any left running are killed at the end."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.started: list[subprocess.Popen[str]] = []

    def start(self) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
        env.update(LG_RECEIVER=self.db, PYTHONUNBUFFERED="1")
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "oncewire",
                "dispatch",
                "--db",
                self.db,
                "--app",
                "tests.langgraph.worker_tools:sinks",
                "--poll-seconds",
                "0.05",
                "--status-every",
                "0",
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(worker)
        return worker

    def stop_all(self) -> None:
        for worker in self.started:
            if worker.poll() is None:
                worker.terminate()
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
            worker.communicate()


@pytest.fixture
def workers(db_url: str, raw: Raw) -> Iterator[Workers]:
    create_tables(db_url)
    started = Workers(db_url)
    yield started
    started.stop_all()


def _until(what: str, check: Any, seconds: float = 60.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"waited {seconds:g}s for {what}")


def test_a_worker_killed_inside_a_tool_is_replaced_and_the_tool_lands_once(
    db_url: str, raw: Raw, workers: Workers
) -> None:
    first = workers.start()
    outcome: dict[str, Any] = {}
    with oncewire.Ledger(db_url) as ledger:
        node = DurableToolNode(TOOLS, ledger=ledger, dispatch="workers", wait_seconds=120)
        app = agent(ScriptedModel([CALLS, DONE]), node, InMemorySaver())

        def run() -> None:
            try:
                question = {"messages": [HumanMessage("a ticket and a sum")]}
                outcome["final"] = app.invoke(question, {"configurable": {"thread_id": THREAD}})
            except BaseException as exc:  # handed to the test's thread
                outcome["error"] = exc

        graph = threading.Thread(target=run)
        graph.start()
        try:
            # The first worker is inside open_ticket, its ticket written: kill it there.
            _until("the ticket", lambda: raw.query("SELECT pid FROM tickets"))
            assert raw.query("SELECT pid FROM tickets") == [(first.pid,)]
            first.send_signal(signal.SIGKILL)
            assert first.wait(timeout=30) == -signal.SIGKILL
            assert graph.is_alive(), "the graph did not wait for the killed worker's tool"
            second = workers.start()
            graph.join(timeout=120)
        finally:
            if graph.is_alive():
                workers.stop_all()
                graph.join(timeout=150)
    assert "error" not in outcome, outcome.get("error")
    answers = [m for m in outcome["final"]["messages"] if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.content, m.status) for m in answers] == [
        ("call-1", '{"ticket": "printer on fire"}', "success"),
        ("call-2", "5", "success"),
    ]
    assert outcome["final"]["messages"][-1].content == "Opened it; 5."

    key = f"langgraph/{THREAD}//call-1"
    assert raw.query("SELECT call, pid FROM tickets") == [(key, first.pid)]
    assert raw.query("SELECT key FROM oncewire_receipts") == [(key,)]
    tried = raw.query(
        "SELECT number, redelivery, pid FROM tool_attempts WHERE call = 'open_ticket' ORDER BY id"
    )
    assert [(r[1], r[2]) for r in tried] == [(0, first.pid), (1, second.pid)], tried
    added = raw.query("SELECT redelivery, pid FROM tool_attempts WHERE call = 'add' ORDER BY id")
    assert added and all(flag == 1 for flag, _ in added[1:]), added
    assert added[-1][1] == second.pid or len(added) == 1, added
    effects = raw.query("SELECT key, state FROM oncewire_effects ORDER BY key")
    assert effects == [(key, "done"), (f"langgraph/{THREAD}//call-2", "done")]
    # The killed worker's attempt is in the history, left uncertain, then the flagged one done.
    history = raw.query(
        "SELECT a.redelivery, a.state FROM oncewire_attempts a "
        "JOIN oncewire_effects e ON e.id = a.effect_id WHERE e.key = ? ORDER BY a.attempt",
        [key],
    )
    assert history[-1] == (1, "done"), history
