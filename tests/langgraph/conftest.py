"""Fixtures for the LangGraph tests: a receiver store the tools write to, a graph builder with
a scripted chat model (no network), and ``db_url``, a fresh store's URL on each backend
(``store_url`` of tests/conftest.py: a SQLite file in ``tmp_path``, or a PostgreSQL schema of
the test's own) with ``raw`` to read and write its tables around oncewire.

Every module here starts with ``pytest.importorskip`` for LangGraph, so a checkout without the
``langgraph`` extra reports these tests as skipped, with the reason."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.tables import Connection as Raw

pytest.importorskip("langgraph.prebuilt", reason="needs the langgraph extra")
pytest.importorskip("langgraph.checkpoint.sqlite", reason="needs langgraph-checkpoint-sqlite")

from langchain_core.messages import AIMessage, BaseMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition


class ScriptedModel:
    """A chat model node that answers from a script: its n-th answer when the thread holds n
    AI messages. It counts what it was asked, like a model's bill would."""

    def __init__(self, answers: Sequence[AIMessage]) -> None:
        self.answers = list(answers)
        self.asked = 0

    def __call__(self, state: Any) -> dict[str, Any]:
        self.asked += 1
        answered = sum(1 for message in state["messages"] if isinstance(message, AIMessage))
        return {"messages": [self.answers[min(answered, len(self.answers) - 1)]]}


def agent(model: ScriptedModel, node: Any, saver: Any, state: type = MessagesState) -> Any:
    """model -> tools (while the model asks for tools) -> model, with ``saver``."""
    graph = StateGraph(state)
    graph.add_node("model", model)
    graph.add_node("tools", node)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=saver)


@pytest.fixture
def saver(tmp_path: Path) -> Iterator[SqliteSaver]:
    conn = sqlite3.connect(str(tmp_path / "checkpoints.sqlite"), check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


@pytest.fixture
def build() -> Callable[..., Any]:
    return agent


def shown(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """Messages without the ids LangGraph draws at random."""
    return [message.model_dump(exclude={"id"}) for message in messages]


@pytest.fixture
def db_url(store_url: str) -> str:
    return store_url


@pytest.fixture
def raw(db_url: str) -> Iterator[Raw]:
    from oncewire import Ledger

    Ledger(db_url).close()  # the schema exists before the test reads it
    handle = Raw(db_url)
    try:
        yield handle
    finally:
        handle.close()
