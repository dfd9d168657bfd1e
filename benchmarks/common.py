"""Small pieces shared by the benchmark parent and its child processes.

Kept light on purpose: a child process imports this module before it is timed, so nothing here
may pull in more than the standard library and oncewire itself.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

# The same pragmas everywhere: the raw SQLite floor sets them by hand, oncewire's SQLite store sets
# them at open (its defaults), and the Huey reference is configured to match. Every workload reads
# them back and refuses to run if one differs.
BUSY_TIMEOUT_MS = 10_000
PRAGMAS: dict[str, Any] = {"journal_mode": "wal", "synchronous": 2, "busy_timeout": BUSY_TIMEOUT_MS}

KIND = "noop"
TEXT = "the quick brown fox jumps over the lazy dog 0123456789"  # ~ a short tool-call argument


def effect_key(i: int) -> str:
    return f"bench/{i:08d}"


def effect_payload(i: int) -> dict[str, Any]:
    return {"n": i, "text": TEXT}


def raw_connect(path: str) -> sqlite3.Connection:
    """A plain sqlite3 connection with the pragmas oncewire uses."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def read_pragmas(execute: Any) -> dict[str, Any]:
    """The pragmas that matter, read back through ``execute(sql)`` (a cursor factory)."""
    return {
        "journal_mode": str(execute("PRAGMA journal_mode").fetchone()[0]).lower(),
        "synchronous": int(execute("PRAGMA synchronous").fetchone()[0]),
        "busy_timeout": int(execute("PRAGMA busy_timeout").fetchone()[0]),
    }


def effect_states(path: str) -> dict[str, int]:
    """Effects by state, read straight from the file (not through the code under test)."""
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        rows = conn.execute("SELECT state, COUNT(*) FROM oncewire_effects GROUP BY state")
        return {str(state): int(count) for state, count in rows}
    finally:
        conn.close()


@dataclass
class DispatchTiming:
    """What a timed dispatcher run saw (``time.monotonic()`` instants, comparable across
    processes on one host)."""

    run_started: float = 0.0
    first_call: float | None = None
    first_redelivery: float | None = None
    finished: float = 0.0
    calls: int = 0
    redeliveries: int = 0
    stats: dict[str, Any] = field(default_factory=dict)


def timed_dispatch(db: str, batch_size: int) -> DispatchTiming:
    """Open ``db``, run a dispatcher with a no-op sink until idle, and time it.

    The clock starts right before ``Dispatcher.run()``; opening the store and building the
    dispatcher come before it (a process-level measurement adds them back).
    """
    from oncewire import Dispatcher, Ledger

    timing = DispatchTiming()

    def sink(attempt: Any) -> None:
        now = time.monotonic()
        if timing.first_call is None:
            timing.first_call = now
        if attempt.redelivery:
            timing.redeliveries += 1
            if timing.first_redelivery is None:
                timing.first_redelivery = now
        timing.calls += 1

    ledger = Ledger(db, create=False)
    try:
        dispatcher = Dispatcher(ledger, {KIND: sink}, batch_size=batch_size)
        timing.run_started = time.monotonic()
        stats = dispatcher.run(until_idle=True, handle_signals=False)
        timing.finished = time.monotonic()
        timing.stats = stats.as_dict()
    finally:
        ledger.close()
    return timing
