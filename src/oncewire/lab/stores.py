"""The two stores of the outbox experiments, and how the lab reads them.

``caller.sqlite`` holds the caller's own ``operations`` table beside oncewire's outbox, so that an
operation and its effect are accepted in one transaction. ``downstream.sqlite`` is the receiving
service: its ``tickets`` table and oncewire's receipts. The lab reads both with plain sqlite3,
not through the code under test.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from oncewire.effects import Ledger
from oncewire.receipts import Receipts

__all__ = ["FIXTURE", "KIND", "caller_path", "downstream_path", "initialise", "snapshot"]

KIND = "ticket"
FIXTURE: dict[str, Any] = {
    "project": "demo-agent",
    "title": "Investigate the synthetic queue backlog",
    "priority": "normal",
}


def caller_path(folder: Path) -> Path:
    return folder / "caller.sqlite"


def downstream_path(folder: Path) -> Path:
    return folder / "downstream.sqlite"


def initialise(folder: Path) -> None:
    """Create both stores with their schemas (the folder must exist and be empty)."""
    with Ledger(str(caller_path(folder))) as ledger, ledger.transaction() as tx:
        tx.execute(
            "CREATE TABLE operations (id TEXT PRIMARY KEY, payload TEXT NOT NULL, "
            "created_by INTEGER NOT NULL)"
        )
    with Receipts(str(downstream_path(folder))) as receipts, receipts.store.transaction() as tx:
        tx.execute(
            "CREATE TABLE tickets (id INTEGER PRIMARY KEY, operation_id TEXT NOT NULL, "
            "payload TEXT NOT NULL, attempt INTEGER NOT NULL, redelivery INTEGER NOT NULL, "
            "service_pid INTEGER NOT NULL)"
        )


def _rows(path: Path, sql: str) -> list[dict[str, Any]]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute(sql)]


def snapshot(folder: Path) -> dict[str, list[dict[str, Any]]]:
    caller, downstream = caller_path(folder), downstream_path(folder)
    return {
        "operations": _rows(caller, "SELECT id, payload FROM operations ORDER BY id"),
        "effects": _rows(
            caller,
            "SELECT key, state, attempts, maybe_sent, fence, lease_owner, result, last_error "
            "FROM oncewire_effects ORDER BY key",
        ),
        "tickets": _rows(
            downstream,
            "SELECT id, operation_id, payload, attempt, redelivery FROM tickets ORDER BY id",
        ),
        "receipts": _rows(
            downstream, "SELECT key, digest, result FROM oncewire_receipts ORDER BY key"
        ),
    }
