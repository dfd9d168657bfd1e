"""A child process of the durable-run test: ``durable_invoke`` of a three-step graph that kills
its own process with SIGKILL inside the second step when ONCEWIRE_TEST_KILL_IN is that step.

    python -m tests.langgraph.run_child DB THREAD_ID

``builder`` is what ``oncewire langgraph resume --graph tests.langgraph.run_child:builder``
compiles.
"""

from __future__ import annotations

import operator
import os
import signal
import sys
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from oncewire.langgraph import OncewireSaver, durable_invoke
from oncewire.ledger import Ledger


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _step(name: str) -> Any:
    def run(state: State) -> dict[str, Any]:
        if os.environ.get("ONCEWIRE_TEST_KILL_IN") == name:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"log": [name]}

    return run


builder: Any = StateGraph(State)
for _name in ("s1", "s2", "s3"):
    builder.add_node(_name, _step(_name))
builder.add_edge(START, "s1")
builder.add_edge("s1", "s2")
builder.add_edge("s2", "s3")
builder.add_edge("s3", END)


def main(db: str, thread_id: str) -> None:
    with Ledger(db) as ledger:
        graph = builder.compile(checkpointer=OncewireSaver(ledger))
        durable_invoke(
            graph,
            {"log": ["input"]},
            {"configurable": {"thread_id": thread_id}},
            graph_ref="tests.langgraph.run_child:builder",
        )


if __name__ == "__main__":
    main(*sys.argv[1:3])
