#!/usr/bin/env python3
"""What ``oncewire mcp proxy`` adds to a tool call: calls through it against the same server
called directly, and against the store's floor commit, in one run.

    .venv/bin/python benchmarks/mcp_bench.py [-n 200] [--backend sqlite|postgresql|both]
        [--db postgresql://...] [--json FILE]

The client is the official SDK's (``ClientSession`` over ``stdio_client``), one call after
another, each ``create_ticket`` with a new key in ``params._meta["io.oncewire/idempotency-key"]``,
against the lab's two servers (:mod:`oncewire.lab.children.mcp_servers`, each a process of its
own): the plain ``log`` server (a fsynced line per call) and the ``tickets`` server (each call
a ticket row and a receipt committed by ``oncewire.mcp.once``, its store on the backend). For
each backend and server, with the servers' and the proxy's defaults:

- ``direct``: the client starts the server itself;
- ``proxy``: the client starts ``oncewire mcp proxy --db STORE -- SERVER`` (a new store);
- ``floor``: one raw INSERT and its commit on the backend (latency_bench's ``floor_samples``).

Each figure is calls per second (n over the whole loop) and p50/p99 milliseconds per call; the
proxy's added latency is its p50 (p99) less the direct p50 (p99), also as a multiple of the
floor's p50. The proxied calls are then split by the store's own timestamps (the effect's
``created_at``, its attempt's ``started_at`` and ``finished_at``, on the same host clock as
the client's ``time.time()``): client to accept, accept to the server's call (the accept's
commit, the dispatcher's claim), the server's call as the proxy sees it, and settle to the
client (the settle's commit, the wake-up, the answer). The first ``--warmup`` calls of each
loop are not counted. Progress goes to stderr, the table to stdout; timings are reported,
never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
try:
    import oncewire
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(HERE.parent / "src"))
    import oncewire

import anyio  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

sys.path.insert(0, str(HERE))
from latency_bench import floor_samples, percentiles, pg_target, sqlite_target  # noqa: E402
from oncewire.lab.fixtures import rows  # noqa: E402
from oncewire.mcp.protocol import IDEMPOTENCY_KEY  # noqa: E402

SERVERS = "oncewire.lab.children.mcp_servers"
TOOL = "create_ticket"
DEFAULT_PG = os.environ.get("ONCEWIRE_TEST_PG", "postgresql://127.0.0.1:5432/test")
SEGMENTS = ("to_accept", "accept_to_call", "server_call", "settle_to_client")


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def server_argv(server: str, folder: Path, store: str) -> list[str]:
    if server == "log":
        return [sys.executable, "-m", SERVERS, "log", "--log", str(folder / "calls.jsonl")]
    return [sys.executable, "-m", SERVERS, "tickets", "--store", store]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_CRASH")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "src"), env.get("PYTHONPATH", "")])
    return env


async def _loop(argv: list[str], n: int, warmup: int, tag: str) -> dict[str, Any]:
    """``warmup + n`` calls one after another; per counted call its key and client times."""
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=_env())
    calls: list[dict[str, Any]] = []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        began = 0.0
        for i in range(warmup + n):
            if i == warmup:
                began = time.perf_counter()
            key = f"bench/{tag}/{i}"
            sent_wall, sent = time.time(), time.perf_counter()
            result = await session.call_tool(
                TOOL, {"title": f"bench call {i}"}, meta={IDEMPOTENCY_KEY: key}
            )
            took = time.perf_counter() - sent
            if result.is_error:
                raise RuntimeError(f"{tag}: call {i} failed: {result.content}")
            if i >= warmup:
                calls.append(
                    {"key": key, "seconds": took, "sent": sent_wall, "received": time.time()}
                )
        elapsed = time.perf_counter() - began
    return {"calls": calls, "elapsed": elapsed}


def measure(argv: list[str], n: int, warmup: int, tag: str) -> dict[str, Any]:
    return anyio.run(_loop, argv, n, warmup, tag)


def segments(dialect: str, store: str, calls: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The proxied calls split by the store's timestamps (seconds, per segment)."""
    found = rows(
        dialect,
        store,
        "SELECT e.key, e.created_at, a.started_at, a.finished_at FROM oncewire_effects e "
        "JOIN oncewire_attempts a ON a.effect_id = e.id",
    )
    stamps = {r["key"]: r for r in found}
    split: dict[str, list[float]] = {name: [] for name in SEGMENTS}
    for call in calls:
        row = stamps.get(call["key"])
        if row is None or row["started_at"] is None:
            continue
        split["to_accept"].append(row["created_at"] - call["sent"])
        split["accept_to_call"].append(row["started_at"] - row["created_at"])
        split["server_call"].append(row["finished_at"] - row["started_at"])
        split["settle_to_client"].append(call["received"] - row["finished_at"])
    return {name: percentiles(values) for name, values in split.items() if values}


