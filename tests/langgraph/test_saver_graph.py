"""OncewireSaver under a real graph, on both backends: a run's checkpoints resume, each
thread's chain verifies whole, and the saver's rows commit in the caller's transaction or not
at all."""

from __future__ import annotations

import itertools
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from oncewire.core.errors import InvalidState
from oncewire.langgraph import OncewireSaver
from oncewire.langgraph.chain import verify_thread
from oncewire.ledger import Ledger
from tests.langgraph.conftest import Raw


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def graph(steps: int = 3) -> Any:
    g = StateGraph(State)
    names = [f"n{i}" for i in range(steps)]
    for name in names:
        g.add_node(name, lambda s, name=name: {"log": [name]})
    g.add_edge(START, names[0])
    for a, b in itertools.pairwise(names):
        g.add_edge(a, b)
    g.add_edge(names[-1], END)
    return g


def run_graph(db_url: str, thread_id: str, steps: int = 3) -> dict[str, Any]:
    with OncewireSaver.from_conn_string(db_url) as saver:
        app = graph(steps).compile(checkpointer=saver)
        result: dict[str, Any] = app.invoke({"log": []}, {"configurable": {"thread_id": thread_id}})
        return result


def test_a_graph_runs_and_its_thread_verifies(db_url: str, raw: Raw) -> None:
    assert run_graph(db_url, "t")["log"] == ["n0", "n1", "n2"]
    with Ledger(db_url) as ledger:
        verdict = verify_thread(ledger.store, "t", None)
        assert verdict.ok, verdict
        saver = OncewireSaver(ledger)
        app = graph().compile(checkpointer=saver)
        state = app.get_state({"configurable": {"thread_id": "t"}})
        assert state.values["log"] == ["n0", "n1", "n2"]
        assert len(list(app.get_state_history({"configurable": {"thread_id": "t"}}))) == 5
    (head_seq,) = raw.query("SELECT head_seq FROM oncewire_lg_threads WHERE thread_id = 't'")[0]
    assert (
        raw.query("SELECT COUNT(*) FROM oncewire_lg_chain WHERE thread_id = 't'")[0][0] == head_seq
    )


def test_the_saver_writes_in_the_callers_transaction(db_url: str, raw: Raw) -> None:
    raw.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, note TEXT)")
    config = {"configurable": {"thread_id": "tx", "checkpoint_ns": ""}}
    checkpoint = {
        "v": 4,
        "id": "1f000000-0000-6000-8000-000000000001",
        "ts": "",
        "channel_values": {},
        "channel_versions": {},
        "versions_seen": {},
        "updated_channels": None,
    }
    with Ledger(db_url) as ledger:
        saver = OncewireSaver(ledger)
        with pytest.raises(InvalidState), ledger.transaction() as tx, saver.joined(tx):
            saver.put(config, checkpoint, {"source": "input", "step": -1}, {})  # not claimed
        saver.claim("tx")
        with pytest.raises(RuntimeError), ledger.transaction() as tx, saver.joined(tx):
            tx.execute("INSERT INTO orders (id, note) VALUES (:id, :note)", {"id": 1, "note": "a"})
            saver.put(config, checkpoint, {"source": "input", "step": -1}, {})
            raise RuntimeError("the caller changes its mind")
        assert raw.query("SELECT COUNT(*) FROM orders")[0][0] == 0
        assert raw.query("SELECT COUNT(*) FROM oncewire_lg_checkpoints")[0][0] == 0
        with ledger.transaction() as tx, saver.joined(tx):
            tx.execute("INSERT INTO orders (id, note) VALUES (:id, :note)", {"id": 1, "note": "a"})
            stored = saver.put(config, checkpoint, {"source": "input", "step": -1}, {})
        assert raw.query("SELECT COUNT(*) FROM orders")[0][0] == 1
        assert saver.get_tuple(stored) is not None
        assert verify_thread(ledger.store, "tx", None).ok
