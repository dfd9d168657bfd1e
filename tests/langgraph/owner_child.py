"""A child process of the ownership test: runs (``first``) or resumes (``second``) one thread.

    python -m tests.langgraph.owner_child first|second DB THREAD_ID DIR

``first`` runs n0 -> slow -> n2 with a one-second lease that only its writes renew (no
heartbeat) and stops inside ``slow`` until DIR/go exists (a node running past its lease);
``second`` resumes the thread from its latest checkpoint. Each prints one JSON line: how its
run ended and its own read of the thread.
"""

from __future__ import annotations

import json
import operator
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from oncewire.core.errors import OncewireError
from oncewire.langgraph import OncewireSaver
from oncewire.langgraph.chain import verify_thread
from oncewire.ledger import Ledger


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def main(role: str, db: str, thread_id: str, folder: str) -> None:
    here = Path(folder)

    def slow(state: State) -> dict[str, Any]:
        if role == "first":
            (here / "first-in-slow").touch()
            while not (here / "go").exists():
                time.sleep(0.02)
        return {"log": [f"slow-{role}"]}

    g = StateGraph(State)
    g.add_node("n0", lambda s: {"log": ["n0"]})
    g.add_node("slow", slow)
    g.add_node("n2", lambda s: {"log": [f"n2-{role}"]})
    g.add_edge(START, "n0")
    g.add_edge("n0", "slow")
    g.add_edge("slow", "n2")
    g.add_edge("n2", END)
    config: Any = {"configurable": {"thread_id": thread_id}}
    with Ledger(db) as ledger:
        if role == "first":
            saver = OncewireSaver(ledger, lease_seconds=1.0, heartbeat=False)
        else:
            saver = OncewireSaver(ledger, lease_seconds=30.0)
        app = g.compile(checkpointer=saver)
        outcome = "done"
        try:
            app.invoke({"log": []} if role == "first" else None, config)
        except OncewireError as exc:
            outcome = exc.code
            print(repr(exc), exc.fields, file=sys.stderr)
        view = app.get_state(config).values.get("log")
        verdict = verify_thread(ledger.store, thread_id, None)
        print(json.dumps({"outcome": outcome, "view": view, "verified": verdict.ok}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
