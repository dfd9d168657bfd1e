"""docs/langgraph.md's example runs as shown, in a process of its own in a fresh directory,
and the stores it names hold what the page says (read with sqlite3)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.docs import code_block

pytest.importorskip("langgraph.checkpoint.sqlite", reason="needs the langgraph extra")

FIRST = "import sqlite3\n\nfrom langchain_core"


def _example() -> str:
    return code_block("docs/langgraph.md", FIRST)


def test_the_documented_example_runs_as_shown(tmp_path: Path, peek: Any) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", _example()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        'tool: {"ticket": 1}',
        "tool: error: the tool refused the call: refunds over 100 need a human",
        "ai: I opened a ticket; the refund needs a human.",
    ]
    assert peek(tmp_path / "agent.db", "SELECT key, state FROM oncewire_effects ORDER BY key") == [
        ("langgraph/customer-42//call-1", "done"),
        ("langgraph/customer-42//call-2", "rejected"),
    ]
    assert peek(tmp_path / "helpdesk.db", "SELECT id, title FROM tickets") == [
        (1, "printer on fire")
    ]
    assert peek(tmp_path / "helpdesk.db", "SELECT key FROM oncewire_receipts") == [
        ("langgraph/customer-42//call-1",)
    ]


JOINED = 'saver.claim("order-42")'
SETUP = """
import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

from oncewire import Ledger
from oncewire.langgraph import OncewireSaver


class State(TypedDict):
    approved: bool
    log: Annotated[list[str], operator.add]


builder = StateGraph(State)
builder.add_node("review", lambda state: {"log": ["reviewed"]})
builder.add_edge(START, "review")
builder.add_edge("review", END)
ledger = Ledger("app.db")
saver = OncewireSaver(ledger)
graph = builder.compile(checkpointer=saver)
config = {"configurable": {"thread_id": "order-42"}}
with ledger.transaction() as tx:
    tx.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, state TEXT)")
    tx.execute("INSERT INTO orders (id, state) VALUES (42, 'new')")
graph.invoke({"approved": False, "log": []}, config)
"""
CHECK = """
print(graph.get_state(config).values["approved"])
saver.close()
ledger.close()
"""


def test_the_documented_joined_write_commits_with_the_callers_rows(
    tmp_path: Path, peek: Any
) -> None:
    blocks = [code_block("docs/langgraph.md", JOINED)]
    ran = subprocess.run(
        [sys.executable, "-c", SETUP + blocks[0] + CHECK],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["True"]
    assert peek(tmp_path / "app.db", "SELECT state FROM orders") == [("approved",)]
