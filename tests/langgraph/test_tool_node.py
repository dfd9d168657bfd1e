"""DurableToolNode in a graph, in this process: what it returns next to ToolNode, and what a
node that runs again for the same checkpoint does (nothing, for the tools that are done).

Every tool writes a row per execution into a receiver store (a Receipts SQLite file of its
own), and the tests count those rows with a separate sqlite3 connection."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest

pytest.importorskip("langgraph.prebuilt", reason="needs the langgraph extra")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import InjectedState, ToolNode
from langgraph.types import Command

import oncewire
from oncewire.dispatch.retry import RetryPolicy
from oncewire.errors import ConfigurationError
from oncewire.langgraph import (
    DurableToolNode,
    ToolCallFailed,
    ToolRefused,
    current_attempt,
    tool_sinks,
)
from oncewire.toolcalls import UNKNOWN_OUTCOME
from tests.langgraph.conftest import ScriptedModel, shown

FAST = RetryPolicy(base_seconds=0.01, cap_seconds=0.05)
CONFIG: Any = {"configurable": {"thread_id": "thread-1"}}


class Receiver:
    """The tools' receiver: a store of its own with one row per tool execution."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.receipts = oncewire.Receipts(str(path), retention_seconds=None)
        with self.receipts.store.transaction() as tx:
            tx.execute(
                "CREATE TABLE executions (id INTEGER PRIMARY KEY, tool TEXT, key TEXT, "
                "redelivery INTEGER)"
            )

    def log(self, name: str) -> None:
        try:
            attempt = current_attempt()
            key, redelivery = attempt.key, int(attempt.redelivery)
        except oncewire.errors.InvalidState:  # the same tool under ToolNode: no attempt
            key, redelivery = "", 0
        with self.receipts.store.transaction() as tx:
            tx.execute(
                "INSERT INTO executions (tool, key, redelivery) VALUES (:t, :k, :r)",
                {"t": name, "k": key, "r": redelivery},
            )

    def executions(self, peek: Callable[..., Any]) -> list[tuple[Any, ...]]:
        return peek(self.path, "SELECT tool, key, redelivery FROM executions ORDER BY id")


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    opened = Receiver(tmp_path / "receiver.db")
    yield opened
    opened.receipts.close()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[oncewire.Ledger]:
    # A real clock: the inline dispatcher's retries are scheduled on it.
    with oncewire.Ledger(str(tmp_path / "app.db")) as opened:
        yield opened


def toolbox(receiver: Receiver) -> list[Any]:
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        receiver.log("add")
        return a + b

    @tool
    def weather(city: str) -> dict[str, str]:
        """The weather in a city."""
        receiver.log("weather")
        return {"city": city, "sky": "clear"}

    @tool(response_format="content_and_artifact")
    def search(query: str) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """Search: content blocks for the model, the hits as an artifact."""
        receiver.log("search")
        return [{"type": "text", "text": f"two hits for {query}"}], {"hits": [1, 2]}

    return [add, weather, search]


CALLS = AIMessage(
    "",
    id="ai-1",
    tool_calls=[
        {"id": "call-1", "name": "add", "args": {"a": 2, "b": 3}},
        {"id": "call-2", "name": "weather", "args": {"city": "Lyon"}},
        {"id": "call-3", "name": "search", "args": {"query": "oncewire"}},
        {"id": "call-4", "name": "teleport", "args": {"to": "Mars"}},
    ],
)
DONE = AIMessage("All answered.", id="ai-2")


def _run(app: Any, mode: str, config: Any = CONFIG) -> dict[str, Any]:
    question = {"messages": [HumanMessage("four calls, please")]}
    if mode == "async":
        return asyncio.run(app.ainvoke(question, config))  # type: ignore[no-any-return]
    return app.invoke(question, config)  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_returns_the_tool_messages_tool_node_returns(
    mode: str, ledger: oncewire.Ledger, receiver: Receiver, build: Callable[..., Any]
) -> None:
    tools = toolbox(receiver)
    upstream = _run(build(ScriptedModel([CALLS, DONE]), ToolNode(tools), InMemorySaver()), mode)
    durable = _run(
        build(ScriptedModel([CALLS, DONE]), DurableToolNode(tools, ledger=ledger), InMemorySaver()),
        mode,
    )
    assert shown(durable["messages"]) == shown(upstream["messages"])
    answers = [m for m in durable["messages"] if isinstance(m, ToolMessage)]
    assert [m.content for m in answers[:2]] == ["5", json.dumps({"city": "Lyon", "sky": "clear"})]
    assert answers[2].artifact == {"hits": [1, 2]}
    assert answers[3].status == "error" and "teleport is not a valid tool" in answers[3].content
    # One effect per known call, keyed by thread, namespace and call id; none for teleport.
    keys = sorted(e.key for e in ledger.effects.list())
    assert keys == [f"langgraph/thread-1//call-{n}" for n in (1, 2, 3)]


