"""The shared run-ledger row mappings, plus SQLite's placeholder and one-row helpers."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from oncewire.storage.run_rows import (
    ACTION,
    ACTIVE,
    BARRIER,
    BRANCH,
    CHECKPOINT,
    DELIVERY,
    EVENT,
    FINDING,
    KEY_PIN,
    PHASE,
    REPORT,
    RUN,
    action_values,
    delivery_values,
    event_row,
    phase_row,
    phase_values,
    run_row,
    run_values,
    used_ids_query,
)

__all__ = [
    "ACTION",
    "ACTIVE",
    "BARRIER",
    "BRANCH",
    "CHECKPOINT",
    "DELIVERY",
    "EVENT",
    "FINDING",
    "KEY_PIN",
    "PHASE",
    "REPORT",
    "RUN",
    "action_values",
    "delivery_values",
    "event_row",
    "marks",
    "one",
    "phase_row",
    "phase_values",
    "run_row",
    "run_values",
    "used_ids_query",
]


def marks(n: int) -> str:
    return ", ".join("?" * n)


def one(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> Any:
    rows = conn.execute(sql, params).fetchall()
    return rows[0] if rows else None
