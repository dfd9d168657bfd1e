#!/usr/bin/env python3
"""Eight threads accepting, with and without group_commit=True, against the one-thread floor.

    .venv/bin/python benchmarks/group_bench.py [--pg postgresql://...] [--threads 8] [-n 2000]
        [--repeat 3] [--json FILE]

Each round measures, one after another on the same disk (and server):

- ``floor``: the raw single-thread commit rate, one INSERT per transaction, ``synchronous=FULL``
  (SQLite: plain sqlite3 with oncewire's pragmas; PostgreSQL: psycopg, autocommit);
- ``threads``: ``Ledger.accept`` from ``--threads`` threads of one process, each accept its own
  transaction, as oncewire runs by default;
- ``grouped``: the same with ``Ledger(..., group_commit=True)``.

A figure's ratio is its rate over the floor of the same round; the table shows the medians over
the rounds, and for ``grouped`` on SQLite the mean number of callers per shared commit. Every
accept is counted back from the store afterwards. Progress goes to stderr, the table to stdout;
timings are reported, never asserted. The goal: ``grouped`` at 3x the floor or more.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import oncewire
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(HERE.parent / "src"))
    import oncewire

from common import KIND, effect_key, effect_payload, raw_connect, read_pragmas  # noqa: E402
from oncewire import Ledger  # noqa: E402


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def sqlite_floor(path: str, count: int) -> float:
    conn = raw_connect(path)
    try:
        found = read_pragmas(conn.execute)
        if found["synchronous"] != 2 or found["journal_mode"] != "wal":
            raise SystemExit(f"the floor runs with {found}, not WAL and synchronous=FULL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        body = json.dumps(effect_payload(0), separators=(",", ":"))
        started = time.perf_counter()
        for _ in range(count):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (body) VALUES (?)", (body,))
            conn.execute("COMMIT")
        return count / (time.perf_counter() - started)
    finally:
        conn.close()


def pg_floor(url: str, count: int) -> float:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        settings = {
            n: conn.execute(f"SHOW {n}").fetchone()[0] for n in ("fsync", "synchronous_commit")
        }  # type: ignore[index]
        if settings != {"fsync": "on", "synchronous_commit": "on"}:
            raise SystemExit(f"the server runs with {settings}: commits are not durable")
        conn.execute("CREATE TABLE t (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)")
        body = json.dumps(effect_payload(0), separators=(",", ":"))
        started = time.perf_counter()
        for _ in range(count):
            conn.execute("INSERT INTO t (body) VALUES (%s)", (body,))
        return count / (time.perf_counter() - started)


def threaded_accepts(ledger: Ledger, threads: int, count: int) -> float:
    """``count`` accepts shared among ``threads`` threads (each its own transaction)."""
    per = count // threads
    start = threading.Barrier(threads + 1)
    failures: list[BaseException] = []

    def work(thread: int) -> None:
        start.wait()
        try:
            for n in range(thread * per, (thread + 1) * per):
                ledger.accept(effect_key(n), KIND, effect_payload(n))
        except BaseException as exc:
            failures.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise SystemExit(f"an accept failed: {failures[0]!r}")
    stored = len(ledger.effects.list(limit=count + 1))
    if stored != per * threads:
        raise SystemExit(f"{stored} effects stored, {per * threads} accepted")
    return per * threads / elapsed


class Schemas:
    """A fresh PostgreSQL schema per measurement, all dropped at the end."""

    def __init__(self, url: str) -> None:
        self.url, self.names = url, []

    def __call__(self, label: str) -> str:
        import psycopg

        from oncewire.lab.fixtures import with_search_path

        name = f"oncewire_group_bench_{label}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {name}")  # type: ignore[arg-type]
        self.names.append(name)
        return with_search_path(self.url, name)

    def drop(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            for name in self.names:
                conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")  # type: ignore[arg-type]


def round_of(backend: str, where: Callable[[str], str], threads: int, count: int) -> dict[str, Any]:
    floor = sqlite_floor if backend == "sqlite" else pg_floor
    figures: dict[str, Any] = {"floor": floor(where("floor"), count)}
    with Ledger(where("threads")) as ledger:
        figures["threads"] = threaded_accepts(ledger, threads, count)
    with Ledger(where("grouped"), group_commit=True) as ledger:
        groups = getattr(ledger.store.db, "groups", None)
        before = (groups.commits, groups.committed) if groups else (0, 0)
        figures["grouped"] = threaded_accepts(ledger, threads, count)
        if groups is not None:
            commits = groups.commits - before[0]
            figures["callers_per_commit"] = (groups.committed - before[1]) / max(commits, 1)
    for name in ("threads", "grouped"):
        figures[f"{name}_ratio"] = figures[name] / figures["floor"]
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pg", metavar="URL", help="also PostgreSQL: a database to make schemas in"
    )
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("-n", type=int, default=2000, help="commits (accepts) per measurement")
    parser.add_argument("--repeat", type=int, default=3, metavar="N", help="rounds (default 3)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.n < args.threads or args.repeat < 1:
        parser.error("--threads, -n and --repeat must be positive, -n at least --threads")
    backends = ([] if args.no_sqlite else ["sqlite"]) + (["postgresql"] if args.pg else [])
    if not backends:
        parser.error("nothing to measure (--no-sqlite without --pg)")
    rounds: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
    schemas = Schemas(args.pg) if args.pg else None
    with tempfile.TemporaryDirectory(prefix="oncewire-group-bench-") as folder:
        try:
            for number in range(1, args.repeat + 1):
                for backend in backends:
                    progress(f"round {number}/{args.repeat}: {backend}, {args.n:,} per figure")
                    if backend == "sqlite":

                        def where(label: str, number: int = number) -> str:
                            return os.path.join(folder, f"{label}-{number}.db")
                    else:
                        assert schemas is not None
                        where = schemas
                    rounds[backend].append(round_of(backend, where, args.threads, args.n))
        finally:
            if schemas is not None:
                schemas.drop()
    medians = {
        backend: {key: statistics.median(r[key] for r in found if key in r) for key in found[0]}
        for backend, found in rounds.items()
    }
    print(
        f"oncewire {oncewire.__version__}, SQLite {sqlite3.sqlite_version}, {args.threads} "
        f"threads, {args.n:,} per figure, medians of {args.repeat} round(s)"
    )
    print(f"{'backend':10} {'figure':8} {'value':>13} {'ratio':>7}  notes")
    for backend, m in medians.items():
        print(f"{backend:10} {'floor':8} {m['floor']:>9,.0f} c/s {'1.00x':>7}  1 thread, raw")
        print(
            f"{backend:10} {'threads':8} {m['threads']:>9,.0f} e/s {m['threads_ratio']:>6.2f}x  "
            "Ledger.accept, a transaction each"
        )
        note = "group_commit=True"
        if "callers_per_commit" in m:
            note += f", {m['callers_per_commit']:.1f} callers per commit"
        print(
            f"{backend:10} {'grouped':8} {m['grouped']:>9,.0f} e/s {m['grouped_ratio']:>6.2f}x  "
            f"{note}"
        )
        ratios = ", ".join(f"{r['grouped_ratio']:.2f}" for r in rounds[backend])
        print(f"{backend:10} grouped round ratios: {ratios}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "oncewire": oncewire.__version__,
                    "sqlite": sqlite3.sqlite_version,
                    "threads": args.threads,
                    "n": args.n,
                    "rounds": rounds,
                    "medians": medians,
                    "goal_ratio": 3.0,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
