"""Replies through the ledger to the in-process fake platform, against the raw SQLite floor.

    .venv/bin/python benchmarks/replies_bench.py [--quick] [--json FILE]

Every workload runs in this process on fresh files in one temporary directory, with the same
pragmas (WAL, synchronous=FULL). Rows:

* ``raw SQLite floor``: one INSERT and one COMMIT per row, by hand;
* ``short reply``: admit an inbound message, commit the answer with its reply record (and the
  caller's transcript row), send it, record the acknowledgement; once to a platform that only
  counts (the ledger's own cost) and once to the journaled fake (which fsyncs every accepted
  operation, as the tests and the lab use it);
* ``streamed 8,000-char reply``: the same, streamed in 20 deltas of 400 characters to a
  Telegram-like platform (4096 UTF-16 units): a preview send, edits, a seal into a second
  message, then the final commit and delivery.

Commits are counted with SQLite's statement trace on the store's connection (every COMMIT the
store issues, the admission's included), so "commits per reply" is exact, not estimated; so are
the statements per reply (a trigger's steps, traced under their statement's text, count once)
and the WAL frames (pages) each reply's commits appended. The bound is the ratio a reply would
reach if each of its commits cost one floor commit and nothing else cost anything: 1 / commits
per reply, the admission's included (it is inside the clock).
Each workload runs ``--rounds`` times (3; 1 with ``--quick``); within a round every workload
runs in ten pieces, taking turns with the others and the floor, and each ratio is the
workload's rate over the floor's in that round; the medians are shown. Timings on shared
machines are noisy: compare rows of the same run, not runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

from oncewire import Ledger, __version__
from oncewire.replies import (
    TELEGRAM_LIKE,
    Delivered,
    PlatformProfile,
    ReplyEngine,
    SendRequest,
    WireOutcome,
)
from oncewire.storage.sqlite import SQLiteStore
from oncewire.testing import ManualClock
from oncewire.testing.fake_platform import FakePlatform

STREAM_TEXT = ("lorem ipsum dolor sit amet " * 400)[:8000]
SHORT_TEXT = "a short answer from the agent."


class CountingPlatform:
    """Accepts everything at once, in memory: what the ledger costs without a platform."""

    def __init__(self, profile: PlatformProfile) -> None:
        self._profile = profile
        self._next = 0

    @property
    def profile(self) -> PlatformProfile:
        return self._profile

    def send(self, request: SendRequest, body: str, *, marked: bool) -> WireOutcome:
        self._next += 1
        return Delivered(str(self._next))

    def edit(
        self, request: SendRequest, message_id: str, body: str, *, marked: bool
    ) -> WireOutcome:
        return Delivered(message_id)

    def delete(self, request: SendRequest, message_id: str) -> WireOutcome:
        return Delivered(message_id)


# Every workload of a round runs in this many pieces, taking turns with the others (the floor's
# included), so a slow spell of a shared machine falls on all of them alike.
PIECES = 10

Workload = Generator[float, None, dict[str, Any]]


def floor(folder: Path, rows: int) -> Workload:
    """Yields the seconds each of :data:`PIECES` pieces takes; returns the counts."""
    conn = sqlite3.connect(folder / "floor.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, text TEXT NOT NULL)")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    for piece in range(PIECES):
        started = time.perf_counter()
        for n in range(piece * rows // PIECES, (piece + 1) * rows // PIECES):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (text) VALUES (?)", (f"{SHORT_TEXT} {n}",))
            conn.execute("COMMIT")
        yield time.perf_counter() - started
    page = int(conn.execute("PRAGMA page_size").fetchone()[0])
    frames = ((folder / "floor.db-wal").stat().st_size - 32) // (page + 24)
    conn.close()
    return {
        "ops": rows,
        "commits": rows,
        "wal_frames_per_reply": frames / rows,
        "bound": 1.0,
    }


def replies(folder: Path, name: str, count: int, *, journaled: bool, streamed: bool) -> Workload:
    """Yields the seconds each of :data:`PIECES` pieces of ``count`` replies takes; returns
    the counts."""
    if count < PIECES or count % PIECES:
        raise ValueError(f"{name}: {count} replies do not make {PIECES} equal pieces")
    store = SQLiteStore(str(folder / f"{name}.db"))
    ledger = Ledger(store, clock=ManualClock())
    platform_impl: Any = (
        FakePlatform(folder / f"{name}.jsonl", TELEGRAM_LIKE, name="tg")
        if journaled
        else CountingPlatform(TELEGRAM_LIKE)
    )
    engine = ReplyEngine(ledger, {"tg": platform_impl}, edit_interval_seconds=0.0)
    with ledger.transaction() as tx:
        tx.execute("CREATE TABLE transcript (inbound_id INTEGER PRIMARY KEY, text TEXT)")
    commits = statements = 0
    previous = ""

    def trace(sql: str) -> None:
        nonlocal commits, statements, previous
        if sql != previous:
            statements += 1
        previous = sql
        if sql.strip().upper() == "COMMIT":
            commits += 1

    store.db.conn().set_trace_callback(trace)
    wal = Path(f"{folder / name}.db-wal")
    store.db.conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.db.conn().execute("PRAGMA wal_autocheckpoint = 0")  # every frame stays to be counted
    deltas = [STREAM_TEXT[i : i + 400] for i in range(0, len(STREAM_TEXT), 400)]
    per_reply_commits: list[int] = []
    started = time.perf_counter()
    for n in range(count):
        if n and n % (count // PIECES) == 0:
            yield time.perf_counter() - started
            started = time.perf_counter()
        before = commits
        inbound = ledger.inbound.admit("tg", "bot", f"chat-{n % 50}", f"m-{n}", {"n": n})
        iid = inbound.inbound.id

        def persist(tx: Any, text: str, iid: int = iid) -> None:
            tx.execute(
                "INSERT INTO transcript (inbound_id, text) VALUES (:id, :text)",
                {"id": iid, "text": text},
            )

        if streamed:
            result = engine.stream(iid, deltas, on_commit=persist)
        else:
            result = engine.answer(iid, SHORT_TEXT, on_commit=persist)
        if result.status != "delivered":
            raise SystemExit(f"{name}: reply {n} ended {result.status}")
        per_reply_commits.append(commits - before)
    yield time.perf_counter() - started
    store.db.conn().set_trace_callback(None)
    page = int(store.db.conn().execute("PRAGMA page_size").fetchone()[0])
    frames = (wal.stat().st_size - 32) // (page + 24)  # the WAL header, then frames
    store.db.conn().execute("PRAGMA wal_autocheckpoint = 1000")
    ops = sum(len(ledger.replies.ops(r.id)) for r in ledger.replies.list(limit=count))
    if journaled:
        platform_impl.close()
    ledger.close()
    return {
        "ops": count,
        "commits": commits,
        "commits_per_reply": statistics.mean(per_reply_commits),
        "commits_per_reply_without_admission": statistics.mean(per_reply_commits) - 1,
        "statements_per_reply": statements / count,
        "wal_frames_per_reply": frames / count,
        "bound": 1 / statistics.mean(per_reply_commits),
        "wire_ops_per_reply": ops / count,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--rounds", "--repeat", type=int, help="rounds per workload; the median is shown"
    )
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    short_n, stream_n, floor_n = (60, 10, 300) if args.quick else (600, 60, 3000)
    workloads: list[tuple[str, Callable[[Path], Workload]]] = [
        ("raw SQLite floor (INSERT+COMMIT)", lambda d: floor(d, floor_n)),
        (
            "short reply, ledger only",
            lambda d: replies(d, "s0", short_n, journaled=False, streamed=False),
        ),
        (
            "short reply, journaled fake",
            lambda d: replies(d, "s1", short_n, journaled=True, streamed=False),
        ),
        (
            "8,000 chars streamed (20 deltas), ledger only",
            lambda d: replies(d, "t0", stream_n, journaled=False, streamed=True),
        ),
        (
            "8,000 chars streamed (20 deltas), journaled fake",
            lambda d: replies(d, "t1", stream_n, journaled=True, streamed=True),
        ),
    ]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="oncewire-replies-bench-") as tmp:
        # Rounds interleave the workloads, so a slow spell of a shared machine hits them all.
        rounds: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in workloads}
        for round_number in range(args.rounds):
            print(
                f"round {round_number + 1}/{args.rounds}: every workload in {PIECES} pieces, "
                "in turn ...",
                file=sys.stderr,
                flush=True,
            )
            running: dict[str, Workload] = {}
            for index, (label, run) in enumerate(workloads):
                folder = Path(tmp) / f"round{round_number}-workload{index}"
                folder.mkdir()
                running[label] = run(folder)
            spent = dict.fromkeys(running, 0.0)
            for _ in range(PIECES):
                for label, workload in running.items():
                    spent[label] += next(workload)
            for label, workload in running.items():
                try:
                    next(workload)
                except StopIteration as ended:
                    figures: dict[str, Any] = ended.value
                else:
                    raise AssertionError(f"{label} has more than {PIECES} pieces")
                figures["seconds"] = spent[label]
                figures["per_second"] = figures["ops"] / figures["seconds"]
                rounds[label].append(figures)
        floor_label = workloads[0][0]
        for label, runs in rounds.items():
            for figures, floor_figures in zip(runs, rounds[floor_label], strict=True):
                figures["ratio"] = figures["per_second"] / floor_figures["per_second"]
            ratios = sorted(r["ratio"] for r in runs)
            by_rate = sorted(runs, key=lambda figures: figures["per_second"])
            results[label] = {
                **by_rate[len(by_rate) // 2],
                "ratio": statistics.median(ratios),
                "rounds": [r["per_second"] for r in runs],
                "round_ratios": [r["ratio"] for r in runs],
            }
    print(
        f"oncewire {__version__} replies benchmark, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}, WAL + synchronous=FULL{' (quick)' if args.quick else ''}"
    )
    header = (
        f"{'workload':50} {'n':>5} {'per s':>9} {'x floor':>8} {'bound':>6} "
        f"{'commits/reply':>19} {'stmts':>6} {'pages':>6} {'wire ops':>9}"
    )
    print(header)
    print("-" * len(header))
    for label, f in results.items():
        per_reply = (
            ""
            if "commits_per_reply" not in f
            else f"{f['commits_per_reply_without_admission']:.1f} + 1 admission"
        )
        wire = "" if "wire_ops_per_reply" not in f else f"{f['wire_ops_per_reply']:.1f}"
        stmts = "" if "statements_per_reply" not in f else f"{f['statements_per_reply']:.1f}"
        pages = "" if "wal_frames_per_reply" not in f else f"{f['wal_frames_per_reply']:.1f}"
        ratio = f["ratio"]
        print(
            f"{label:50} {f['ops']:>5} {f['per_second']:>9.1f} {ratio:>8.3f} {f['bound']:>6.3f} "
            f"{per_reply:>19} {stmts:>6} {pages:>6} {wire:>9}"
        )
    print(
        f"per s: the median of {args.rounds} interleaved round(s); x floor: the median of the "
        "per-round ratios to that round's floor. commits/reply: every COMMIT the store issued "
        "per reply (statement trace), the inbound admission's shown apart; stmts: statements "
        "per reply, admission included; pages: WAL frames appended per reply. bound: 1 / "
        "commits per reply (admission included), the floor being one commit per row."
    )
    if args.json:
        args.json.write_text(
            json.dumps({"version": __version__, "quick": args.quick, "results": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
