#!/usr/bin/env python3
"""Run-ledger benchmarks, each figure against a baseline measured in the same run.

    .venv/bin/python benchmarks/runs_bench.py [--quick | --smoke] [--json FILE] [--dir DIR]
    .venv/bin/python benchmarks/runs_bench.py --db postgresql://... [--quick] [--json FILE]
    .venv/bin/python benchmarks/runs_bench.py --db postgresql://... --only commands --repeat 5

With ``--db`` every figure is PostgreSQL's: each workload runs in a schema of its own (dropped
afterwards), and the floor is raw psycopg, one INSERT + COMMIT per transaction, on the same
server with its own settings (``synchronous_commit`` is reported).

* commands/s: each command one transaction appending one hash-chained event, against the raw
  SQLite floor (one INSERT + COMMIT per transaction) with the same pragmas (WAL,
  synchronous=FULL): the floor and the two workloads take turns, 50 operations at a time, so a
  slow moment of a shared machine falls on all three alike. Two workloads: an
  action proposed then resolved (event, run row and action row) and a candidate recorded
  (event and run row). Target: at least 0.5x. The bound is 1.00x: one commit per command, as
  the floor. With ``--repeat N`` the workloads and their floors run N times, interleaved, and
  the table shows the median of the per-round values and ratios. Also counted, once, on the
  connection the ledger writes through: statements per command (SQLite's statement trace;
  libpq's protocol trace on PostgreSQL) and, on PostgreSQL, round trips per command (each
  time the client waits for the server: a ``Sync`` or a simple ``Query``).
* verification: one run with a 100,000-event history (20,000 with --quick), verified twice: the
  hash chain alone, and the full audit (chain, fold through the transition table, projections).
  Target: at least 300,000 events/s.
* reconciliation: 10,000 runs (1,000 with --quick) left mid-review by a dead owner, reconciled
  in one sweep (each run its own transaction). Target: under 5 s for 10,000.

``--only commands`` runs the command workloads alone (no verification, no reconciliation).
Progress goes to stderr, the table to stdout. Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sqlite3
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
from oncewire.core.canonical import digest  # noqa: E402
from oncewire.runs import append  # noqa: E402
from oncewire.runs.chain import verify_chain  # noqa: E402
from oncewire.testing import ManualClock  # noqa: E402

BUSY_TIMEOUT_MS = 10_000
# The floor, the commands and the candidates take turns this many operations at a time, so a
# neighbour that slows the machine (or the server) for a moment slows all three alike.
CHUNK = 50
CANDIDATE: dict[str, Any] = {
    "candidate_id": "candidate-1",
    "snapshot_sha256": "a" * 64,
    "evidence_sha256": "e" * 64,
    "artifact_set_sha256": "b" * 64,
    "artifact_ids": ["artifact-1"],
    "version_ids": ["version-1"],
}
ARGUMENTS = {"path": "notes/result.txt", "content": "the quick brown fox jumps over the lazy dog"}


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def floor_steps(path: Path, chunk: int) -> Iterator[float]:
    """Raw sqlite3, the same pragmas, one INSERT + COMMIT per transaction: the seconds each
    ``chunk`` commits take, for as long as asked."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, run_id TEXT, seq INTEGER, "
            "payload TEXT, hash TEXT)"
        )
        payload = json.dumps(ARGUMENTS)
        i = 0
        while True:
            started = time.perf_counter()
            for n in range(i, i + chunk):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(
                    "INSERT INTO events (run_id, seq, payload, hash) VALUES (?, ?, ?, ?)",
                    ("floor", n, payload, "0" * 64),
                )
                conn.execute("COMMIT")
            yield time.perf_counter() - started
            i += chunk
    finally:
        conn.close()


class Target:
    """Where each workload's store lives: a file in ``folder``, or a fresh PostgreSQL schema."""

    def __init__(self, folder: Path, url: str | None) -> None:
        self.folder, self.url = folder, url
        self.schemas: list[str] = []
        self.tag = f"{os.getpid()}_{int(time.time())}"

    @property
    def backend(self) -> str:
        return "postgresql" if self.url else "sqlite"

    def __call__(self, name: str) -> Path | str:
        if self.url is None:
            return self.folder / f"{name}.db"
        from oncewire.lab.fixtures import with_search_path

        schema = f"oncewire_runs_bench_{self.tag}_{name.replace('-', '_')}"
        self._execute(f"CREATE SCHEMA {schema}")
        self.schemas.append(schema)
        return with_search_path(self.url, schema)

    def _execute(self, *statements: str) -> None:
        import psycopg

        assert self.url is not None
        with psycopg.connect(self.url, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)  # type: ignore[arg-type]

    def drop(self) -> None:
        if self.schemas:
            self._execute(*(f"DROP SCHEMA IF EXISTS {name} CASCADE" for name in self.schemas))


