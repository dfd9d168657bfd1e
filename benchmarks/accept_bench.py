#!/usr/bin/env python3
"""Ledger.accept on PostgreSQL against the raw psycopg floor, taking turns in small pieces.

    .venv/bin/python benchmarks/accept_bench.py --db postgresql://... [--repeat 5] [--json FILE]

``run.py --backend postgresql`` brackets the whole accept workload by a floor measured before
and after it; on a server shared with other work the floor moved from 220 to 4,400 commits/s
within one round there, and the ratio with it. Here the floor (psycopg 3, autocommit, one
INSERT per transaction) and ``Ledger.accept`` (each in its own transaction) take turns 50
operations at a time on one server, each in a schema of its own (dropped afterwards), so a
slow moment falls on both alike; each round's ratio is accept's rate over the floor's, and the
table shows the medians. The bound is 1.00x: one commit per accept, as the floor.

Also counted, not timed, from libpq's protocol trace of the ledger's connection: the statements
and round trips (each ``Sync`` or simple ``Query`` the client waits on) of one accept.
Progress goes to stderr, the table to stdout; timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
try:
    import oncewire
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(HERE.parent / "src"))
    import oncewire

from oncewire import Ledger  # noqa: E402

CHUNK = 50
PAYLOAD = {"to": "user-1", "text": "a short notification"}


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def floor_steps(url: str) -> Iterator[float]:
    """Raw psycopg, autocommit, one INSERT per transaction: seconds per :data:`CHUNK`."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE floor (id BIGSERIAL PRIMARY KEY, key TEXT, payload TEXT)")
        text, i = json.dumps(PAYLOAD), 0
        while True:
            started = time.perf_counter()
            for n in range(i, i + CHUNK):
                conn.execute("INSERT INTO floor (key, payload) VALUES (%s, %s)", (f"k{n}", text))
            yield time.perf_counter() - started
            i += CHUNK


def accept_steps(url: str) -> Iterator[float]:
    """``Ledger.accept``, each in its own transaction: seconds per :data:`CHUNK`."""
    with Ledger(url) as ledger:
        i = 0
        while True:
            started = time.perf_counter()
            for n in range(i, i + CHUNK):
                ledger.accept(f"k{n}", "notify", {**PAYLOAD, "n": n})
            yield time.perf_counter() - started
            i += CHUNK


def traffic(url: str) -> dict[str, int]:
    """Statements and round trips of one accept, after a warm-up (past psycopg's prepare)."""
    with Ledger(url) as ledger:
        for n in range(8):
            ledger.accept(f"warm-{n}", "notify", PAYLOAD)
        db: Any = ledger.store.db
        conn = db.fresh_conn() if hasattr(db, "fresh_conn") else db.conn()
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "trace"
            with path.open("w") as out:
                conn.pgconn.trace(out.fileno())
                try:
                    ledger.accept("traced", "notify", PAYLOAD)
                finally:
                    conn.pgconn.untrace()
            lines = path.read_text().splitlines()
    sent = [line.split("\t")[3] for line in lines if "\tF\t" in line]
    return {
        "statements": sum(1 for m in sent if m in ("Execute", "Query")),
        "round_trips": sum(1 for m in sent if m in ("Sync", "Query")),
    }


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


class Schemas:
    """A fresh schema per workload, dropped at the end."""

    def __init__(self, url: str) -> None:
        self.url, self.names = url, []
        self.tag = f"{os.getpid()}_{int(time.time())}"

    def __call__(self, name: str) -> str:
        import psycopg

        from oncewire.lab.fixtures import with_search_path

        schema = f"oncewire_accept_bench_{self.tag}_{name}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
        self.names.append(schema)
        return with_search_path(self.url, schema)

    def drop(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            for schema in self.names:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--db", required=True, help="postgresql://... a database to create schemas in"
    )
    parser.add_argument("--repeat", type=int, default=5, metavar="N", help="rounds (default 5)")
    parser.add_argument("-n", type=int, default=2000, help="accepts (and floor commits) per round")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.n < CHUNK:
        parser.error(f"--repeat must be at least 1 and -n at least {CHUNK}")
    schemas = Schemas(args.db)
    rounds: list[dict[str, float]] = []
    try:
        for number in range(1, args.repeat + 1):
            progress(f"round {number}/{args.repeat}: {args.n:,} floor commits and accepts, in turn")
            floor, accept = (
                floor_steps(schemas(f"floor{number}")),
                accept_steps(schemas(f"a{number}")),
            )
            spent = [0.0, 0.0]
            try:
                for _ in range(args.n // CHUNK):
                    spent[0] += next(floor)
                    spent[1] += next(accept)
            finally:
                floor.close()
                accept.close()
            done = args.n // CHUNK * CHUNK
            rounds.append(
                {"floor": done / spent[0], "accept": done / spent[1], "ratio": spent[0] / spent[1]}
            )
        counted = traffic(schemas("traffic"))
    finally:
        schemas.drop()
    floor_rate = statistics.median(r["floor"] for r in rounds)
    accept_rate = statistics.median(r["accept"] for r in rounds)
    ratio = statistics.median(r["ratio"] for r in rounds)
    print(
        f"oncewire {oncewire.__version__}, {args.repeat} round(s), medians; the floor and "
        f"accept take turns {CHUNK} at a time"
    )
    print(f"{'figure':8} {'value':>12} {'ratio':>7} {'bound':>6}  per accept (counted)")
    print(f"{'floor':8} {floor_rate:>8,.0f} c/s {'1.00x':>7} {'-':>6}  1 statement, 1 round trip")
    print(
        f"{'accept':8} {accept_rate:>8,.0f} e/s {ratio:>6.2f}x {'1.00x':>6}  "
        f"{_plural(counted['statements'], 'statement')}, "
        f"{_plural(counted['round_trips'], 'round trip')}"
    )
    print("round ratios: " + ", ".join(f"{r['ratio']:.2f}" for r in rounds))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "oncewire": oncewire.__version__,
                    "chunk": CHUNK,
                    "rounds": rounds,
                    "floor_commits_per_second": floor_rate,
                    "accepts_per_second": accept_rate,
                    "ratio": ratio,
                    "bound": 1.0,
                    "per_accept": counted,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
