"""The measured workloads. Each one returns one or more figures as :class:`Sample` values.

Every workload gets a fresh directory on the same disk, opens its files before the clock starts,
and checks afterwards, against the files themselves, that the work it timed really happened.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common import (
    BUSY_TIMEOUT_MS,
    KIND,
    PRAGMAS,
    effect_key,
    effect_payload,
    effect_states,
    raw_connect,
    read_pragmas,
    timed_dispatch,
)
from oncewire import Attempt, Dispatcher, Ledger, Receipts, ReceiptsSink
from oncewire.core.canonical import canonical_json, digest_json

HERE = Path(__file__).resolve().parent
CHILD = HERE / "child.py"


class Skip(Exception):
    """A workload that cannot run here (an optional reference that is not installed)."""


class BenchmarkError(Exception):
    """A workload did not do what it was timed for, or the setup differs from the baseline's."""


@dataclass
class Sample:
    value: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    workdir: Path
    single: int  # effects for the one-per-transaction workloads
    batched: int  # effects for the batched workloads
    batch: int  # effects per accept transaction and per claim in the batched workloads
    recovery: int  # effects claimed by the process that is killed
    recovery_batch: int  # batch_size of the dispatcher that recovers them
    pragmas: dict[str, dict[str, Any]] = field(default_factory=dict)
    url: str | None = None  # the PostgreSQL server (postgres.py): a schema per workload
    failover: int = 0  # effects in the PostgreSQL failover and duplicate workloads
    keep: bool = False  # keep what the workload created (files are kept by run.py)
    notes: dict[str, str] = field(default_factory=dict)  # figures not measured, and why

    def db(self, name: str) -> str:
        return str(self.workdir / name)


Workload = Callable[[Context], dict[str, Sample]]


def _check_pragmas(ctx: Context, who: str, found: dict[str, Any]) -> None:
    ctx.pragmas[who] = found
    if found != PRAGMAS:
        raise BenchmarkError(f"{who} runs with pragmas {found}, not {PRAGMAS}: not comparable")


def _ledger(ctx: Context, name: str) -> Ledger:
    ledger = Ledger(ctx.db(name))
    with ledger.transaction() as tx:
        _check_pragmas(ctx, "oncewire", read_pragmas(tx.execute))
    return ledger


def _expect(what: str, got: Any, want: Any) -> None:
    if got != want:
        raise BenchmarkError(f"{what}: expected {want}, found {got}")


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


# -- 1. the raw SQLite floor -------------------------------------------------------------------


