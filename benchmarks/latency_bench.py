#!/usr/bin/env python3
"""How long an agent waits: accept to sink, accept to done, and a tool call's round trip.

    .venv/bin/python benchmarks/latency_bench.py [-n 200] [--backend sqlite|postgresql|both]
        [--db postgresql://...] [--json FILE]

For each backend, one at a time and with the dispatcher's defaults as a user gets them
(``Dispatcher(ledger, sinks)``, nothing tuned):

- ``floor``: one raw INSERT and its commit (sqlite3 with oncewire's pragmas; psycopg autocommit);
- ``accept->sink``: from just before ``Ledger.accept`` returns control to the caller's clock
  start to the moment the sink is called (``time.monotonic()``, comparable across processes on
  one host), with the dispatcher in the same process (a thread) and in another process;
- ``accept->done``: until another connection of the caller's process, polling the effect's
  row every 0.1 ms with plain SQL, sees it ``done``;
- ``toolcalls.call``: the round trip of :func:`oncewire.toolcalls.call` with one no-op tool call.

Each figure is reported as p50/p90/p99 in milliseconds and as a multiple of the floor's p50
measured in the same run. Samples are taken one after another with a short pause between them,
so each measures an idle dispatcher waking for new work. Progress goes to stderr, the table to
stdout; timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
try:
    import oncewire
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(HERE.parent / "src"))
    import oncewire

from common import raw_connect  # noqa: E402
from oncewire import Dispatcher, Ledger  # noqa: E402

KIND = "noop"
TOOL = "tool.noop"
PAUSE_SECONDS = 0.005  # between samples: the dispatcher goes idle again
DEFAULT_PG = os.environ.get("ONCEWIRE_TEST_PG", "postgresql://127.0.0.1:5432/test")


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": statistics.median(ordered), "p90": at(0.90), "p99": at(0.99), "n": len(ordered)}


# -- where the figures run -------------------------------------------------------------------


@contextmanager
def sqlite_target(folder: Path, name: str) -> Iterator[str]:
    yield str(folder / f"{name}.db")


@contextmanager
def pg_target(url: str, name: str) -> Iterator[str]:
    import psycopg

    from oncewire.lab.fixtures import with_search_path

    schema = f"oncewire_latency_{name}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
    try:
        yield with_search_path(url, schema)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


def floor_samples(backend: str, where: str, n: int) -> list[float]:
    """Seconds of one raw INSERT and its commit, ``n`` times."""
    samples: list[float] = []
    if backend == "sqlite":
        conn = raw_connect(where)
        conn.execute("CREATE TABLE floor (id INTEGER PRIMARY KEY, key TEXT, payload TEXT)")
        for i in range(n):
            started = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO floor (key, payload) VALUES (?, ?)", (f"k{i}", "{}"))
            conn.execute("COMMIT")
            samples.append(time.perf_counter() - started)
        conn.close()
        return samples
    import psycopg

    with psycopg.connect(where, autocommit=True) as pconn:
        pconn.execute("CREATE TABLE floor (id BIGSERIAL PRIMARY KEY, key TEXT, payload TEXT)")
        for i in range(n):
            started = time.perf_counter()
            pconn.execute("INSERT INTO floor (key, payload) VALUES (%s, %s)", (f"k{i}", "{}"))
            samples.append(time.perf_counter() - started)
    return samples


def done_reader(backend: str, where: str) -> Callable[[str], bool]:
    """A plain connection of its own that says whether an effect's row is ``done``."""
    if backend == "sqlite":
        conn = sqlite3.connect(where, isolation_level=None, timeout=10, check_same_thread=False)

        def sqlite_done(key: str) -> bool:
            sql = "SELECT state FROM oncewire_effects WHERE key = ?"
            row = conn.execute(sql, (key,)).fetchone()
            return row is not None and row[0] == "done"

        return sqlite_done
    import psycopg

    pconn = psycopg.connect(where, autocommit=True)

    def pg_done(key: str) -> bool:
        row = pconn.execute("SELECT state FROM oncewire_effects WHERE key = %s", (key,)).fetchone()
        return row is not None and row[0] == "done"

    return pg_done


class Calls:
    """When each key's sink was first called (monotonic seconds), wherever it ran."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.cond = threading.Condition()

    def record(self, key: str, when: float) -> None:
        with self.cond:
            self.at.setdefault(key, when)
            self.cond.notify_all()

    def wait(self, key: str, timeout: float = 30.0) -> float:
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.at, timeout):
                raise TimeoutError(f"the sink was not called for {key} within {timeout} s")
            return self.at[key]


def in_process_dispatcher(ledger: Ledger, calls: Calls) -> tuple[Dispatcher, threading.Thread]:
    def sink(attempt: Any) -> dict[str, bool]:
        calls.record(attempt.key, time.monotonic())
        return {"ok": True}

    dispatcher = Dispatcher(ledger, {KIND: sink, TOOL: sink})
    thread = threading.Thread(
        target=lambda: dispatcher.run(handle_signals=False), name="bench-dispatcher", daemon=True
    )
    thread.start()
    return dispatcher, thread


CHILD = """
import sys, threading, time
from oncewire import Dispatcher, Ledger

