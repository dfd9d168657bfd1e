"""The sinks the chaos tests' ``oncewire dispatch --app tests.chaos.app:sinks`` workers run.

One kind, ``ticket``: a receipts-backed receiver (:class:`oncewire.ReceiptsSink`) on the
downstream store named by ``CHAOS_DOWNSTREAM`` (a database that does not die), whose work
inserts one ticket row in the receipt's transaction. Before that, every call of the sink is
noted in ``chaos_calls`` (its own autocommit statement, so a note survives whatever the
attempt does next): the tests compare those notes with the outbox to see that every call after
the first of a key was flagged as a redelivery. ``CHAOS_SINK_DELAY`` seconds of work keep
attempts in flight when the database under the outbox dies.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from oncewire import Attempt, Receipts, ReceiptsSink
from oncewire.storage.driver import Transaction

__all__ = ["DOWNSTREAM_SCHEMA", "sinks"]

DOWNSTREAM_SCHEMA = """
CREATE TABLE IF NOT EXISTS chaos_tickets (
    key TEXT NOT NULL, fence BIGINT NOT NULL, pid INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS chaos_calls (
    key TEXT NOT NULL, fence BIGINT NOT NULL, redelivery BOOLEAN NOT NULL,
    pid INTEGER NOT NULL
);
"""


def sinks() -> dict[str, Any]:
    import psycopg

    url = os.environ["CHAOS_DOWNSTREAM"]
    delay = float(os.environ.get("CHAOS_SINK_DELAY", "0"))
    receipts = Receipts(url)
    local = threading.local()

    def note(attempt: Attempt) -> None:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = psycopg.connect(url, autocommit=True)
        conn.execute(
            "INSERT INTO chaos_calls (key, fence, redelivery, pid) VALUES (%s, %s, %s, %s)",
            (attempt.key, attempt.fence, attempt.redelivery, os.getpid()),
        )

    def work(tx: Transaction, attempt: Attempt) -> int:
        time.sleep(delay)
        tx.execute(
            "INSERT INTO chaos_tickets (key, fence, pid) VALUES (:key, :fence, :pid)",
            {"key": attempt.key, "fence": attempt.fence, "pid": os.getpid()},
        )
        return attempt.fence

    receiver = ReceiptsSink(receipts, work)

    def ticket(attempt: Attempt) -> Any:
        note(attempt)
        return receiver(attempt)

    return {"ticket": ticket}