def _floor(ctx: Context, count: int, per_commit: int) -> tuple[float, int]:
    path = ctx.db(f"floor-{per_commit}.db")
    conn = raw_connect(path)
    try:
        _check_pragmas(ctx, "floor", read_pragmas(conn.execute))
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        bodies = [json.dumps(effect_payload(i), separators=(",", ":")) for i in range(count)]
        started = time.perf_counter()
        for start in range(0, count, per_commit):
            conn.execute("BEGIN IMMEDIATE")
            for body in bodies[start : start + per_commit]:
                conn.execute("INSERT INTO t (body) VALUES (?)", (body,))
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - started
        _expect(
            "rows in the floor table", conn.execute("SELECT COUNT(*) FROM t").fetchone()[0], count
        )
    finally:
        conn.close()
    return elapsed, -(-count // per_commit)


def floor(ctx: Context) -> dict[str, Sample]:
    elapsed, commits = _floor(ctx, ctx.single, 1)
    return {
        "floor": Sample(_rate(commits, elapsed), {"commits": commits, "seconds": elapsed}),
    }


def floor_batched(ctx: Context) -> dict[str, Sample]:
    elapsed, commits = _floor(ctx, ctx.batched, ctx.batch)
    return {
        "floor_batched": Sample(
            _rate(ctx.batched, elapsed),
            {
                "rows": ctx.batched,
                "commits": commits,
                "seconds": elapsed,
                "commits_per_effect": commits / ctx.batched,
            },
        )
    }


# -- 2. accept ---------------------------------------------------------------------------------


def accept(ctx: Context) -> dict[str, Sample]:
    ledger = _ledger(ctx, "accept.db")
    try:
        payloads = [effect_payload(i) for i in range(ctx.single)]
        started = time.perf_counter()
        for i, payload in enumerate(payloads):
            ledger.accept(effect_key(i), KIND, payload)
        elapsed = time.perf_counter() - started
    finally:
        ledger.close()
    _expect("pending effects", effect_states(ctx.db("accept.db")), {"pending": ctx.single})
    return {
        "accept": Sample(_rate(ctx.single, elapsed), {"effects": ctx.single, "seconds": elapsed})
    }


def accept_sql(ctx: Context) -> dict[str, Sample]:
    """The outbox's own INSERT (the statement ``Ledger.accept`` sends, its values computed
    before the clock) through raw sqlite3 into a store oncewire created: the real table, its
    indexes and pragmas, with no Python of oncewire's around it. What accept could reach if
    oncewire cost nothing; below the floor by what the table's indexes cost a commit."""
    name = "accept-sql.db"
    _ledger(ctx, name).close()  # the schema, created and migrated by oncewire
    conn = raw_connect(ctx.db(name))
    try:
        _check_pragmas(ctx, "floor", read_pragmas(conn.execute))
        now = time.time()
        rows = []
        for i in range(ctx.single):
            payload = canonical_json(effect_payload(i))
            rows.append((effect_key(i), KIND, payload, digest_json(payload), 5, now, now, now))
        insert = (
            "INSERT INTO oncewire_effects (key, kind, payload, digest, max_attempts, not_before, "
            "deadline, created_at, updated_at, traceparent) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, "
            "NULL) ON CONFLICT (key) DO NOTHING RETURNING id"
        )
        started = time.perf_counter()
        for row in rows:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(insert, row).fetchone()
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - started
    finally:
        conn.close()
    _expect("pending effects", effect_states(ctx.db(name)), {"pending": ctx.single})
    return {
        "accept_sql": Sample(
            _rate(ctx.single, elapsed), {"effects": ctx.single, "seconds": elapsed}
        )
    }


# -- 3-5. end to end ---------------------------------------------------------------------------


def _noop(attempt: Attempt) -> None:
    return None


def _receiver(ctx: Context) -> tuple[Receipts, Callable[[Attempt], Any]]:
    receipts = Receipts(ctx.db("receiver.db"))
    with receipts.store.transaction() as tx:
        _check_pragmas(ctx, "receipts", read_pragmas(tx.execute))
        tx.execute(
            "CREATE TABLE downstream (id INTEGER PRIMARY KEY, key TEXT NOT NULL, "
            "body TEXT NOT NULL)"
        )

    def work(tx: Any, attempt: Attempt) -> dict[str, int]:
        cursor = tx.execute(
            "INSERT INTO downstream (key, body) VALUES (:key, :body)",
            {"key": attempt.key, "body": attempt.payload["text"]},
        )
        return {"row": cursor.lastrowid}

    # One call per effect when claims come one at a time; a whole claimed batch in one
    # receiver transaction (a savepoint per effect) when they come in batches.
    sink = ReceiptsSink(receipts, work)
    return receipts, sink


def _end_to_end(ctx: Context, *, count: int, batch: int, receipts: bool) -> Sample:
    """Accept ``count`` effects (``batch`` per transaction), then dispatch them until idle with
    ``batch_size=batch``. Sequential on purpose: the clock runs from the first accept to the
    moment ``run(until_idle=True)`` returns with every effect done and recorded."""
    ledger = _ledger(ctx, "outbox.db")
    receiver: Receipts | None = None
    sink: Callable[[Attempt], Any] = _noop
    if receipts:
        receiver, sink = _receiver(ctx)
    try:
        dispatcher = Dispatcher(ledger, {KIND: sink}, batch_size=batch)
        payloads = [effect_payload(i) for i in range(count)]
        started = time.perf_counter()
        if batch == 1:
            for i, payload in enumerate(payloads):
                ledger.accept(effect_key(i), KIND, payload)
        else:
            for start in range(0, count, batch):
                with ledger.transaction() as tx:
                    for i in range(start, min(start + batch, count)):
                        tx.accept(effect_key(i), KIND, payloads[i])
        accepted = time.perf_counter()
        stats = dispatcher.run(until_idle=True, handle_signals=False)
        finished = time.perf_counter()
    finally:
        ledger.close()
        if receiver is not None:
            receiver.close()
    _expect("dispatcher's done count", stats.done, count)
    _expect("effects by state", effect_states(ctx.db("outbox.db")), {"done": count})
    if receipts:
        conn = sqlite3.connect(ctx.db("receiver.db"))
        try:
            rows = conn.execute("SELECT COUNT(*) FROM downstream").fetchone()[0]
            receipts_stored = conn.execute("SELECT COUNT(*) FROM oncewire_receipts").fetchone()[0]
        finally:
            conn.close()
        _expect("downstream rows", rows, count)
        _expect("receipts", receipts_stored, count)
    accept_s, dispatch_s = accepted - started, finished - accepted
    # Commits per effect: the accept's share, one settle-and-claim per batch, one receipt each.
    commits = 1 / batch + 1 / batch + (1 / batch if receipts else 0)
    return Sample(
        _rate(count, finished - started),
        {
            "effects": count,
            "seconds": finished - started,
            "accept_seconds": accept_s,
            "dispatch_seconds": dispatch_s,
            "accept_rate": _rate(count, accept_s),
            "dispatch_rate": _rate(count, dispatch_s),
            "commits_per_effect": round(commits, 4),
            "batches": stats.batches,
        },
    )


def e2e_single(ctx: Context) -> dict[str, Sample]:
    return {"e2e_single": _end_to_end(ctx, count=ctx.single, batch=1, receipts=False)}


def e2e_batched(ctx: Context) -> dict[str, Sample]:
    return {"e2e_batched": _end_to_end(ctx, count=ctx.batched, batch=ctx.batch, receipts=False)}


def e2e_single_receipts(ctx: Context) -> dict[str, Sample]:
    sample = _end_to_end(ctx, count=ctx.single, batch=1, receipts=True)
    return {"e2e_single_receipts": sample}


def e2e_batched_receipts(ctx: Context) -> dict[str, Sample]:
    sample = _end_to_end(ctx, count=ctx.batched, batch=ctx.batch, receipts=True)
    return {"e2e_batched_receipts": sample}


# -- 6. recovery after SIGKILL -----------------------------------------------------------------


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_CRASH")}
    src = str(HERE.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _claim_and_kill(db: str, count: int) -> dict[str, Any]:
    """A child accepts ``count`` effects and claims them all; it is SIGKILLed inside its sink."""
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), "claim", db, str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_child_env(),
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline() if ready else ""
        if line.strip() != "claimed":
            proc.kill()
            _, err = proc.communicate(timeout=30)
            raise BenchmarkError(
                f"the claiming child did not reach its sink: {err.strip()[-2000:]}"
            )
        _expect(
            "effects claimed by the child before the kill", effect_states(db), {"claimed": count}
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        started = _started_claims(db)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    _expect("the claiming child's return code", proc.returncode, -signal.SIGKILL)
    return {"killed_pid": proc.pid, "returncode": proc.returncode, "started_at_kill": started}


def _started_claims(db: str) -> int:
    """Claims the killed child had recorded as starting: only these may have reached the sink,
    so only these are redelivered (the rest go out as first deliveries)."""
    conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        row = conn.execute(
            "SELECT COUNT(*) FROM oncewire_effects"
            " WHERE state = 'claimed' AND started_fence = fence"
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()


def _dispatch_in_child(db: str, batch_size: int) -> tuple[float, dict[str, Any]]:
    spawned = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(CHILD), "dispatch", db, str(batch_size)],
        capture_output=True,
        env=_child_env(),
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise BenchmarkError(f"the dispatching child failed: {proc.stderr.strip()[-2000:]}")
    return spawned, json.loads(proc.stdout.strip().splitlines()[-1])


def _prepared_pending(ctx: Context, name: str) -> str:
    db = ctx.db(name)
    ledger = Ledger(db)
    try:
        with ledger.transaction() as tx:
            for i in range(ctx.recovery):
                tx.accept(effect_key(i), KIND, effect_payload(i))
    finally:
        ledger.close()
    return db


def _from(origin: float, instant: float | None, what: str) -> float:
    if instant is None:
        raise BenchmarkError(f"no {what} was seen")
    return instant - origin


def _check_all_done(db: str, count: int, calls: int, redeliveries: int, started: int) -> None:
    _expect("effects by state after the dispatcher", effect_states(db), {"done": count})
    _expect("sink calls", calls, count)
    _expect("calls flagged as redeliveries", redeliveries, started)


def start_and_recovery(ctx: Context, *, crashed: bool) -> dict[str, Sample]:
    prefix = "recovery" if crashed else "start"
    first_what = "redelivered sink call" if crashed else "sink call"
    figures: dict[str, Sample] = {}

    # In a fresh process, timed from just before it is spawned.
    db = ctx.db(f"{prefix}-process.db")
    killed: dict[str, Any] = {}
    if crashed:
        killed = _claim_and_kill(db, ctx.recovery)
    else:
        _prepared_pending(ctx, f"{prefix}-process.db")
    spawned, child = _dispatch_in_child(db, ctx.recovery_batch)
    first = child["first_redelivery"] if crashed else child["first_call"]
    started = killed.get("started_at_kill", 0)
    _check_all_done(db, ctx.recovery, child["calls"], child["redeliveries"], started)
    common = {
        "effects": ctx.recovery,
        "batch_size": ctx.recovery_batch,
        "released": child["stats"]["released"],
        "interpreter_and_imports_seconds": child["imported"] - spawned,
        "open_seconds": child["run_started"] - child["imported"],
        **killed,
    }
    figures[f"{prefix}_first_process"] = Sample(
        _from(spawned, first, first_what), {**common, "to_all_done": child["finished"] - spawned}
    )
    figures[f"{prefix}_all_process"] = Sample(child["finished"] - spawned, common)

    # In this process, timed from Dispatcher.run().
    db = ctx.db(f"{prefix}-run.db")
    killed = {}
    if crashed:
        killed = _claim_and_kill(db, ctx.recovery)
    else:
        _prepared_pending(ctx, f"{prefix}-run.db")
    timing = timed_dispatch(db, ctx.recovery_batch)
    first = timing.first_redelivery if crashed else timing.first_call
    started = killed.get("started_at_kill", 0)
    _check_all_done(db, ctx.recovery, timing.calls, timing.redeliveries, started)
    common = {
        "effects": ctx.recovery,
        "batch_size": ctx.recovery_batch,
        "released": timing.stats["released"],
        **killed,
    }
    figures[f"{prefix}_first_run"] = Sample(
        _from(timing.run_started, first, first_what),
        {**common, "to_all_done": timing.finished - timing.run_started},
    )
    figures[f"{prefix}_all_run"] = Sample(timing.finished - timing.run_started, common)
    if crashed:
        for name in ("recovery_first_process", "recovery_first_run"):
            _expect(
                f"{name}: claims released as a dead owner's",
                figures[name].details["released"],
                ctx.recovery,
            )
    return figures


def start(ctx: Context) -> dict[str, Sample]:
    return start_and_recovery(ctx, crashed=False)


def recovery(ctx: Context) -> dict[str, Sample]:
    return start_and_recovery(ctx, crashed=True)


# -- 7. Huey, for reference --------------------------------------------------------------------


def huey(ctx: Context) -> dict[str, Sample]:
    try:
        from huey import SqliteHuey
    except ImportError as exc:
        raise Skip(
            f"huey is not importable ({exc}); `pip install huey` to add this reference"
        ) from None
    import huey as huey_module

    queue = SqliteHuey(
        "bench",
        filename=ctx.db("huey.db"),
        fsync=True,  # synchronous=FULL, as everywhere else here
        journal_mode="wal",
        timeout=PRAGMAS["busy_timeout"] / 1000,
    )
    found = {
        "journal_mode": str(queue.storage.sql("PRAGMA journal_mode", results=True)[0][0]).lower(),
        "synchronous": int(queue.storage.sql("PRAGMA synchronous", results=True)[0][0]),
        "busy_timeout": int(queue.storage.sql("PRAGMA busy_timeout", results=True)[0][0]),
    }
    _check_pragmas(ctx, "huey", found)
    done = 0

    @queue.task()
    def noop(n: int, text: str) -> None:
        nonlocal done
        done += 1

    count = ctx.single
    started = time.perf_counter()
    for i in range(count):
        noop(i, effect_payload(i)["text"])
    enqueued = time.perf_counter()
    while (task := queue.dequeue()) is not None:
        queue.execute(task)
    finished = time.perf_counter()
    queue.storage.close()
    _expect("huey tasks executed", done, count)
    enqueue_s, process_s = enqueued - started, finished - enqueued
    return {
        "huey": Sample(
            _rate(count, finished - started),
            {
                "tasks": count,
                "seconds": finished - started,
                "enqueue_rate": _rate(count, enqueue_s),
                "process_rate": _rate(count, process_s),
                "huey_version": getattr(huey_module, "__version__", "unknown"),
                "commits_per_effect": 2,
            },
        )
    }


def describe(sample: Sample) -> dict[str, Any]:
    return asdict(sample)