def test_a_node_run_again_for_the_same_checkpoint_runs_no_done_tool(
    tmp_path: Path,
    ledger: oncewire.Ledger,
    receiver: Receiver,
    build: Callable[..., Any],
    saver: Any,
    peek: Callable[..., Any],
) -> None:
    node = DurableToolNode(toolbox(receiver), ledger=ledger)
    app = build(ScriptedModel([CALLS, DONE]), node, saver)
    first = _run(app, "sync")
    assert len(receiver.executions(peek)) == 3
    # Replay from the checkpoint where the tools were next: LangGraph runs the node again.
    before_tools = next(s for s in app.get_state_history(CONFIG) if s.next == ("tools",))
    replayed = app.invoke(None, before_tools.config)
    # And a new node on the same ledger (another process, say), replaying once more.
    other = build(
        ScriptedModel([CALLS, DONE]), DurableToolNode(toolbox(receiver), ledger=ledger), saver
    )
    again = other.invoke(None, before_tools.config)
    assert sorted(receiver.executions(peek)) == [
        ("add", "langgraph/thread-1//call-1", 0),
        ("search", "langgraph/thread-1//call-3", 0),
        ("weather", "langgraph/thread-1//call-2", 0),
    ], "a done tool ran again"
    assert shown(replayed["messages"][2:6]) == shown(first["messages"][2:6])
    assert shown(again["messages"][2:6]) == shown(first["messages"][2:6])
    assert peek(tmp_path / "app.db", "SELECT COUNT(*) FROM oncewire_attempts") == [(3,)]


def test_a_tool_that_keeps_raising_is_retried_flagged_then_told_outcome_unknown(
    ledger: oncewire.Ledger, receiver: Receiver, build: Callable[..., Any], peek: Any
) -> None:
    @tool
    def charge(amount: int) -> str:
        """Charge a card."""
        receiver.log("charge")
        raise ConnectionError("the payment provider hung up")

    call = AIMessage(
        "", id="ai-1", tool_calls=[{"id": "c1", "name": "charge", "args": {"amount": 5}}]
    )
    node = DurableToolNode([charge], ledger=ledger, max_attempts=2, retry=FAST)
    final = _run(build(ScriptedModel([call, DONE]), node, InMemorySaver()), "sync")
    answer = final["messages"][2]
    assert answer.status == "error" and answer.content.startswith(UNKNOWN_OUTCOME)
    assert "the payment provider hung up" in answer.content
    assert [row[2] for row in receiver.executions(peek)] == [0, 1], "the retry was not flagged"
    assert ledger.effects.get("langgraph/thread-1//c1").state == "dead"


def test_refused_calls_and_bad_arguments_never_run_the_tool_body(
    ledger: oncewire.Ledger, receiver: Receiver, build: Callable[..., Any], peek: Any
) -> None:
    @tool
    def refund(amount: int) -> str:
        """Refund an amount."""
        if amount > 100:
            raise ToolRefused("refunds over 100 need a human")
        receiver.log("refund")
        return "refunded"

    call = AIMessage(
        "",
        id="ai-1",
        tool_calls=[
            {"id": "c1", "name": "refund", "args": {"amount": 500}},
            {"id": "c2", "name": "refund", "args": {"amount": "lots"}},
            {"id": "c3", "name": "refund", "args": {"amount": 5}},
        ],
    )
    node = DurableToolNode([refund], ledger=ledger, retry=FAST)
    final = _run(build(ScriptedModel([call, DONE]), node, InMemorySaver()), "sync")
    refused, invalid, done = final["messages"][2:5]
    assert refused.content == "error: the tool refused the call: refunds over 100 need a human"
    assert invalid.status == "error" and "Error invoking tool 'refund'" in invalid.content
    assert done.content == "refunded"
    assert len(receiver.executions(peek)) == 1
    states = {e.key[-2:]: str(e.state) for e in ledger.effects.list()}
    assert states == {"c1": "rejected", "c2": "rejected", "c3": "done"}


