"""An asyncio application killed with SIGKILL, on SQLite and PostgreSQL.

A real child process accepts effects with ``AsyncLedger`` in transactions that also write its
own rows, from several tasks at once, and is SIGKILLed mid-way. Read around oncewire afterwards:
every effect is there with its row and every row with its effect, and every transaction the
child reported committed is there. Then a dispatcher with an ``async def`` sink (an
``AsyncReceipts`` receiver) is SIGKILLed mid-delivery and run again to the end: each effect is
done and its shipment written exactly once, every repeated call flagged as a redelivery.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.support import tables

pytestmark = [pytest.mark.crash, pytest.mark.empty_store]

APP = r"""
import asyncio, sys
from oncewire.aio import AsyncLedger

url = sys.argv[1]

async def main():
    async with AsyncLedger(url) as ledger:
        async with ledger.transaction() as tx:
            await tx.execute(
                "CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, total INTEGER NOT NULL)"
            )
        print("ready", flush=True)

        async def writer(w):
            for i in range(1_000_000):
                n = w * 1_000_000 + i
                async with ledger.transaction() as tx:
                    await tx.execute(
                        "INSERT INTO orders (id, total) VALUES (:id, :total)", {"id": n, "total": i}
                    )
                    await asyncio.sleep(0)
                    await tx.accept(f"order-{n}", "ship", {"order": n})
                print("committed", n, flush=True)

        await asyncio.gather(*(writer(w) for w in range(4)))

asyncio.run(main())
"""

DISPATCH = r"""
import asyncio, json, os, sys
import oncewire
from oncewire.aio import AsyncReceipts

url, receiver, journal = sys.argv[1:4]
receipts = AsyncReceipts(oncewire.Receipts(receiver))
fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

async def ship(attempt):
    line = json.dumps({"key": attempt.key, "redelivery": attempt.redelivery}) + "\n"
    os.write(fd, line.encode())
    os.fsync(fd)

    async def work(tx):
        await tx.execute("INSERT INTO shipments (key) VALUES (:key)", {"key": attempt.key})
        await asyncio.sleep(0.05)  # the receiver takes its time: the kill lands mid-work
        return attempt.payload["order"]

    result = await receipts.run_once(attempt.key, attempt.payload, work)
    return oncewire.Done({"order": result.result})

with oncewire.Ledger(url) as ledger:
    oncewire.Dispatcher(ledger, sinks={"ship": ship}).run(until_idle=True)
print("idle", flush=True)
"""


def raw(url: str, *queries: str) -> list[list[tuple[Any, ...]]]:
    """The rows of each query, all read in one snapshot by a connection of the test's own.

    One snapshot matters on PostgreSQL: a COMMIT the killed client had already sent still
    completes on the server, and two separate reads could straddle it."""
    conn = tables.connect(url)
    try:
        if tables.dialect_of(url) == "postgresql":
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                return [[tuple(r) for r in tables.run(conn, q).fetchall()] for q in queries]
        conn.execute("BEGIN")
        return [[tuple(r) for r in tables.run(conn, q).fetchall()] for q in queries]
    finally:
        conn.close()


def sigkill(child: subprocess.Popen[str]) -> None:
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


def test_an_async_app_killed_midway_keeps_every_effect_with_its_rows_and_each_ships_once(
    store_url: str, tmp_path: Path, python_child: Callable[..., subprocess.Popen[str]]
) -> None:
    app_url = store_url
    if store_url.startswith("postgresql://"):
        app_name = f"oncewire-aio-app-{os.getpid()}-{time.monotonic_ns()}"
        app_url = store_url + ("&" if "?" in store_url else "?") + f"application_name={app_name}"
    app = python_child(APP, app_url)
    assert app.stdout is not None
    assert app.stdout.readline().strip() == "ready", app.stderr and app.stderr.read()
    committed: set[int] = set()
    while len(committed) < 60:
        line = app.stdout.readline()
        assert line, f"the app ended early: {app.stderr and app.stderr.read()}"
        committed.add(int(line.split()[1]))
    sigkill(app)
    committed.update(int(line.split()[1]) for line in app.stdout.read().splitlines())
    if app_url != store_url:
        # A COMMIT the killed client had already sent still completes on the server: read
        # once the server has ended every session of the app.
        def gone() -> bool:
            sessions = raw(
                store_url, f"SELECT 1 FROM pg_stat_activity WHERE application_name = '{app_name}'"
            )
            return not sessions[0]

        wait_for(gone, timeout=60, what="the killed app's sessions to end")

    order_rows, effect_rows = raw(
        store_url, "SELECT id FROM orders", "SELECT key FROM oncewire_effects"
    )
    orders = {int(r[0]) for r in order_rows}
    effects = {r[0] for r in effect_rows}
    assert {f"order-{n}" for n in orders} == effects, "an effect without its row, or a row alone"
    assert committed <= orders, "a transaction reported committed is missing"

    receiver = tmp_path / "receiver.db"
    with sqlite3.connect(receiver) as conn:
        conn.execute("CREATE TABLE shipments (id INTEGER PRIMARY KEY, key TEXT NOT NULL)")
    journal = tmp_path / "calls.jsonl"

    def calls() -> list[dict[str, Any]]:
        if not journal.exists():
            return []
        return [json.loads(line) for line in journal.read_text().splitlines() if line]

    first = python_child(DISPATCH, store_url, str(receiver), str(journal))
    wait_for(lambda: len(calls()) >= 8 or first.poll() is not None, timeout=60, what="calls")
    assert first.poll() is None, "the dispatcher finished before it could be killed"
    sigkill(first)
    killed_after = len(calls())

    second = python_child(DISPATCH, store_url, str(receiver), str(journal))
    out, err = second.communicate(timeout=110)
    assert second.returncode == 0 and out.strip() == "idle", err

    (state_rows,) = raw(store_url, "SELECT key, state FROM oncewire_effects")
    states = dict(state_rows)
    assert set(states.values()) == {"done"}, Counter(states.values())
    with sqlite3.connect(receiver) as conn:
        shipped = Counter(r[0] for r in conn.execute("SELECT key FROM shipments"))
        receipts = {r[0] for r in conn.execute("SELECT key FROM oncewire_receipts")}
    assert set(shipped) == effects and set(shipped.values()) == {1}, "a shipment twice or none"
    assert receipts == effects
    seen: set[str] = set()
    for call in calls():
        if call["key"] in seen:
            assert call["redelivery"], f"{call['key']} called again unflagged"
        seen.add(call["key"])
    assert seen == effects
    assert len(calls()) >= killed_after
    # The kill landed mid-delivery: what it interrupted was delivered again, flagged.
    assert any(call["redelivery"] for call in calls()[killed_after:])