@contextmanager
def target(backend: str, folder: Path, url: str, name: str) -> Iterator[str]:
    if backend == "sqlite":
        with sqlite_target(folder, name) as where:
            yield where
    else:
        with pg_target(url, name) as where:
            yield where


def run_backend(backend: str, url: str, folder: Path, n: int, warmup: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with target(backend, folder, url, "floor") as where:
        progress(f"{backend}: floor, {n} commits")
        floor = percentiles(floor_samples(backend, where, n))
    figures["floor"] = {"p50_ms": floor["p50"] * 1e3, "p99_ms": floor["p99"] * 1e3}
    for server in ("log", "tickets"):
        run = uuid.uuid4().hex[:6]
        with (
            target(backend, folder, url, f"direct_{server}_{run}") as direct_store,
            target(backend, folder, url, f"proxy_{server}_{run}") as proxy_store,
            target(backend, folder, url, f"proxied_{server}_{run}") as served_store,
        ):
            progress(f"{backend}: {server} server, {n} calls directly")
            direct = measure(server_argv(server, folder, direct_store), n, warmup, f"d{run}")
            progress(f"{backend}: {server} server, {n} calls through the proxy")
            proxy_argv = [
                sys.executable, "-m", "oncewire", "mcp", "proxy", "--db", proxy_store, "--",
                *server_argv(server, folder, served_store),
            ]  # fmt: skip
            proxied = measure(proxy_argv, n, warmup, f"p{run}")
            dialect = "postgresql" if backend == "postgresql" else "sqlite"
            split = segments(dialect, proxy_store, proxied["calls"])
        d = percentiles([c["seconds"] for c in direct["calls"]])
        p = percentiles([c["seconds"] for c in proxied["calls"]])
        figures[server] = {
            "direct": {
                "calls_per_second": n / direct["elapsed"],
                "p50_ms": d["p50"] * 1e3,
                "p99_ms": d["p99"] * 1e3,
            },
            "proxy": {
                "calls_per_second": n / proxied["elapsed"],
                "p50_ms": p["p50"] * 1e3,
                "p99_ms": p["p99"] * 1e3,
            },
            "added_p50_ms": (p["p50"] - d["p50"]) * 1e3,
            "added_p99_ms": (p["p99"] - d["p99"]) * 1e3,
            "added_p50_floors": (p["p50"] - d["p50"]) / floor["p50"],
            "segments_ms": {
                name: {"p50": v["p50"] * 1e3, "p99": v["p99"] * 1e3} for name, v in split.items()
            },
        }
    return figures


def print_table(results: dict[str, Any], n: int) -> None:
    print(f"oncewire {oncewire.__version__} mcp proxy, {n} sequential calls per loop")
    header = f"{'backend':10} {'server':8} {'path':7} {'calls/s':>8} {'p50 ms':>8} {'p99 ms':>8}"
    print(header + f"  {'added p50/p99 ms':>17} {'x floor':>8}")
    for backend, figures in results.items():
        floor = figures["floor"]
        print(
            f"{backend:10} {'-':8} {'floor':7} {'-':>8} {floor['p50_ms']:8.2f} "
            f"{floor['p99_ms']:8.2f}"
        )
        for server in ("log", "tickets"):
            f = figures[server]
            for path in ("direct", "proxy"):
                row = f[path]
                line = (
                    f"{backend:10} {server:8} {path:7} {row['calls_per_second']:8.1f} "
                    f"{row['p50_ms']:8.2f} {row['p99_ms']:8.2f}"
                )
                if path == "proxy":
                    added = f"{f['added_p50_ms']:.2f}/{f['added_p99_ms']:.2f}"
                    line += f"  {added:>17} {f['added_p50_floors']:7.1f}x"
                print(line)
            split = ", ".join(f"{name} {v['p50']:.2f}" for name, v in f["segments_ms"].items())
            print(f"{'':10} {server:8} {'split':7} p50 ms: {split}")


# What each segment of a proxied call holds, on the proxy's code path (oncewire.mcp.proxy and
# oncewire.mcp.proxy_dispatch): the closing note names them with their measured share.
SEGMENT_PATH = {
    "to_accept": "the client's line into the proxy, parsed, the tools/list check, the accept "
    "transaction begun on a worker thread",
    "accept_to_call": "the accept's commit, the dispatcher thread woken, the claim and its "
    "start mark committed",
    "server_call": "the hop from the dispatcher thread to the event loop, the request to the "
    "server, its work and its answer back",
    "settle_to_client": "the settle's commit, the waiting call woken, the effect read back "
    "and the answer written to the client",
}
COMMITS_PER_CALL = 3  # accept; claim with its start mark; settle


def closing_note(results: dict[str, Any]) -> list[str]:
    """Where the proxy's added time goes: what each segment of the split holds on the proxy's
    code path, then per backend and server the added p50 as the sum of its parts (the server's
    call counted only beyond the direct call's p50) and the share of the store's commits."""
    lines = ["", "Where the proxy's added time goes (p50 ms; the split by the store's stamps):"]
    lines += [f"  {name:16} {SEGMENT_PATH[name]}" for name in SEGMENTS]
    for backend, figures in results.items():
        for server in ("log", "tickets"):
            f = figures[server]
            split = {name: v["p50"] for name, v in f["segments_ms"].items()}
            if set(split) != set(SEGMENTS):
                continue
            beyond = split["server_call"] - f["direct"]["p50_ms"]
            commits = split["accept_to_call"] + split["settle_to_client"]
            added = f["added_p50_ms"]
            share = f" ({commits / added:.0%} of it)" if added > 0 else ""
            lines.append(
                f"  {backend}/{server}: +{added:.2f} ~ to_accept {split['to_accept']:.2f}"
                f" + accept_to_call {split['accept_to_call']:.2f}"
                f" + server_call beyond the direct call {beyond:.2f}"
                f" + settle_to_client {split['settle_to_client']:.2f};"
                f" the segments with the commits {commits:.2f}{share}"
            )
    lines.append(
        f"  Per call the proxy commits {COMMITS_PER_CALL} transactions (the accept, the claim "
        "with its start mark, the settle) and reads the effect back once, each through a thread "
        "hand-off; the rest is one more process hop each way (client to proxy to server)."
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n", 1)[0].split()),
    )
    parser.add_argument("-n", type=int, default=200, help="counted calls per loop")
    parser.add_argument("--warmup", type=int, default=10, help="uncounted calls first")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="sqlite")
    parser.add_argument("--db", default=DEFAULT_PG, help="PostgreSQL URL (for postgresql)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="oncewire-mcp-bench-") as folder:
        for backend in backends:
            results[backend] = run_backend(backend, args.db, Path(folder), args.n, args.warmup)
    print_table(results, args.n)
    note = closing_note(results)
    print("\n".join(note))
    if args.json is not None:
        document = {
            "benchmark": "mcp_proxy",
            "oncewire": oncewire.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "n": args.n,
            "warmup": args.warmup,
            "results": results,
            "note": "\n".join(note).strip(),
        }
        args.json.write_text(json.dumps(document, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
