#!/usr/bin/env python3
"""LangGraph checkpointer benchmarks: OncewireSaver against the upstream savers, in one run.

    .venv/bin/python benchmarks/langgraph_bench.py [--quick | --scale S] [--rounds N] [--json FILE]
    .venv/bin/python benchmarks/langgraph_bench.py --pg postgresql://127.0.0.1:5432/test

Four figures per backend, each OncewireSaver's throughput over the upstream saver's measured
in the same round (SQLite: ``SqliteSaver`` on a file of its own, as ``from_conn_string`` opens
it; PostgreSQL: ``PostgresSaver`` in a schema of its own on the same server):

* put/s: checkpoints put one after another on one thread, each the child of the one before;
* put_writes/s: one task's two writes per call, each call a new task on one checkpoint;
* get_tuple/s: the thread's latest checkpoint with its writes, read again and again;
* steps/s: a 10-step graph (``graph.invoke``, default durability) run on new threads.

Then the tool-node figures (:mod:`langgraph_tools`): an agent graph run with one tool call
and with five, DurableToolNode against ToolNode under the same saver, as milliseconds per run
and their ratio. ``--only savers`` or ``--only tools`` runs one half.

Each round runs upstream then oncewire for every workload, on fresh stores; the table shows
the median per-round values and the median of the per-round ratios (oncewire / upstream; the
goal is at least 1.0x). The durability settings each saver runs with are reported (SQLite's
``synchronous`` read back from each file's connection). Progress goes to stderr, the table to
stdout. Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import operator
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

HERE = Path(__file__).resolve().parent
try:
    import oncewire
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(HERE.parent / "src"))
    import oncewire

from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from oncewire.langgraph import OncewireSaver  # noqa: E402
from oncewire.ledger import Ledger  # noqa: E402

sys.path.insert(0, str(HERE))
from langgraph_tools import measure_tools, tool_rows  # noqa: E402

WORKLOADS = ("put", "put_writes", "get_tuple", "steps")
STATE = {"messages": ["the quick brown fox jumps over the lazy dog"] * 4, "n": 0}


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def ten_steps() -> Any:
    g = StateGraph(State)
    names = [f"s{i}" for i in range(10)]
    for name in names:
        g.add_node(name, lambda s, name=name: {"log": [name]})
    g.add_edge(START, names[0])
    for a, b in itertools.pairwise(names):
        g.add_edge(a, b)
    g.add_edge(names[-1], END)
    return g


# -- the savers ------------------------------------------------------------------------------
@contextlib.contextmanager
def upstream_sqlite(folder: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = folder / f"upstream-{uuid.uuid4().hex[:8]}.db"
    with SqliteSaver.from_conn_string(str(path)) as saver:
        saver.setup()
        sync = saver.conn.execute("PRAGMA synchronous").fetchone()[0]
        journal = saver.conn.execute("PRAGMA journal_mode").fetchone()[0]
        yield saver, {"journal_mode": journal, "synchronous": sync}


@contextlib.contextmanager
def oncewire_sqlite(folder: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
    path = folder / f"oncewire-{uuid.uuid4().hex[:8]}.db"
    with Ledger(str(path)) as ledger:
        conn = sqlite3.connect(path)
        try:
            journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
        finally:
            conn.close()
        health = ledger.store.health()
        yield OncewireSaver(ledger), {"journal_mode": journal, "synchronous": health["synchronous"]}


@contextlib.contextmanager
def _schema(url: str, name: str) -> Iterator[str]:
    import psycopg

    from oncewire.lab.fixtures import with_search_path

    schema = f"oncewire_lg_bench_{os.getpid()}_{name}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
    try:
        yield with_search_path(url, schema)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


def upstream_postgres(url: str) -> Callable[[Path], Any]:
    @contextlib.contextmanager
    def open_(folder: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
        from langgraph.checkpoint.postgres import PostgresSaver

        with _schema(url, "up") as where, PostgresSaver.from_conn_string(where) as saver:
            saver.setup()
            sync = saver.conn.execute("SHOW synchronous_commit").fetchone()
            yield saver, {"synchronous_commit": next(iter(sync.values()))}

    return open_


def oncewire_postgres(url: str) -> Callable[[Path], Any]:
    @contextlib.contextmanager
    def open_(folder: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
        with _schema(url, "ow") as where, Ledger(where) as ledger:
            with ledger.store.transaction() as tx:
                sync = tx.execute("SHOW synchronous_commit").fetchone()[0]
            yield OncewireSaver(ledger), {"synchronous_commit": sync}

    return open_


def ledger_postgres(url: str) -> Callable[[Path], Any]:
    """A fresh ledger in a schema of its own, for the tool-node figures."""

    @contextlib.contextmanager
    def open_(folder: Path) -> Iterator[Ledger]:
        with _schema(url, "tl") as where, Ledger(where) as ledger:
            yield ledger

    return open_


# -- the workloads ---------------------------------------------------------------------------
def _config(thread_id: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _checkpoint(saver: Any, previous: dict[str, Any] | None, n: int) -> dict[str, Any]:
    cp = dict(empty_checkpoint()) if previous is None else dict(previous)
    cp["id"] = str(uuid.uuid4()) if previous is None else _next_id()
    version = saver.get_next_version(
        None if previous is None else previous["channel_versions"].get("n"), None
    )
    cp["channel_values"] = {**STATE, "n": n}
    cp["channel_versions"] = {"messages": version, "n": version}
    return cp


def _next_id() -> str:
    from langgraph.checkpoint.base.id import uuid6

    return str(uuid6(clock_seq=-1))


def run_put(saver: Any, count: int) -> float:
    thread = uuid.uuid4().hex
    parent: str | None = None
    previous: dict[str, Any] | None = None
    started = time.perf_counter()
    for n in range(count):
        cp = _checkpoint(saver, previous, n)
        cp["id"] = _next_id()
        stored = saver.put(
            _config(thread, parent),
            cp,
            {"source": "loop", "step": n, "parents": {}},
            cp["channel_versions"],
        )
        parent, previous = stored["configurable"]["checkpoint_id"], cp
    return count / (time.perf_counter() - started)


def _one_checkpoint(saver: Any) -> tuple[str, dict[str, Any]]:
    thread = uuid.uuid4().hex
    cp = _checkpoint(saver, None, 0)
    cp["id"] = _next_id()
    stored = saver.put(
        _config(thread), cp, {"source": "input", "step": -1, "parents": {}}, cp["channel_versions"]
    )
    return thread, stored


def run_put_writes(saver: Any, count: int) -> float:
    _, stored = _one_checkpoint(saver)
    started = time.perf_counter()
    for n in range(count):
        saver.put_writes(
            stored,
            [("messages", ["a reply"]), ("branch:to:next", None)],
            f"task-{n}",
            f"~__pregel_pull, node{n}",
        )
    return count / (time.perf_counter() - started)


def run_get_tuple(saver: Any, count: int) -> float:
    thread, stored = _one_checkpoint(saver)
    saver.put_writes(stored, [("messages", ["a reply"])], "task-0", "~__pregel_pull, a")
    config = _config(thread)
    assert saver.get_tuple(config) is not None
    started = time.perf_counter()
    for _ in range(count):
        saver.get_tuple(config)
    return count / (time.perf_counter() - started)


def run_steps(saver: Any, count: int) -> float:
    app = ten_steps().compile(checkpointer=saver)
    runs = max(1, count // 10)
    started = time.perf_counter()
    for _ in range(runs):
        app.invoke({"log": []}, {"configurable": {"thread_id": uuid.uuid4().hex}})
    return runs * 10 / (time.perf_counter() - started)


RUNNERS: dict[str, Callable[[Any, int], float]] = {
    "put": run_put,
    "put_writes": run_put_writes,
    "get_tuple": run_get_tuple,
    "steps": run_steps,
}
COUNTS = {"put": 1000, "put_writes": 1000, "get_tuple": 5000, "steps": 300}


def measure(
    backend: str,
    upstream: Callable[[Path], Any],
    ours: Callable[[Path], Any],
    folder: Path,
    rounds: int,
    scale: float,
) -> dict[str, Any]:
    per: dict[str, dict[str, list[float]]] = {
        w: {"upstream": [], "oncewire": [], "ratio": []} for w in WORKLOADS
    }
    settings: dict[str, Any] = {}
    for r in range(rounds):
        for workload in WORKLOADS:
            count = max(20, int(COUNTS[workload] * scale))
            got: dict[str, float] = {}
            for name, opener in (("upstream", upstream), ("oncewire", ours)):
                with opener(folder) as (saver, facts):
                    settings[name] = facts
                    RUNNERS[workload](saver, max(10, count // 10))  # warm up
                    got[name] = RUNNERS[workload](saver, count)
            per[workload]["upstream"].append(got["upstream"])
            per[workload]["oncewire"].append(got["oncewire"])
            per[workload]["ratio"].append(got["oncewire"] / got["upstream"])
            progress(
                f"[{backend} round {r + 1}/{rounds}] {workload}: upstream "
                f"{got['upstream']:,.0f}/s, oncewire {got['oncewire']:,.0f}/s "
                f"({got['oncewire'] / got['upstream']:.2f}x)"
            )
    return {
        "backend": backend,
        "settings": settings,
        "figures": {
            w: {
                "upstream_per_s": statistics.median(v["upstream"]),
                "oncewire_per_s": statistics.median(v["oncewire"]),
                "ratio": statistics.median(v["ratio"]),
                "ratios": v["ratio"],
            }
            for w, v in per.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale",
        type=float,
        default=0.4,
        help="the share of COUNTS each round runs (default 0.4: about two minutes with --pg)",
    )
    parser.add_argument("--quick", action="store_true", help="--scale 0.1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pg", metavar="URL", help="also PostgreSQL, on this server")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON here too")
    parser.add_argument("--dir", help="where the SQLite files go (default: a temporary folder)")
    parser.add_argument("--only", choices=["savers", "tools"], help="run one half only")
    args = parser.parse_args(argv)
    scale = 0.1 if args.quick else args.scale
    results = []
    tools = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        if args.only != "tools":
            results.append(
                measure("sqlite", upstream_sqlite, oncewire_sqlite, folder, args.rounds, scale)
            )
        if args.pg and args.only != "tools":
            results.append(
                measure(
                    "postgresql",
                    upstream_postgres(args.pg),
                    oncewire_postgres(args.pg),
                    folder,
                    args.rounds,
                    scale,
                )
            )
        if args.only != "savers":
            tools.append(measure_tools("sqlite", None, folder, args.rounds, scale))
            if args.pg:
                tools.append(
                    measure_tools(
                        "postgresql", ledger_postgres(args.pg), folder, args.rounds, scale
                    )
                )
    print(f"{'backend':<11} {'figure':<11} {'upstream/s':>11} {'oncewire/s':>11} {'ratio':>7}")
    for result in results:
        for name, f in result["figures"].items():
            print(
                f"{result['backend']:<11} {name:<11} {f['upstream_per_s']:>11,.0f} "
                f"{f['oncewire_per_s']:>11,.0f} {f['ratio']:>6.2f}x"
            )
        print(f"{'':<11} settings: {json.dumps(result['settings'], sort_keys=True)}")
    if tools:
        print("\n".join(tool_rows(tools)))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "benchmark": "langgraph",
                    "when": datetime.datetime.now(datetime.UTC).isoformat(),
                    "oncewire": oncewire.__version__,
                    "python": platform.python_version(),
                    "rounds": args.rounds,
                    "quick": args.quick,
                    "scale": scale,
                    "results": results,
                    "tools": tools,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
