"""The tools a real ``oncewire dispatch`` worker serves in the workers test:

    oncewire dispatch --db URL --app tests.langgraph.worker_tools:sinks

The receiver is the store named by ``LG_RECEIVER`` (a SQLite path or a PostgreSQL URL). Every
attempt logs a row in ``tool_attempts`` (call id, attempt number, redelivery flag, pid) in a
transaction of its own before it acts. ``open_ticket`` writes its ticket through
``Receipts.run_once`` keyed by the attempt's key; on a first attempt it then hangs, so that the
test can SIGKILL the worker after the ticket is written and before the outcome is recorded.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from langchain_core.tools import tool

from oncewire.langgraph import current_attempt, tool_sinks
from oncewire.receipts import Receipts

HANG_SECONDS = 120.0

_receipts: Receipts | None = None


def receiver() -> Receipts:
    global _receipts
    if _receipts is None:
        _receipts = Receipts(os.environ["LG_RECEIVER"], retention_seconds=None)
    return _receipts


def create_tables(url: str) -> None:
    serial = "BIGSERIAL" if url.startswith("postgresql") else "INTEGER"
    with Receipts(url, retention_seconds=None) as receipts, receipts.store.transaction() as tx:
        tx.execute(
            f"CREATE TABLE tool_attempts (id {serial} PRIMARY KEY, call TEXT NOT NULL, "
            "number INTEGER NOT NULL, redelivery INTEGER NOT NULL, pid INTEGER NOT NULL)"
        )
        tx.execute(
            f"CREATE TABLE tickets (id {serial} PRIMARY KEY, call TEXT NOT NULL, "
            "title TEXT NOT NULL, pid INTEGER NOT NULL)"
        )


def _log(call: str) -> Any:
    attempt = current_attempt()
    with receiver().store.transaction() as tx:
        tx.execute(
            "INSERT INTO tool_attempts (call, number, redelivery, pid) "
            "VALUES (:call, :number, :redelivery, :pid)",
            {
                "call": call,
                "number": attempt.number,
                "redelivery": int(attempt.redelivery),
                "pid": os.getpid(),
            },
        )
    return attempt


@tool
def open_ticket(title: str) -> str:
    """Open a ticket in the help desk."""
    attempt = _log("open_ticket")

    def insert(tx: Any) -> dict[str, Any]:
        tx.execute(
            "INSERT INTO tickets (call, title, pid) VALUES (:call, :title, :pid)",
            {"call": attempt.key, "title": title, "pid": os.getpid()},
        )
        return {"ticket": title}

    answer = receiver().run_once(attempt.key, {"title": title}, insert).result
    if not attempt.redelivery:
        time.sleep(HANG_SECONDS)  # killed here: the ticket is written, the outcome is not
    return json.dumps(answer, sort_keys=True)


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    _log("add")
    return a + b


TOOLS = [open_ticket, add]
sinks = tool_sinks(TOOLS)
