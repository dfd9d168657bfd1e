"""The inline dispatcher a DurableToolNode keeps: started at its first step, reused by the
next, stopped by ``close()``, replaced in a forked child, and lending a call to the node that
accepted it. The tools log each execution in a receiver file read back with sqlite3."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest

pytest.importorskip("langgraph.prebuilt", reason="needs the langgraph extra")

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import InjectedState

import oncewire
from oncewire.langgraph import DurableToolNode, current_attempt
from tests.integration.test_fork import in_child
from tests.langgraph.conftest import ScriptedModel, agent


class Log:
    """One row per tool execution, in a SQLite file of its own."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE runs (who TEXT, key TEXT, redelivery INTEGER, seen TEXT)")

    def write(self, who: str, seen: str = "") -> None:
        attempt = current_attempt()
        with sqlite3.connect(self.path, timeout=10) as db:
            db.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?)",
                (who, attempt.key, int(attempt.redelivery), seen),
            )

    def rows(self) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.path) as db:
            return [tuple(r) for r in db.execute("SELECT * FROM runs ORDER BY rowid")]


@pytest.fixture
def log(tmp_path: Path) -> Log:
    return Log(tmp_path / "runs.sqlite")


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[oncewire.Ledger]:
    with oncewire.Ledger(str(tmp_path / "app.db")) as opened:
        yield opened


def adder(log: Log, who: str) -> Any:
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        log.write(who)
        return a + b

    return add


def one_call(call_id: str = "c1", name: str = "add", args: Any = None) -> list[AIMessage]:
    call = {"id": call_id, "name": name, "args": {"a": 1, "b": 2} if args is None else args}
    return [AIMessage("", id="ai-1", tool_calls=[call]), AIMessage("done", id="ai-2")]


def _ask(app: Any, thread: str) -> dict[str, Any]:
    config: Any = {"configurable": {"thread_id": thread}}
    return app.invoke({"messages": [HumanMessage("add, please")]}, config)  # type: ignore[no-any-return]


def _dispatch_threads(node: DurableToolNode) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"oncewire-{node.name}" and t.is_alive()]


def test_one_dispatcher_serves_every_step_until_the_node_is_closed(
    ledger: oncewire.Ledger, log: Log
) -> None:
    node = DurableToolNode([adder(log, "node")], ledger=ledger, name="kept")
    try:
        assert _dispatch_threads(node) == []  # nothing started before a step needs it
        app = agent(ScriptedModel(one_call()), node, InMemorySaver())
        _ask(app, "t1")
        (first,) = _dispatch_threads(node)
        _ask(app, "t2")
        _ask(app, "t3")
        assert _dispatch_threads(node) == [first], "a step started a dispatcher of its own"
        node.close()
        first.join(timeout=10)
        assert not first.is_alive() and _dispatch_threads(node) == []
        _ask(app, "t4")  # a step after close starts it again
        assert len(_dispatch_threads(node)) == 1
    finally:
        node.close()
    assert _dispatch_threads(node) == []
    assert log.rows() == [("node", f"langgraph/t{n}//c1", 0, "") for n in (1, 2, 3, 4)]
    states = {(e.key, str(e.state)) for e in ledger.effects.list()}
    assert states == {(f"langgraph/t{n}//c1", "done") for n in (1, 2, 3, 4)}


def test_a_forked_child_runs_its_steps_with_a_dispatcher_of_its_own(
    ledger: oncewire.Ledger, log: Log
) -> None:
    node = DurableToolNode([adder(log, "node")], ledger=ledger, name="forked")
    app = agent(ScriptedModel(one_call()), node, InMemorySaver())
    try:
        _ask(app, "parent-1")  # the parent's dispatcher runs: the child does not inherit it

        def child() -> dict[str, Any]:
            final = _ask(app, "child")
            answer = {"answer": final["messages"][2].content, "threads": _dispatch_threads(node)}
            node.close()
            return {"answer": answer["answer"], "threads": len(answer["threads"])}

        assert in_child(child) == {"answer": "3", "threads": 1}
        _ask(app, "parent-2")  # and the parent's goes on serving the parent
    finally:
        node.close()
    assert sorted(log.rows()) == [
        ("node", f"langgraph/{thread}//c1", 0, "") for thread in ("child", "parent-1", "parent-2")
    ]
    assert {str(e.state) for e in ledger.effects.list()} == {"done"}


def test_a_call_claimed_by_another_nodes_dispatcher_runs_with_the_tool_that_accepted_it(
    ledger: oncewire.Ledger, log: Log
) -> None:
    # Two nodes of one process on one ledger, tools of the same name: only the first node's
    # dispatcher runs (the second leaves its calls to workers), so it claims the second's
    # call, and runs it with the second node's tool and graph state.
    def counter(who: str) -> Any:
        @tool
        def count(state: Annotated[dict[str, Any], InjectedState]) -> str:
            """How many messages the thread holds."""
            log.write(who, seen=str(len(state["messages"])))
            return f"{who}: {len(state['messages'])}"

        return count

    first = DurableToolNode([counter("first")], ledger=ledger, name="first")
    second = DurableToolNode(
        [counter("second")], ledger=ledger, name="second", dispatch="workers", wait_seconds=30
    )
    script = one_call(name="count", args={})
    try:
        _ask(agent(ScriptedModel(script), first, InMemorySaver()), "a")
        final = _ask(agent(ScriptedModel(script), second, InMemorySaver()), "b")
    finally:
        first.close()
    assert final["messages"][2].content == "second: 2"
    assert log.rows() == [
        ("first", "langgraph/a//c1", 0, "2"),
        ("second", "langgraph/b//c1", 0, "2"),
    ]