def test_handle_tool_errors_false_raises_and_other_forms_are_refused(
    ledger: oncewire.Ledger, build: Callable[..., Any]
) -> None:
    @tool
    def refuse(x: int) -> str:
        """Always refuses."""
        raise ToolRefused("no")

    with pytest.raises(ConfigurationError, match="handle_tool_errors is True or False"):
        DurableToolNode([refuse], ledger=ledger, handle_tool_errors="sorry")  # type: ignore[arg-type]
    call = AIMessage("", id="ai-1", tool_calls=[{"id": "c1", "name": "refuse", "args": {"x": 1}}])
    node = DurableToolNode([refuse], ledger=ledger, handle_tool_errors=False)
    with pytest.raises(ToolCallFailed, match="the tool refused the call: no"):
        _run(build(ScriptedModel([call, DONE]), node, InMemorySaver()), "sync")


def test_a_command_and_injected_state_come_back_as_tool_node_gives_them(
    ledger: oncewire.Ledger, receiver: Receiver, build: Callable[..., Any]
) -> None:
    @tool
    def count(state: Annotated[dict[str, Any], InjectedState]) -> str:
        """How many messages the thread holds."""
        return str(len(state["messages"]))

    @tool
    def handoff(note: str) -> Command[Any]:
        """Hand the conversation on, with a note."""
        receiver.log("handoff")
        message = ToolMessage(f"handed off: {note}", tool_call_id="c2")
        return Command(update={"messages": [message]})

    call = AIMessage(
        "",
        id="ai-1",
        tool_calls=[
            {"id": "c1", "name": "count", "args": {}},
            {"id": "c2", "name": "handoff", "args": {"note": "urgent"}},
        ],
    )
    upstream = _run(
        build(ScriptedModel([call, DONE]), ToolNode([count, handoff]), InMemorySaver()), "sync"
    )
    node = DurableToolNode([count, handoff], ledger=ledger)
    durable = _run(build(ScriptedModel([call, DONE]), node, InMemorySaver()), "sync")
    assert shown(durable["messages"]) == shown(upstream["messages"])
    assert [m.content for m in durable["messages"][2:4]] == ["2", "handed off: urgent"]


def test_workers_run_the_calls_when_the_node_only_accepts_them(
    ledger: oncewire.Ledger, receiver: Receiver, build: Callable[..., Any]
) -> None:
    tools = toolbox(receiver)
    worker = oncewire.Dispatcher(ledger, tool_sinks(tools), poll_seconds=0.05)
    running = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    running.start()
    try:
        node = DurableToolNode(tools, ledger=ledger, dispatch="workers", wait_seconds=30)
        durable = _run(build(ScriptedModel([CALLS, DONE]), node, InMemorySaver()), "sync")
    finally:
        worker.stop()
        running.join()
    upstream = _run(build(ScriptedModel([CALLS, DONE]), ToolNode(tools), InMemorySaver()), "sync")
    assert shown(durable["messages"]) == shown(upstream["messages"])
    assert worker.stats.done == 3


def test_a_graph_without_a_thread_id_is_refused_before_any_tool_runs(
    ledger: oncewire.Ledger, receiver: Receiver, peek: Any, build: Callable[..., Any]
) -> None:
    node = DurableToolNode(toolbox(receiver), ledger=ledger)
    app = build(ScriptedModel([CALLS, DONE]), node, None)
    with pytest.raises(ConfigurationError, match="thread_id"):
        app.invoke({"messages": [HumanMessage("hi")]})
    assert receiver.executions(peek) == [] and ledger.effects.list() == []


def test_current_attempt_outside_a_durable_tool_says_so() -> None:
    with pytest.raises(oncewire.errors.InvalidState, match="outside a durable tool"):
        current_attempt()
    assert os.environ.get("ONCEWIRE_CRASH") is None
