#!/usr/bin/env python3
"""OncewireSession against the SDK's SQLiteSession and the store's floor, in the same run.

    .venv/bin/python benchmarks/agents_session_bench.py [--count N] [--rounds R] [--json FILE]
    .venv/bin/python benchmarks/agents_session_bench.py --db postgresql://127.0.0.1:5432/test

Milliseconds per call, the median of the rounds, each round on fresh stores:

* ``add_items``: one item per call (``await session.add_items([item])``), one after another;
* ``get_items(20)``: the newest 20 of ``count`` items, read again and again;
* ``pop_item``: the newest item removed, until the session is empty;
* ``floor``: ``ledger.accept`` of one effect, one statement committed alone: what one durable
  commit costs on this store, the least a durable ``add_items`` can cost.

On SQLite the SDK's ``SQLiteSession`` on a file of its own is measured beside it (its
``synchronous`` setting read back and shown: oncewire's is FULL); on PostgreSQL there is no SDK
session to compare with, only the floor. Timings on shared machines are noisy: compare the
rows of one run, not runs. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agents import SQLiteSession
from agents.memory import Session

from oncewire import Ledger
from oncewire.agents import OncewireSession

ITEM = {"role": "user", "content": "what is the weather like in Lisbon today?"}


@contextmanager
def _store(db: str | None) -> Iterator[str]:
    if db is None:
        with tempfile.TemporaryDirectory() as folder:
            yield str(Path(folder) / "sessions.db")
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.pg import fresh_schema

    with fresh_schema(db, "agents_bench") as url:
        yield url


async def _session_figures(session: Session, count: int) -> dict[str, float]:
    figures = {}
    started = time.perf_counter()
    for _ in range(count):
        await session.add_items([ITEM])
    figures["add_items"] = (time.perf_counter() - started) / count
    started = time.perf_counter()
    for _ in range(count):
        await session.get_items(20)
    figures["get_items(20)"] = (time.perf_counter() - started) / count
    started = time.perf_counter()
    for _ in range(count):
        await session.pop_item()
    figures["pop_item"] = (time.perf_counter() - started) / count
    return figures


def _round(db: str | None, count: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    with _store(db) as url, Ledger(url) as ledger:
        out["OncewireSession"] = asyncio.run(
            _session_figures(OncewireSession("bench", ledger), count)
        )
        started = time.perf_counter()
        for i in range(count):
            ledger.accept(f"floor-{i}", "bench", ITEM)
        out["OncewireSession"]["floor"] = (time.perf_counter() - started) / count
    if db is None:
        with tempfile.TemporaryDirectory() as folder:
            reference = SQLiteSession("bench", str(Path(folder) / "sdk.db"))
            try:
                out["SQLiteSession"] = asyncio.run(_session_figures(reference, count))
            finally:
                reference.close()
    return out


def _sdk_synchronous() -> int:
    with tempfile.TemporaryDirectory() as folder:
        reference = SQLiteSession("probe", str(Path(folder) / "probe.db"))
        try:
            conn = reference._get_connection()  # the connection its calls use
            return int(conn.execute("PRAGMA synchronous").fetchone()[0])
        finally:
            reference.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="a PostgreSQL URL (default: SQLite files in a temp dir)")
    parser.add_argument("--count", type=int, default=300, help="calls per figure per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    rounds = []
    for number in range(args.rounds):
        print(f"round {number + 1}/{args.rounds}", file=sys.stderr, flush=True)
        rounds.append(_round(args.db, args.count))
    table: dict[str, dict[str, float]] = {}
    for side in rounds[0]:
        table[side] = {
            figure: statistics.median(r[side][figure] for r in rounds) * 1000.0
            for figure in rounds[0][side]
        }
    backend = "postgresql" if args.db else f"sqlite {sqlite3.sqlite_version}"
    print(f"backend: {backend}; {args.count} calls per figure, median of {args.rounds} rounds")
    if args.db is None:
        print(f"SQLiteSession synchronous={_sdk_synchronous()} (2 = FULL); oncewire: FULL")
    figures = list(next(iter(table.values())))
    print(f"{'ms per call':<16}" + "".join(f"{f:>15}" for f in figures))
    for side, row in table.items():
        print(f"{side:<16}" + "".join(f"{row.get(f, float('nan')):>15.3f}" for f in figures))
    if args.json:
        args.json.write_text(json.dumps({"backend": backend, "ms_per_call": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
