"""The langgraph suite's child process: ``python -m oncewire.lab.children.langgraph run ...``.

One scenario's folder holds three SQLite files: ``checkpoints.sqlite`` (the graph's
checkpoints, :func:`checkpointer`), ``caller.sqlite`` (the ledger holding the tool calls'
effects) and ``downstream.sqlite`` (the receiver: ``tickets``, ``tool_attempts`` and, in the
durable mode, receipts). ``run`` runs the graph of :func:`build_graph` for one thread until it
is done: from its input on the first run, from its last checkpoint on every later one (what a
process started again after a crash does). It prints one JSON object.

The graph is an agent with a scripted model (no network): its first answer calls
``open_ticket`` twice and ``add`` once, its second ``open_ticket`` once more, its third is
text. ``--mode durable`` runs the tools in a :class:`~oncewire.langgraph.DurableToolNode`;
each ``open_ticket`` writes its ticket through ``Receipts.run_once`` keyed by
``current_attempt().key``. ``--mode plain`` runs them in LangGraph's own ``ToolNode`` and
writes the ticket directly: nothing there can tell a second run of a call from the first.
Every tool attempt is logged in ``tool_attempts`` (tool call id, attempt number, redelivery
flag, pid) before the tool acts, in a transaction of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from oncewire.core import crash

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.graph.state import CompiledStateGraph

__all__ = ["SCRIPT", "THREAD", "build_graph", "checkpointer", "final_messages", "main"]

MODULE = "oncewire.lab.children.langgraph"
THREAD = "lab-thread-1"
QUESTION = "Two tickets, one sum, then a follow-up."

# The help desk's answer takes a moment: a kill from outside lands inside a tool more often.
TICKET_LATENCY_SECONDS = 0.1
TICKET_WRITTEN = crash.register(
    "lab.langgraph.ticket_written",
    "the lab's open_ticket tool committed its ticket in the receiver; it has not returned",
)

# The scripted model: its n-th answer (n counts the AI messages so far).
SCRIPT: list[dict[str, Any]] = [
    {
        "id": "ai-1",
        "content": "",
        "tool_calls": [
            {"id": "call-1", "name": "open_ticket", "args": {"title": "printer on fire"}},
            {"id": "call-2", "name": "open_ticket", "args": {"title": "coffee machine empty"}},
            {"id": "call-3", "name": "add", "args": {"a": 2, "b": 3}},
        ],
    },
    {
        "id": "ai-2",
        "content": "",
        "tool_calls": [
            {"id": "call-4", "name": "open_ticket", "args": {"title": "follow up on both"}},
        ],
    },
    {"id": "ai-3", "content": "Opened three tickets; 2 + 3 = 5.", "tool_calls": []},
]
TOOL_CALLS = [call for answer in SCRIPT for call in answer["tool_calls"]]
TICKET_CALLS = [call["id"] for call in TOOL_CALLS if call["name"] == "open_ticket"]


def checkpointer(path: Path) -> BaseCheckpointSaver[Any]:
    """The graph's checkpointer: LangGraph's own SQLite saver on ``path``. The one place to
    change when the durable scenario moves to another saver."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    return SqliteSaver(sqlite3.connect(str(path), check_same_thread=False))


def initialise(folder: Path) -> None:
    """The receiver's tables (its receipts come with ``Receipts``) and an empty ledger."""
    from oncewire.ledger import Ledger
    from oncewire.receipts import Receipts

    with Ledger(str(folder / "caller.sqlite")):
        pass
    with (
        Receipts(str(folder / "downstream.sqlite"), retention_seconds=None) as receipts,
        receipts.store.transaction() as tx,
    ):
        tx.execute(
            "CREATE TABLE tickets (id INTEGER PRIMARY KEY, tool_call_id TEXT NOT NULL, "
            "title TEXT NOT NULL, redelivery INTEGER NOT NULL, pid INTEGER NOT NULL)"
        )
        tx.execute(
            "CREATE TABLE tool_attempts (id INTEGER PRIMARY KEY, tool_call_id TEXT NOT NULL, "
            "tool TEXT NOT NULL, number INTEGER NOT NULL, redelivery INTEGER NOT NULL, "
            "pid INTEGER NOT NULL)"
        )


def _model(state: Any) -> dict[str, Any]:
    from langchain_core.messages import AIMessage

    answered = sum(1 for message in state["messages"] if isinstance(message, AIMessage))
    answer = SCRIPT[min(answered, len(SCRIPT) - 1)]
    return {"messages": [AIMessage(**answer)]}


