"""The tool-node figures of ``langgraph_bench.py``: DurableToolNode against ToolNode, one run.

An agent graph (a scripted model, then the tools, then the model's final answer) run on a new
thread each time, with one tool call in the model's message and with five; the tool adds two
numbers. Both nodes run under the same checkpointer (LangGraph's ``InMemorySaver``, so that
the figure is the node's own cost); DurableToolNode's ledger is a SQLite file (and a
PostgreSQL schema with ``--pg``), its tools performed by its inline dispatcher. The runs of
the two nodes alternate, so a busy machine slows both alike; each round reports the median
milliseconds per graph run and their ratio (DurableToolNode / ToolNode: how many times slower
the durable node is; 1.0x would cost nothing). Timings are reported, never asserted.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from oncewire.langgraph import DurableToolNode
from oncewire.ledger import Ledger

__all__ = ["CALLS", "measure_tools", "tool_rows"]

CALLS = (1, 5)  # tool calls in the model's message
RUNS = 60  # graph runs per node, per figure and round


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _model(calls: int) -> Callable[[Any], dict[str, Any]]:
    asking = [{"id": f"call-{i}", "name": "add", "args": {"a": i, "b": 1}} for i in range(calls)]

    def model(state: Any) -> dict[str, Any]:
        answered = any(isinstance(m, AIMessage) for m in state["messages"])
        answer = AIMessage("done") if answered else AIMessage("", tool_calls=asking)
        return {"messages": [answer]}

    return model


def _graph(node: Any, calls: int) -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("model", _model(calls))
    graph.add_node("tools", node)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=InMemorySaver())


def _one_run(app: Any) -> float:
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    started = time.perf_counter()
    app.invoke({"messages": [HumanMessage("add, please")]}, config)
    return (time.perf_counter() - started) * 1000


def _figure(ledger: Ledger, calls: int, runs: int) -> dict[str, float]:
    node = DurableToolNode([add], ledger=ledger)
    try:
        plain, durable = _graph(ToolNode([add]), calls), _graph(node, calls)
        for _ in range(3):  # warm up: imports, the dispatcher's first start, the file's pages
            _one_run(plain), _one_run(durable)
        got: dict[str, list[float]] = {"plain": [], "durable": []}
        for _ in range(runs):
            got["plain"].append(_one_run(plain))
            got["durable"].append(_one_run(durable))
    finally:
        close = getattr(node, "close", None)  # None before the node kept its dispatcher
        if close is not None:
            close()
    plain_ms, durable_ms = statistics.median(got["plain"]), statistics.median(got["durable"])
    return {"toolnode_ms": plain_ms, "durable_ms": durable_ms, "ratio": durable_ms / plain_ms}


@contextlib.contextmanager
def _sqlite(folder: Path) -> Iterator[Ledger]:
    with Ledger(str(folder / f"tools-{uuid.uuid4().hex[:8]}.db")) as ledger:
        yield ledger


def measure_tools(
    backend: str,
    opener: Callable[[Path], contextlib.AbstractContextManager[Ledger]] | None,
    folder: Path,
    rounds: int,
    scale: float,
) -> dict[str, Any]:
    """The tool-node figures on one backend (``opener`` gives a fresh ledger; None: SQLite)."""
    opener = opener or _sqlite
    runs = max(10, int(RUNS * scale))
    per: dict[str, list[dict[str, float]]] = {f"{n}_tool_calls": [] for n in CALLS}
    for r in range(rounds):
        for calls in CALLS:
            with opener(folder) as ledger:
                figure = _figure(ledger, calls, runs)
            per[f"{calls}_tool_calls"].append(figure)
            print(
                f"[tools {backend} round {r + 1}/{rounds}] {calls} call(s): ToolNode "
                f"{figure['toolnode_ms']:.1f} ms, DurableToolNode {figure['durable_ms']:.1f} ms "
                f"({figure['ratio']:.2f}x)",
                file=sys.stderr,
                flush=True,
            )
    return {
        "backend": backend,
        "saver": "InMemorySaver (both nodes)",
        "runs_per_round": runs,
        "figures": {
            name: {
                "toolnode_ms": statistics.median(f["toolnode_ms"] for f in figures),
                "durable_ms": statistics.median(f["durable_ms"] for f in figures),
                "ratio": statistics.median(f["ratio"] for f in figures),
                "ratios": [f["ratio"] for f in figures],
            }
            for name, figures in per.items()
        },
    }


def tool_rows(results: list[dict[str, Any]]) -> list[str]:
    """The table's lines for the tool-node figures."""
    lines = [
        f"{'backend':<11} {'graph run':<14} {'ToolNode ms':>11} {'Durable ms':>11} {'slowdown':>9}"
    ]
    for result in results:
        for name, f in result["figures"].items():
            lines.append(
                f"{result['backend']:<11} {name:<14} {f['toolnode_ms']:>11.1f} "
                f"{f['durable_ms']:>11.1f} {f['ratio']:>8.2f}x"
            )
    return lines
