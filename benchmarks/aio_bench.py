"""oncewire.aio against the synchronous API, in the same run, on the same disk or server.

    .venv/bin/python benchmarks/aio_bench.py [--quick] [--count N] [--rounds R] [--json FILE]
    .venv/bin/python benchmarks/aio_bench.py --db postgresql://127.0.0.1:5432/test

Each figure is measured synchronously and with asyncio on fresh stores, the two interleaved
round by round, and the ratio (async / sync, effects per second: higher is better for asyncio)
is the figure to read. Rows:

* ``accept``: one effect per transaction, one after the other (``ledger.accept`` against
  ``await ledger.accept``): what the hop to a worker thread costs per commit;
* ``transaction``: a transaction with one row of the caller's and one effect (``with
  ledger.transaction()`` against ``async with``: four hops to the transaction's thread);
* ``accept, 8 at once``: the async accepts from 8 tasks at once, against the same count
  accepted one after the other synchronously;
* ``end to end``: accept, then a dispatcher drains the outbox to a sink that counts; the
  synchronous run uses a plain sink, the async one accepts with ``AsyncLedger`` and hands
  the dispatcher an ``async def`` sink.

On SQLite every store is a file in a fresh temporary directory (WAL, synchronous=FULL); on
PostgreSQL every store is a fresh schema, dropped afterwards. Timings on shared machines are
noisy: compare the rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import oncewire
from oncewire import Dispatcher, Ledger, __version__
from oncewire.aio import AsyncLedger

ORDERS = "CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, total INTEGER NOT NULL)"
INSERT = "INSERT INTO orders (id, total) VALUES (:id, :total)"
CONCURRENCY = 8


@contextmanager
def fresh_store(base: str | None, folder: Path, name: str) -> Iterator[str]:
    """A fresh store's URL: a SQLite file in ``folder``, or a new schema on ``base``."""
    if base is None:
        yield str(folder / f"{name}-{uuid.uuid4().hex[:8]}.db")
        return
    import psycopg

    from oncewire.lab.fixtures import with_search_path

    schema = f"oncewire_aiobench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
    try:
        yield with_search_path(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


# -- synchronous ------------------------------------------------------------------------------
def sync_accept(url: str, count: int) -> float:
    with Ledger(url) as ledger:
        started = time.perf_counter()
        for n in range(count):
            ledger.accept(f"k{n}", "ship", {"n": n})
        return time.perf_counter() - started


def sync_transaction(url: str, count: int) -> float:
    with Ledger(url) as ledger:
        with ledger.transaction() as tx:
            tx.execute(ORDERS)
        started = time.perf_counter()
        for n in range(count):
            with ledger.transaction() as tx:
                tx.execute(INSERT, {"id": n, "total": n})
                tx.accept(f"k{n}", "ship", {"n": n})
        return time.perf_counter() - started


def sync_end_to_end(url: str, count: int) -> float:
    delivered: list[str] = []
    with Ledger(url) as ledger:
        started = time.perf_counter()
        for n in range(count):
            ledger.accept(f"k{n}", "ship", {"n": n})
        Dispatcher(ledger, sinks={"ship": lambda a: delivered.append(a.key)}).run(until_idle=True)
        seconds = time.perf_counter() - started
    if len(delivered) != count:
        raise SystemExit(f"sync end to end delivered {len(delivered)} of {count}")
    return seconds


# -- asyncio ------------------------------------------------------------------------------------
def timed(main: Callable[[], Coroutine[Any, Any, float]]) -> float:
    return asyncio.run(main())


def async_accept(url: str, count: int) -> float:
    async def main() -> float:
        async with AsyncLedger(url) as ledger:
            started = time.perf_counter()
            for n in range(count):
                await ledger.accept(f"k{n}", "ship", {"n": n})
            return time.perf_counter() - started

    return timed(main)


def async_transaction(url: str, count: int) -> float:
    async def main() -> float:
        async with AsyncLedger(url) as ledger:
            async with ledger.transaction() as tx:
                await tx.execute(ORDERS)
            started = time.perf_counter()
            for n in range(count):
                async with ledger.transaction() as tx:
                    await tx.execute(INSERT, {"id": n, "total": n})
                    await tx.accept(f"k{n}", "ship", {"n": n})
            return time.perf_counter() - started

    return timed(main)


def async_accept_concurrent(url: str, count: int) -> float:
    async def main() -> float:
        async with AsyncLedger(url, max_transactions=CONCURRENCY) as ledger:

            async def task(first: int) -> None:
                for n in range(first, count, CONCURRENCY):
                    await ledger.accept(f"k{n}", "ship", {"n": n})

            started = time.perf_counter()
            await asyncio.gather(*(task(i) for i in range(CONCURRENCY)))
            return time.perf_counter() - started

    return timed(main)


def async_end_to_end(url: str, count: int) -> float:
    delivered: list[str] = []

    async def sink(attempt: oncewire.Attempt) -> None:
        delivered.append(attempt.key)

    async def main() -> float:
        async with AsyncLedger(url) as ledger:
            started = time.perf_counter()
            for n in range(count):
                await ledger.accept(f"k{n}", "ship", {"n": n})
            dispatcher = Dispatcher(ledger.sync, sinks={"ship": sink})
            await asyncio.to_thread(dispatcher.run, until_idle=True)
            return time.perf_counter() - started

    seconds = timed(main)
    if len(delivered) != count:
        raise SystemExit(f"async end to end delivered {len(delivered)} of {count}")
    return seconds


FIGURES: dict[str, tuple[Callable[[str, int], float], Callable[[str, int], float]]] = {
    "accept": (sync_accept, async_accept),
    "transaction": (sync_transaction, async_transaction),
    f"accept, {CONCURRENCY} at once": (sync_accept, async_accept_concurrent),
    "end to end": (sync_end_to_end, async_end_to_end),
}


def measure(base: str | None, count: int, rounds: int) -> dict[str, dict[str, Any]]:
    per_round: dict[str, dict[str, list[float]]] = {
        name: {"sync": [], "async": [], "ratio": []} for name in FIGURES
    }
    with tempfile.TemporaryDirectory(prefix="oncewire-aio-bench-") as tmp:
        folder = Path(tmp)
        for round_number in range(rounds):
            for name, (sync_run, async_run) in FIGURES.items():
                print(f"round {round_number + 1}: {name} ...", file=sys.stderr, flush=True)
                rates = {}
                for side, run in (("sync", sync_run), ("async", async_run)):
                    with fresh_store(base, folder, side) as url:
                        rates[side] = count / run(url, count)
                    per_round[name][side].append(rates[side])
                per_round[name]["ratio"].append(rates["async"] / rates["sync"])
    return {
        name: {
            "sync_per_second": statistics.median(values["sync"]),
            "async_per_second": statistics.median(values["async"]),
            "ratio": statistics.median(values["ratio"]),
            "rounds": values,
        }
        for name, values in per_round.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer effects, one round")
    parser.add_argument("--count", type=int, help="effects per figure and side")
    parser.add_argument("--rounds", type=int, help="rounds; the medians are shown")
    parser.add_argument("--db", help="a PostgreSQL URL (fresh schemas there); default SQLite")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    count = args.count or (100 if args.quick else 1000)
    rounds = args.rounds or (1 if args.quick else 3)
    results = measure(args.db, count, rounds)
    backend = "PostgreSQL" if args.db else f"SQLite {sqlite3.sqlite_version}, WAL + FULL"
    print(
        f"oncewire {__version__} asyncio benchmark, Python {platform.python_version()}, "
        f"{backend}, {count} effects per figure, {rounds} round(s)"
    )
    header = f"{'figure':24} {'sync per s':>11} {'async per s':>12} {'async/sync':>11}"
    print(header)
    print("-" * len(header))
    for name, figure in results.items():
        print(
            f"{name:24} {figure['sync_per_second']:11.0f} {figure['async_per_second']:12.0f} "
            f"{figure['ratio']:11.2f}"
        )
    if args.json:
        report = {
            "oncewire": __version__,
            "python": platform.python_version(),
            "backend": "postgresql" if args.db else "sqlite",
            "sqlite": sqlite3.sqlite_version,
            "count": count,
            "rounds": rounds,
            "figures": results,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