ledger = Ledger(sys.argv[1], create=False)
def sink(attempt):
    print(attempt.key, repr(time.monotonic()), flush=True)
    return {"ok": True}
dispatcher = Dispatcher(ledger, {"noop": sink, "tool.noop": sink})
def watch():
    sys.stdin.read()
    dispatcher.stop()
threading.Thread(target=watch, daemon=True).start()
print("ready", flush=True)
dispatcher.run(handle_signals=False)
ledger.close()
"""


@contextmanager
def other_process_dispatcher(where: str, calls: Calls) -> Iterator[None]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "src"), env.get("PYTHONPATH", "")])
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, where],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None and child.stdin is not None
    if child.stdout.readline().strip() != "ready":
        child.kill()
        raise RuntimeError("the dispatcher process did not start")

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            key, when = line.split()
            calls.record(key, float(when))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        reader.join(timeout=5)


def accept_samples(
    ledger: Ledger, calls: Calls, is_done: Callable[[str], bool], n: int, tag: str
) -> tuple[list[float], list[float]]:
    """(accept->sink, accept->done) in seconds, ``n`` samples each."""
    to_sink: list[float] = []
    to_done: list[float] = []
    for i in range(n):
        key = f"{tag}/{i}"
        started = time.monotonic()
        ledger.accept(key, KIND, {"n": i})
        to_sink.append(calls.wait(key) - started)
        while not is_done(key):
            time.sleep(0.0001)
        to_done.append(time.monotonic() - started)
        time.sleep(PAUSE_SECONDS)
    return to_sink, to_done


def toolcall_samples(ledger: Ledger, n: int, tag: str) -> list[float]:
    from oncewire import toolcalls

    samples: list[float] = []
    for i in range(n):
        call = {"id": f"call_{i}", "function": {"name": "noop", "arguments": "{}"}}
        started = time.monotonic()
        messages = toolcalls.call(ledger, f"{tag}-turn-{i}", [call], wait_seconds=60)
        samples.append(time.monotonic() - started)
        if '"ok": true' not in messages[0]["content"]:
            raise RuntimeError(f"the tool call did not succeed: {messages[0]}")
        time.sleep(PAUSE_SECONDS)
    return samples


def measure(backend: str, target: Callable[[str], Any], n: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    progress(f"{backend}: floor, {n} commits")
    with target("floor") as where:
        figures["floor"] = percentiles(floor_samples(backend, where, n))
    for placement in ("same process", "other process"):
        progress(f"{backend}: dispatcher in the {placement}, {n} accepts and {n} tool calls")
        with target(placement.replace(" ", "_")) as where, Ledger(where) as ledger:
            calls = Calls()
            is_done = done_reader(backend, where)
            if placement == "same process":
                dispatcher, thread = in_process_dispatcher(ledger, calls)
                try:
                    sink, done = accept_samples(ledger, calls, is_done, n, "a")
                    tool = toolcall_samples(ledger, n, "t")
                finally:
                    dispatcher.stop()
                    thread.join(timeout=30)
            else:
                with other_process_dispatcher(where, calls):
                    sink, done = accept_samples(ledger, calls, is_done, n, "a")
                    tool = toolcall_samples(ledger, n, "t")
            figures[f"accept->sink, {placement}"] = percentiles(sink)
            figures[f"accept->done, {placement}"] = percentiles(done)
            figures[f"toolcalls.call, {placement}"] = percentiles(tool)
    return figures


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"oncewire {oncewire.__version__}: latency in ms (p50 / p90 / p99) and p50 as a multiple "
        "of the same run's floor commit p50",
        f"{'backend':10} {'figure':34} {'p50':>8} {'p90':>8} {'p99':>8} {'x floor':>9}",
    ]
    for backend, figures in results.items():
        floor = figures["floor"]["p50"]
        for name, f in figures.items():
            lines.append(
                f"{backend:10} {name:34} {f['p50'] * 1e3:8.2f} {f['p90'] * 1e3:8.2f} "
                f"{f['p99'] * 1e3:8.2f} {f['p50'] / floor:8.1f}x"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="samples per figure (default 200)")
    parser.add_argument(
        "--backend", choices=("sqlite", "postgresql", "both"), default="sqlite", help="(sqlite)"
    )
    parser.add_argument("--db", default=DEFAULT_PG, help=f"PostgreSQL server ({DEFAULT_PG})")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("-n must be at least 1")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="oncewire-latency-") as folder:
        if args.backend in ("sqlite", "both"):
            results["sqlite"] = measure(
                "sqlite", lambda name: sqlite_target(Path(folder), name), args.n
            )
        if args.backend in ("postgresql", "both"):
            results["postgresql"] = measure(
                "postgresql", lambda name: pg_target(args.db, name), args.n
            )
    print(table(results))
    if args.json:
        args.json.write_text(
            json.dumps({"oncewire": oncewire.__version__, "figures": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