def floor_steps_postgres(url: str, chunk: int) -> Iterator[float]:
    """Raw psycopg on the same server, one INSERT + COMMIT per transaction: the seconds each
    ``chunk`` commits take, for as long as asked."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE events (id BIGSERIAL PRIMARY KEY, run_id TEXT, seq INTEGER, "
            "payload TEXT, hash TEXT)"
        )
        payload = json.dumps(ARGUMENTS)
        i = 0
        while True:
            started = time.perf_counter()
            for n in range(i, i + chunk):
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO events (run_id, seq, payload, hash) VALUES (%s, %s, %s, %s)",
                        ("floor", n, payload, "0" * 64),
                    )
            yield time.perf_counter() - started
            i += chunk


def measure_floor(where: Path | str, chunk: int) -> Iterator[float]:
    return (
        floor_steps_postgres(where, chunk) if isinstance(where, str) else floor_steps(where, chunk)
    )


def pragmas(ledger: Ledger) -> dict[str, Any]:
    with ledger.store.transaction() as tx:
        if ledger.store.dialect == "postgresql":
            return {"synchronous_commit": tx.execute("SHOW synchronous_commit").fetchone()[0]}
        return {
            "journal_mode": str(tx.execute("PRAGMA journal_mode").fetchone()[0]).lower(),
            "synchronous": int(tx.execute("PRAGMA synchronous").fetchone()[0]),
        }


def traffic(ledger: Ledger, work: Any) -> dict[str, int]:
    """What ``work()`` sends on this thread's store connection: statements, and on PostgreSQL
    round trips (libpq's protocol trace: a ``Sync`` or a simple ``Query`` is one wait for the
    server). Counted, not timed."""
    db: Any = ledger.store.db
    if ledger.store.dialect != "postgresql":
        texts: list[str] = []
        conn = db.conn()
        conn.set_trace_callback(texts.append)
        try:
            work()
        finally:
            conn.set_trace_callback(None)
        # A trigger's steps are traced under their statement's text: count each once.
        distinct = [t for i, t in enumerate(texts) if i == 0 or texts[i - 1] != t]
        return {"statements": len(distinct)}
    conn = db.fresh_conn() if hasattr(db, "fresh_conn") else db.conn()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace"
        with path.open("w") as out:
            conn.pgconn.trace(out.fileno())
            try:
                work()
            finally:
                conn.pgconn.untrace()
        sent = [line.split("\t")[3] for line in path.read_text().splitlines() if "\tF\t" in line]
    return {
        "statements": sum(1 for m in sent if m in ("Execute", "Query")),
        "round_trips": sum(1 for m in sent if m in ("Sync", "Query")),
    }


def command_traffic(path: Path | str) -> dict[str, dict[str, int]]:
    """Statements (and round trips) of one command of each workload, after a warm-up."""
    with Ledger(str(path)) as ledger:
        runs = ledger.runs
        runs.start("bench-run", key="start", scope="bench", owner="bench", lease_seconds=3600)
        review = runs.review
        seen: dict[str, dict[str, int]] = {}
        for i in range(8):  # past psycopg's prepare threshold: the steady state is counted
            last = i == 7

            def propose(i: int = i) -> None:
                review.propose_action(
                    "bench-run",
                    key=f"p{i}",
                    action_id=f"a{i}",
                    kind="write_file",
                    arguments=ARGUMENTS,
                    side_effect_class="workspace_write",
                )

            def resolve(i: int = i) -> None:
                review.resolve_action(
                    "bench-run", key=f"r{i}", action_id=f"a{i}", status="succeeded"
                )

            def candidate(i: int = i) -> None:
                review.record_candidate(
                    "bench-run", key=f"c{i}", **{**CANDIDATE, "candidate_id": f"candidate-{i}"}
                )

            for name, work in (
                ("propose", propose),
                ("resolve", resolve),
                ("candidate", candidate),
            ):
                if last:
                    seen[name] = traffic(ledger, work)
                else:
                    work()
        return seen


def command_steps(
    path: Path | str, chunk: int, seen: dict[str, Any], analyze_after: int | None = None
) -> Iterator[float]:
    """Through the public API, actions proposed then resolved on one run: the seconds each
    ``chunk`` commands take (``chunk`` even), for as long as asked; ``seen``: the pragmas;
    ``analyze_after``: ANALYZE once that many commands are done."""
    with Ledger(str(path)) as ledger:
        seen.update(pragmas(ledger))
        runs = ledger.runs
        runs.start("bench-run", key="start", scope="bench", owner="bench", lease_seconds=3600)
        i = 0
        while True:
            if analyze_after is not None and 2 * i >= analyze_after:
                analyze(ledger)
                analyze_after = None
            started = time.perf_counter()
            for n in range(i, i + chunk // 2):
                runs.review.propose_action(
                    "bench-run",
                    key=f"p{n}",
                    action_id=f"a{n}",
                    kind="write_file",
                    arguments=ARGUMENTS,
                    side_effect_class="workspace_write",
                )
                runs.review.resolve_action(
                    "bench-run", key=f"r{n}", action_id=f"a{n}", status="succeeded"
                )
            yield time.perf_counter() - started
            i += chunk // 2


def analyze(ledger: Ledger) -> None:
    """``ANALYZE``, untimed: the statistics autovacuum gathers on a database in service."""
    with ledger.store.transaction() as tx:
        tx.execute("ANALYZE")


def candidate_steps(
    path: Path | str, chunk: int, analyze_after: int | None = None
) -> Iterator[float]:
    """Through the public API, a new candidate recorded on one run (each command writes its
    event and the run row, and nothing else): the seconds each ``chunk`` commands take;
    ``analyze_after``: ANALYZE once that many commands are done."""
    with Ledger(str(path)) as ledger:
        runs = ledger.runs
        runs.start("bench-run", key="start", scope="bench", owner="bench", lease_seconds=3600)
        i = 0
        while True:
            if analyze_after is not None and i >= analyze_after:
                analyze(ledger)
                analyze_after = None
            started = time.perf_counter()
            for n in range(i, i + chunk):
                runs.review.record_candidate(
                    "bench-run", key=f"c{n}", **{**CANDIDATE, "candidate_id": f"candidate-{n}"}
                )
            yield time.perf_counter() - started
            i += chunk


def build_history(ledger: Ledger, run_id: str, scope: str, events: int) -> None:
    """A long valid history, written through the ledger's own append path in one transaction
    (a fixture: building it command by command would only measure fsync)."""
    runs = ledger.runs
    runs.start(run_id, key="start", scope=scope, owner="bench", lease_seconds=3600)
    store = ledger.store
    with store.transaction() as tx:
        row = store.get_run_in_tx(tx, run_id)
        assert row is not None
        state = json.loads(row.state_json)
        for i in range((events - 1) // 2):
            for command, request in (
                (
                    "propose_action",
                    {
                        "action_id": f"a{i}",
                        "kind": "write_file",
                        "arguments": ARGUMENTS,
                        "side_effect_class": "workspace_write",
                        "resource_keys": [],
                        "effect_key": None,
                    },
                ),
                ("resolve_action", {"action_id": f"a{i}", "status": "succeeded", "result": None}),
            ):
                _, row, state = append.append_in_tx(
                    runs.context,
                    tx,
                    row,
                    state,
                    command,
                    request,
                    key=f"{command}:{i}",
                    request_digest=digest({"command": command, "request": request}),
                    owner="bench",
                    fence=row.fence,
                    lease_expires_at=row.lease_expires_at,
                )


def verification(path: Path | str, events: int) -> dict[str, float]:
    with Ledger(str(path)) as ledger:
        progress(f"  building a {events:,}-event history")
        build_history(ledger, "long-run", "verify", events)
        store = ledger.store
        started = time.perf_counter()
        rows = store.run_chain("long-run")
        fault, last_seq, _, _ = verify_chain("long-run", rows, None)
        chain_seconds = time.perf_counter() - started
        assert fault is None and last_seq == len(rows), fault
        started = time.perf_counter()
        result = ledger.runs.verify("long-run")[0]
        audit_seconds = time.perf_counter() - started
        assert result.ok, result
        count = len(rows)
    return {
        "events": count,
        "chain_seconds": chain_seconds,
        "chain_events_per_second": count / chain_seconds,
        "audit_seconds": audit_seconds,
        "audit_events_per_second": count / audit_seconds,
    }


def reconciliation(path: Path | str, n: int) -> dict[str, float]:
    clock = ManualClock()
    with Ledger(str(path), clock=clock) as ledger:
        progress(f"  leaving {n:,} runs mid-review")
        runs, store = ledger.runs, ledger.store
        with store.transaction() as tx:
            for i in range(n):
                run_id = f"orphan-{i:06d}"
                runs.branches.ensure_in_tx(tx, f"scope-{i}", f"scope-{i}", clock.now())
                from oncewire.runs.chain import chain_name, genesis_hash
                from oncewire.storage.runs import RunRow

                row = RunRow(
                    run_id, f"scope-{i}", f"scope-{i}", None, "review", chain_name(None), "new",
                    None, "{}", 0, genesis_hash(run_id, None), "dead-owner", 1, clock.now() + 30,
                    clock.now(), clock.now(), None, None, None, False,
                )  # fmt: skip
                store.insert_run_in_tx(tx, row)
                state: dict[str, Any] = {"status": ""}
                for command, request in (
                    (
                        "start",
                        {
                            "workflow": "review",
                            "scope": row.scope,
                            "branch": row.branch,
                            "turn": None,
                            "params": {},
                        },
                    ),
                    ("record_candidate", {"candidate": CANDIDATE}),
                    (
                        "start_review",
                        {
                            "review_id": "review-1",
                            "candidate_id": "candidate-1",
                            "evidence_sha256": "e" * 64,
                            "attempt": 1,
                            "reviewer": {},
                        },
                    ),
                ):
                    _, row, state = append.append_in_tx(
                        runs.context,
                        tx,
                        row,
                        state,
                        command,
                        request,
                        key=command,
                        request_digest=digest({"command": command, "request": request}),
                        owner="dead-owner",
                        fence=1,
                        lease_expires_at=clock.now() + 30,
                    )
        clock.advance(60)
        started = time.perf_counter()
        reports = ledger.runs.reconcile(owner="bench-reconciler")
        seconds = time.perf_counter() - started
        assert len(reports) == n and all(r.status == "review_unavailable" for r in reports)
    return {"runs": n, "seconds": seconds, "runs_per_second": n / seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Smaller counts (seconds).")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="Tiny counts: proves every figure is produced (for tests); they mean little.",
    )
    parser.add_argument("--json", type=Path, help="Write the figures here.")
    parser.add_argument("--dir", type=Path, help="Where the database files go (kept).")
    parser.add_argument("--db", help="postgresql://... a database to create schemas in")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="rounds of the command workloads and their floors; medians shown (default 1)",
    )
    parser.add_argument(
        "--only",
        choices=("commands",),
        help="run the command workloads alone (no verification, no reconciliation)",
    )
    parser.add_argument(
        "--analyze-after",
        type=int,
        metavar="N",
        help="ANALYZE (untimed) once each command workload has run N commands, as autovacuum "
        "does on a database in service; without it the run tables are new and never analyzed",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    n_commands = 200 if args.smoke else 1_000 if args.quick else 4_000
    n_events = 2_001 if args.smoke else 20_001 if args.quick else 100_001
    n_orphans = 100 if args.smoke else 1_000 if args.quick else 10_000
    folder = args.dir or Path(tempfile.mkdtemp(prefix="oncewire-runs-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    target = Target(folder, args.db)
    rounds: list[dict[str, float]] = []
    seen: dict[str, Any] = {}
    verify: dict[str, float] | None = None
    recon: dict[str, float] | None = None
    try:
        for round_number in range(1, args.repeat + 1):
            tag = f"-r{round_number}"
            progress(
                f"round {round_number}/{args.repeat}: {n_commands:,} floor commits, commands "
                f"and candidates, {CHUNK} at a time in turn"
            )
            floor_gen = measure_floor(target("floor" + tag), CHUNK)
            command_gen = command_steps(target("commands" + tag), CHUNK, seen, args.analyze_after)
            candidate_gen = candidate_steps(target("candidates" + tag), CHUNK, args.analyze_after)
            spent = {"floor": 0.0, "commands": 0.0, "candidates": 0.0}
            try:
                for _ in range(n_commands // CHUNK):
                    spent["floor"] += next(floor_gen)
                    spent["commands"] += next(command_gen)
                    spent["candidates"] += next(candidate_gen)
            finally:
                for gen in (floor_gen, command_gen, candidate_gen):
                    gen.close()
            done = n_commands // CHUNK * CHUNK
            rates = {name: done / seconds for name, seconds in spent.items()}
            rounds.append(
                {
                    **rates,
                    "commands_ratio": rates["commands"] / rates["floor"],
                    "candidates_ratio": rates["candidates"] / rates["floor"],
                }
            )
        progress("statements per command")
        counted = command_traffic(target("traffic"))
        if args.only is None:
            progress("verification")
            verify = verification(target("verify"), n_events)
            progress("reconciliation")
            recon = reconciliation(target("reconcile"), n_orphans)
    finally:
        target.drop()
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)

    def median(name: str) -> float:
        return statistics.median(r[name] for r in rounds)

    floor_rate, command_rate, candidate_rate = (
        median("floor"),
        median("commands"),
        median("candidates"),
    )
    ratio, candidate_ratio = median("commands_ratio"), median("candidates_ratio")

    def per_command(*names: str) -> str:
        figures = [counted[name] for name in names]
        text = "statements " + "/".join(str(f["statements"]) for f in figures)
        if "round_trips" in figures[0]:
            text += ", round trips " + "/".join(str(f["round_trips"]) for f in figures)
        return text

    floor_name = "PostgreSQL" if target.backend == "postgresql" else "SQLite"
    rows: list[tuple[str, ...]] = [
        (
            f"raw {floor_name} floor (INSERT + COMMIT)",
            f"{floor_rate:,.0f} commits/s",
            "",
            "",
            "baseline",
            "",
        ),
        (
            "commands: action proposed/resolved",
            f"{command_rate:,.0f} commands/s",
            f"{ratio:.2f}x floor",
            "1.00x",
            "met" if ratio >= 0.5 else "MISSED (>= 0.5x)",
            per_command("propose", "resolve"),
        ),
        (
            "commands: candidate recorded",
            f"{candidate_rate:,.0f} commands/s",
            f"{candidate_ratio:.2f}x floor",
            "1.00x",
            "met" if candidate_ratio >= 0.5 else "MISSED (>= 0.5x)",
            per_command("candidate"),
        ),
    ]
    if verify is not None and recon is not None:
        scaled = recon["seconds"] * 10_000 / recon["runs"]
        chain_met = verify["chain_events_per_second"] >= 300_000
        rows += [
            (
                f"verify {verify['events']:,} events: hash chain",
                f"{verify['chain_events_per_second']:,.0f} events/s",
                f"{verify['chain_seconds']:.2f} s",
                "",
                "met" if chain_met else "MISSED (>= 300,000/s)",
                "",
            ),
            (
                f"verify {verify['events']:,} events: full audit",
                f"{verify['audit_events_per_second']:,.0f} events/s",
                f"{verify['audit_seconds']:.2f} s",
                "",
                "met" if verify["audit_events_per_second"] >= 300_000 else "below 300,000/s",
                "",
            ),
            (
                f"reconcile {recon['runs']:,} orphaned runs",
                f"{recon['runs_per_second']:,.0f} runs/s",
                f"{recon['seconds']:.2f} s (10,000: ~{scaled:.1f} s)",
                "",
                "met" if scaled < 5 else "MISSED (< 5 s for 10,000)",
                "",
            ),
        ]
    header = ("figure", "value", "ratio / time", "bound", "target", "per command (counted)")
    widths = [max(len(h), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
    print(
        f"{args.repeat} round(s): medians of per-round values and ratios; bound: the ratio if each "
        "command's one commit cost one floor commit and nothing else cost anything"
        + (
            f"; tables analyzed after {args.analyze_after:,} commands"
            if args.analyze_after is not None
            else "; tables never analyzed"
        )
    )
    print("  ".join(h.upper().ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print(f"pragmas seen by oncewire: {seen}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                    "oncewire": oncewire.__version__,
                    "python": platform.python_version(),
                    "sqlite": sqlite3.sqlite_version,
                    "platform": platform.platform(),
                    "cpus": os.cpu_count(),
                    "quick": args.quick,
                    "smoke": args.smoke,
                    "backend": target.backend,
                    "pragmas": seen,
                    "floor_commits_per_second": [r["floor"] for r in rounds],
                    "commands_per_second": command_rate,
                    "candidate_commands_per_second": candidate_rate,
                    "candidate_commands_ratio_to_floor": candidate_ratio,
                    "commands_ratio_to_floor": ratio,
                    "bound": 1.0,
                    "repeat": args.repeat,
                    "analyze_after": args.analyze_after,
                    "rounds": rounds,
                    "per_command": counted,
                    "verification": verify,
                    "reconciliation": recon,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