def _tools(folder: Path, durable: bool) -> list[Any]:
    from langchain_core.tools import InjectedToolCallId, tool

    from oncewire.langgraph.attempt import current_attempt
    from oncewire.receipts import Receipts

    receipts = Receipts(str(folder / "downstream.sqlite"), retention_seconds=None)

    def log_attempt(tool_call_id: str, name: str) -> tuple[str, bool]:
        """(the key the receiver deduplicates by, whether this attempt is a redelivery)."""
        number, redelivery, key = 1, False, tool_call_id
        if durable:
            attempt = current_attempt()
            number, redelivery, key = attempt.number, attempt.redelivery, attempt.key
        with receipts.store.transaction() as tx:
            tx.execute(
                "INSERT INTO tool_attempts (tool_call_id, tool, number, redelivery, pid) "
                "VALUES (:call, :tool, :number, :redelivery, :pid)",
                {
                    "call": tool_call_id,
                    "tool": name,
                    "number": number,
                    "redelivery": int(redelivery),
                    "pid": os.getpid(),
                },
            )
        return key, redelivery

    def insert(tx: Any, tool_call_id: str, title: str, redelivery: bool) -> dict[str, Any]:
        # The answer names the call, not the row id: the tools of one message run side by
        # side, so ids come in any order, and the lab compares the final state with a run's.
        tx.execute(
            "INSERT INTO tickets (tool_call_id, title, redelivery, pid) "
            "VALUES (:call, :title, :redelivery, :pid)",
            {
                "call": tool_call_id,
                "title": title,
                "redelivery": int(redelivery),
                "pid": os.getpid(),
            },
        )
        return {"ticket": tool_call_id, "title": title}

    # The annotations as objects, not the strings this module's annotations are: LangChain
    # reads them to find the injected call id, and the names are local to this function.
    call_id = Annotated[str, InjectedToolCallId]

    def open_ticket(title: str, tool_call_id: str) -> str:
        """Open a ticket in the help desk."""
        key, redelivery = log_attempt(tool_call_id, "open_ticket")
        if durable:
            answer = receipts.run_once(
                key, {"title": title}, lambda tx: insert(tx, tool_call_id, title, redelivery)
            ).result
        else:
            with receipts.store.transaction() as tx:
                answer = insert(tx, tool_call_id, title, redelivery)
        TICKET_WRITTEN.hit()
        time.sleep(TICKET_LATENCY_SECONDS)
        return json.dumps(answer, sort_keys=True)

    def add(a: int, b: int, tool_call_id: str) -> int:
        """Add two numbers."""
        log_attempt(tool_call_id, "add")
        return a + b

    open_ticket.__annotations__ = {"title": str, "tool_call_id": call_id, "return": str}
    add.__annotations__ = {"a": int, "b": int, "tool_call_id": call_id, "return": int}
    return [tool(open_ticket), tool(add)]


def build_graph(folder: Path, mode: str) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The agent graph of one scenario folder, ``mode`` ``durable`` or ``plain``."""
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    durable = mode == "durable"
    tools = _tools(folder, durable)
    node: Any
    if durable:
        from oncewire.dispatch.retry import RetryPolicy
        from oncewire.langgraph.tools import DurableToolNode

        node = DurableToolNode(
            tools,
            ledger=str(folder / "caller.sqlite"),
            retry=RetryPolicy(base_seconds=0.02, cap_seconds=0.25),
        )
    else:
        node = ToolNode(tools)
    graph = StateGraph(MessagesState)
    graph.add_node("model", _model)
    graph.add_node("tools", node)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer(folder / "checkpoints.sqlite"))


def final_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """A thread's messages as what they say, without the ids LangGraph assigns at random."""
    shown = []
    for message in messages:
        item: dict[str, Any] = {"type": message.type, "content": message.content}
        for name in ("tool_call_id", "name", "status"):
            if getattr(message, name, None) is not None:
                item[name] = getattr(message, name)
        calls = getattr(message, "tool_calls", None)
        if calls:
            item["tool_calls"] = [(c["id"], c["name"], c["args"]) for c in calls]
        shown.append(item)
    return shown


def run(folder: Path, mode: str) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage

    app = build_graph(folder, mode)
    config: Any = {"configurable": {"thread_id": THREAD}}
    started = bool(app.get_state(config).values)
    # Resume from the last checkpoint whatever it says: after a crash, a step whose writes
    # were saved shows no ``next`` although the steps after it have not run.
    app.invoke(None if started else {"messages": [HumanMessage(QUESTION)]}, config)
    state = app.get_state(config)
    return {
        "pid": os.getpid(),
        "resumed": started,
        "done": not state.tasks,
        "messages": len(state.values.get("messages", [])),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=MODULE)
    parser.add_argument("role", choices=["init", "run"])
    parser.add_argument("--folder", required=True, type=Path)
    parser.add_argument("--mode", choices=["durable", "plain"], default="durable")
    args = parser.parse_args(argv)
    if crash.armed():
        import oncewire.dispatch.dispatcher
        import oncewire.effects.outbox
        import oncewire.langgraph.tools
        import oncewire.receipts  # noqa: F401  (they declare the points the suite arms)

        crash.check_armed()
    if args.role == "init":
        initialise(args.folder)
        answer: dict[str, Any] = {"initialised": str(args.folder)}
    else:
        answer = run(args.folder, args.mode)
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
