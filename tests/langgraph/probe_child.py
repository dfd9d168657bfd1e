"""A child process for the write-ordering probe: a graph whose parallel task ``b`` has its
writes held back on their way to the saver, and a saver that kills this process with SIGKILL
the instant the checkpoint that follows that super-step has been put.

    python -m tests.langgraph.probe_child upstream|oncewire DB THREAD_ID

What the store holds after the kill is what a crash at that instant leaves.
"""

from __future__ import annotations

import operator
import os
import signal
import sqlite3
import sys
import time
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

HOLD_SECONDS = 0.5  # b's writes reach the saver this much later than c's


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _probe(base: type) -> type:
    class Probe(base):  # type: ignore[valid-type,misc]
        def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
            if task_path.endswith(", b"):
                time.sleep(HOLD_SECONDS)  # the executor ran this job late
            super().put_writes(config, writes, task_id, task_path)

        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            stored = super().put(config, checkpoint, metadata, new_versions)
            if "b" in checkpoint["versions_seen"] and "d" not in checkpoint["versions_seen"]:
                os.kill(os.getpid(), signal.SIGKILL)  # the step after b and c is durable
            return stored

    return Probe


def _graph() -> Any:
    g = StateGraph(State)
    g.add_node("a", lambda s: {"log": ["a"]})
    g.add_node("b", lambda s: {"log": ["b"]})
    g.add_node("c", lambda s: {"log": ["c"]})
    g.add_node("d", lambda s: {"log": ["d"]})
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("a", "c")
    g.add_edge(["b", "c"], "d")
    g.add_edge("d", END)
    return g


def main(kind: str, db: str, thread_id: str) -> None:
    config = {"configurable": {"thread_id": thread_id}}
    if kind == "upstream":
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(db, check_same_thread=False)
        saver = _probe(SqliteSaver)(conn)
        _graph().compile(checkpointer=saver).invoke({"log": []}, config)
        return
    from oncewire.langgraph import OncewireSaver
    from oncewire.ledger import Ledger

    saver = _probe(OncewireSaver)(Ledger(db))
    _graph().compile(checkpointer=saver).invoke({"log": []}, config)


if __name__ == "__main__":
    main(*sys.argv[1:4])
