"""The PostgreSQL workloads: ``run.py --backend postgresql --db URL``.

Each workload runs in a schema of its own, created for it and dropped after it (``--keep``
keeps it), on the server ``--db`` names. Workers are real processes (``pg_child.py``): they
connect, say "ready", and start together when the parent writes a line to each of them; the
clock starts then. When a run is timed to "all done", the end is read from the database (the
``updated_at`` of the last effect settled, PgQueuer's ``created`` of its last log row), and the
database is checked for every effect done (every job gone from PgQueuer's queue and logged).
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from common import KIND, effect_key, effect_payload
from oncewire import Ledger
from workloads import BenchmarkError, Context, Sample, Skip, _child_env, _expect, _rate

HERE = Path(__file__).resolve().parent
CHILD = HERE / "pg_child.py"

# What the floor and every other workload must see on the server: a commit is durable when it
# returns. The run refuses to go on if a connection reports otherwise.
DURABILITY = {"fsync": "on", "synchronous_commit": "on"}
FAILOVER_SINK_DELAY = 0.002  # seconds per effect in the failover and duplicate workloads
FAILOVER_BATCH = 10
LEASE_EXPIRY_SECONDS = 2.0
PGQUEUER_BATCH = 10  # PgQueuer's default batch_size
OTHER_HOST = "bench-elsewhere"  # an owner host name that is not this host's


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - a dependency of the postgresql extra
        raise BenchmarkError(f"psycopg is not importable ({exc})") from None
    return psycopg


def with_search_path(url: str, schema: str) -> str:
    extra = "options=" + quote(f"-csearch_path={schema}")
    return url + ("&" if "?" in url else "?") + extra


def server_settings(conn: Any) -> dict[str, Any]:
    names = ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "commit_delay")
    return {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in names}


def _check_durability(ctx: Context, who: str, conn: Any) -> dict[str, Any]:
    found = server_settings(conn)
    ctx.pragmas[who] = {k: found[k] for k in DURABILITY}
    if any(found[k] != v for k, v in DURABILITY.items()):
        raise BenchmarkError(f"{who} runs with {found}, not {DURABILITY}: not comparable")
    return found


@contextmanager
def fresh_schema(ctx: Context, label: str) -> Iterator[str]:
    """A new schema for one workload; yields a URL whose search_path points at it."""
    psycopg = _psycopg()
    assert ctx.url is not None
    name = f"oncewire_bench_{label}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ctx.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield with_search_path(ctx.url, name)
    finally:
        if not ctx.keep:
            with psycopg.connect(ctx.url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def _query(url: str, sql: str, params: Any = None) -> list[Any]:
    psycopg = _psycopg()
    with psycopg.connect(url, autocommit=True) as conn:
        return list(conn.execute(sql, params).fetchall())


def _execute(url: str, sql: str) -> None:
    psycopg = _psycopg()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


def effect_states(url: str) -> dict[str, int]:
    rows = _query(url, "SELECT state, COUNT(*) FROM oncewire_effects GROUP BY state")
    return {str(state): int(count) for state, count in rows}


# -- 1. the raw PostgreSQL floor ---------------------------------------------------------------


def _floor(ctx: Context, count: int, per_commit: int) -> tuple[float, int]:
    psycopg = _psycopg()
    body = '{"n":0,"text":"' + effect_payload(0)["text"] + '"}'
    with fresh_schema(ctx, "floor") as url, psycopg.connect(url, autocommit=True) as conn:
        _check_durability(ctx, "floor", conn)
        conn.execute("CREATE TABLE t (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)")
        started = time.perf_counter()
        if per_commit == 1:
            for _ in range(count):  # autocommit: each INSERT is its own transaction
                conn.execute("INSERT INTO t (body) VALUES (%s)", (body,))
        else:
            with conn.cursor() as cursor:
                for start in range(0, count, per_commit):
                    with conn.transaction():
                        rows = min(per_commit, count - start)
                        cursor.executemany("INSERT INTO t (body) VALUES (%s)", [(body,)] * rows)
        elapsed = time.perf_counter() - started
        rows = conn.execute("SELECT COUNT(*) FROM t").fetchone()[0]
    _expect("rows in the floor table", rows, count)
    return elapsed, -(-count // per_commit)


def floor(ctx: Context) -> dict[str, Sample]:
    elapsed, commits = _floor(ctx, ctx.single, 1)
    return {"floor": Sample(_rate(commits, elapsed), {"commits": commits, "seconds": elapsed})}


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


def _ledger(ctx: Context, url: str) -> Ledger:
    ledger = Ledger(url)
    with ledger.transaction() as tx:  # on the store's own connection, what it commits with
        _check_durability(ctx, "oncewire", tx)
    return ledger


def accept(ctx: Context) -> dict[str, Sample]:
    with fresh_schema(ctx, "accept") as url:
        ledger = _ledger(ctx, url)
        try:
            payloads = [effect_payload(i) for i in range(ctx.single)]
            started = time.perf_counter()
            for i, payload in enumerate(payloads):
                ledger.accept(effect_key(i), KIND, payload)
            elapsed = time.perf_counter() - started
        finally:
            ledger.close()
        _expect("pending effects", effect_states(url), {"pending": ctx.single})
    return {
        "accept": Sample(
            _rate(ctx.single, elapsed),
            {"effects": ctx.single, "seconds": elapsed, "commits_per_effect": 1},
        )
    }


# -- worker processes --------------------------------------------------------------------------


class Workers:
    """Worker processes started together: spawn, wait for "ready", then ``go()``."""

    def __init__(self, commands: list[list[str]]) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.reports: dict[int, dict[str, Any]] = {}
        try:
            for command in commands:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, str(CHILD), *command],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        env=_child_env(),
                        text=True,
                    )
                )
            for proc in self.procs:
                assert proc.stdout is not None
                ready, _, _ = select.select([proc.stdout], [], [], 120)
                line = proc.stdout.readline() if ready else ""
                if line.strip() != "ready":
                    raise BenchmarkError(f"a worker did not start: {self._stderr(proc)}")
        except BaseException:
            self.kill_all()
            raise

    @staticmethod
    def _stderr(proc: subprocess.Popen[str]) -> str:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=30)
        return (err or "").strip()[-2000:]

    def go(self) -> float:
        """Start every worker; returns the wall-clock instant (comparable with the database's)."""
        started = time.time()
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        return started

    @staticmethod
    def freeze(proc: subprocess.Popen[str]) -> None:
        """SIGSTOP ``proc``: it sends nothing more, and ``kill`` still ends it."""
        os.kill(proc.pid, signal.SIGSTOP)

    def kill(self, proc: subprocess.Popen[str]) -> float:
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.time()
        proc.wait(timeout=30)
        return killed

    def finish(self, *, terminate: bool = False, timeout: float = 300) -> list[dict[str, Any]]:
        """Wait for every worker (SIGTERM first with ``terminate``); their JSON reports."""
        import json

        reports = []
        for proc in self.procs:
            if terminate and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                raise BenchmarkError(f"worker {proc.pid} did not finish: {err[-2000:]}") from None
            if proc.returncode == -signal.SIGKILL:
                reports.append({"pid": proc.pid, "returncode": proc.returncode})
                continue
            if proc.returncode != 0:
                raise BenchmarkError(f"worker {proc.pid} exited {proc.returncode}: {err[-2000:]}")
            report = json.loads(out.strip().splitlines()[-1])
            report["returncode"] = proc.returncode
            reports.append(report)
        return reports

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.communicate(timeout=30)
            except (subprocess.SubprocessError, ValueError, OSError):
                pass


def _accept_batched(ctx: Context, url: str, count: int) -> None:
    ledger = _ledger(ctx, url)
    try:
        for start in range(0, count, ctx.batch):
            with ledger.transaction() as tx:
                for i in range(start, min(start + ctx.batch, count)):
                    tx.accept(effect_key(i), KIND, effect_payload(i))
    finally:
        ledger.close()


def _oncewire_args(url: str, *, batch: int, extra: tuple[str, ...] = ()) -> list[str]:
    return ["oncewire", url, "--batch-size", str(batch), *extra]


# -- 3. oncewire end to end, with 1, 2, 4 dispatcher processes ---------------------------------


def _end_to_end(ctx: Context, workers: int) -> Sample:
    count = ctx.batched
    with fresh_schema(ctx, f"e2e{workers}") as url:
        _accept_batched(ctx, url, count)
        _expect("pending effects before the workers", effect_states(url), {"pending": count})
        group = Workers([_oncewire_args(url, batch=ctx.batch, extra=("--until-idle",))] * workers)
        try:
            started = group.go()
            reports = group.finish()
        finally:
            group.kill_all()
        _expect("effects by state after the workers", effect_states(url), {"done": count})
        last = _query(url, "SELECT MAX(updated_at) FROM oncewire_effects")[0][0]
    done = sum(r["stats"]["done"] for r in reports)
    _expect("effects the workers recorded done", done, count)
    elapsed = float(last) - started
    return Sample(
        _rate(count, elapsed),
        {
            "effects": count,
            "workers": workers,
            "batch_size": ctx.batch,
            "seconds": elapsed,
            "done_per_worker": [r["stats"]["done"] for r in reports],
            "batches": sum(r["stats"]["batches"] for r in reports),
            # Timed: one settle-and-claim commit per batch (the accepts came before the clock).
            "commits_per_effect": round(1 / ctx.batch, 4),
        },
    )


def e2e_workers_1(ctx: Context) -> dict[str, Sample]:
    return {"e2e_workers_1": _end_to_end(ctx, 1)}


def e2e_workers_2(ctx: Context) -> dict[str, Sample]:
    return {"e2e_workers_2": _end_to_end(ctx, 2)}


def e2e_workers_4(ctx: Context) -> dict[str, Sample]:
    return {"e2e_workers_4": _end_to_end(ctx, 4)}


# -- 4. PgQueuer, for reference ----------------------------------------------------------------


def _pgqueuer_module() -> Any:
    try:
        import asyncpg  # noqa: F401
        import pgqueuer
    except ImportError as exc:
        raise Skip(
            f"pgqueuer is not importable ({exc}); `pip install pgqueuer asyncpg` "
            "to add this reference"
        ) from None
    return pgqueuer


def _pgqueuer_setup(url: str, count: int) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    async def setup() -> None:
        conn = await asyncpg.connect(url)
        try:
            queries = Queries(AsyncpgDriver(conn))
            await queries.install()
            for start in range(0, count, 100):
                n = min(100, count - start)
                payloads: list[bytes | None] = [
                    f'{{"n":{i}}}'.encode() for i in range(start, start + n)
                ]
                await queries.enqueue(["noop"] * n, payloads, [0] * n)
        finally:
            await conn.close()

    asyncio.run(setup())


def _pgqueuer_state(url: str) -> tuple[int, int, int, float | None]:
    """(jobs still queued or picked, successful log rows, distinct jobs in them, last log time)."""
    queued = _query(url, "SELECT COUNT(*) FROM pgqueuer")[0][0]
    row = _query(
        url,
        "SELECT COUNT(*), COUNT(DISTINCT job_id), EXTRACT(EPOCH FROM MAX(created))::float8 "
        "FROM pgqueuer_log WHERE status = 'successful'",
    )[0]
    return int(queued), int(row[0]), int(row[1]), row[2]


def _pgqueuer(ctx: Context, workers: int, batch: int = PGQUEUER_BATCH) -> Sample:
    pgqueuer = _pgqueuer_module()
    count = ctx.batched
    with fresh_schema(ctx, f"pgq{workers}") as url:
        _pgqueuer_setup(url, count)
        command = ["pgqueuer", url, "--batch-size", str(batch), "--until-idle"]
        group = Workers([command] * workers)
        try:
            started = group.go()
            reports = group.finish()
        finally:
            group.kill_all()
        queued, logged, distinct, last = _pgqueuer_state(url)
    _expect("PgQueuer jobs left in the queue", queued, 0)
    _expect("PgQueuer jobs logged successful", distinct, count)
    calls = sum(r["calls"] for r in reports)
    if last is None:
        raise BenchmarkError("PgQueuer logged no job")
    elapsed = last - started
    return Sample(
        _rate(count, elapsed),
        {
            "jobs": count,
            "workers": workers,
            "batch_size": batch,
            "seconds": elapsed,
            "calls": calls,
            "calls_per_worker": [r["calls"] for r in reports],
            "logged": logged,
            "pgqueuer_version": getattr(pgqueuer, "__version__", "unknown"),
            # One dequeue commit per batch, one completion-log commit per batch (buffered).
            "commits_per_effect": round(2 / batch, 4),
        },
    )


def pgqueuer_1(ctx: Context) -> dict[str, Sample]:
    return {"pgqueuer_1": _pgqueuer(ctx, 1)}


def pgqueuer_2(ctx: Context) -> dict[str, Sample]:
    return {"pgqueuer_2": _pgqueuer(ctx, 2)}


def pgqueuer_2_batch(ctx: Context) -> dict[str, Sample]:
    """PgQueuer with oncewire's batch size (``ctx.batch`` jobs per dequeue)."""
    return {"pgqueuer_2_batch": _pgqueuer(ctx, 2, ctx.batch)}


# -- 5. executions per key when a worker is SIGKILLed mid-run ----------------------------------


def _wait_for(what: str, check: Any, timeout: float = 120.0, every: float = 0.005) -> float:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return time.time()
        if time.monotonic() > deadline:
            raise BenchmarkError(f"timed out waiting for {what}")
        time.sleep(every)


def _lines(path: Path) -> int:
    try:
        with path.open("rb") as handle:
            return sum(1 for _ in handle)
    except FileNotFoundError:
        return 0


def _executions(paths: list[Path]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for path in paths:
        if path.exists():
            counts.update(line for line in path.read_text().splitlines() if line)
    return counts


def _kill_mid_run(
    ctx: Context, commands: list[list[str]], records: list[Path], done: Any, count: int
) -> dict[str, Any]:
    """Start the workers; SIGKILL the first once it has executed a quarter of its share; wait
    until ``done()``; stop the survivors. Returns what happened."""
    group = Workers(commands)
    try:
        group.go()
        victim = group.procs[0]
        share = max(1, count // len(commands) // 4)
        _wait_for("the first worker's executions", lambda: _lines(records[0]) >= share)
        killed = group.kill(victim)
        executed_by_victim = _lines(records[0])
        finished = _wait_for("every job done after the kill", done, every=0.02)
        reports = group.finish(terminate=True)
    finally:
        group.kill_all()
    _expect("the killed worker's return code", victim.returncode, -signal.SIGKILL)
    return {
        "killed_pid": victim.pid,
        "returncode": victim.returncode,
        "executed_by_killed_worker": executed_by_victim,
        "seconds_from_kill_to_all_done": finished - killed,
        "reports": reports,
    }


def _duplicates(counts: Counter[str]) -> int:
    return sum(n - 1 for n in counts.values() if n > 1)


def duplicates(ctx: Context) -> dict[str, Sample]:
    count = ctx.failover
    figures: dict[str, Sample] = {}
    lease = ("--lease-seconds", str(LEASE_EXPIRY_SECONDS))
    delay = ("--sink-delay", str(FAILOVER_SINK_DELAY))

    # PgQueuer (when importable): jobs re-picked when their heartbeat goes stale.
    try:
        _pgqueuer_module()
        available = True
    except Skip as exc:
        ctx.notes["duplicates_pgqueuer"] = str(exc)
        available = False
    if available:
        with fresh_schema(ctx, "dupq") as url:
            _pgqueuer_setup(url, count)
            records = [ctx.workdir / f"pgqueuer-{i}.keys" for i in range(2)]
            commands = [
                [
                    "pgqueuer",
                    url,
                    "--batch-size",
                    str(PGQUEUER_BATCH),
                    "--record",
                    str(record),
                    *lease,
                    *delay,
                ]
                for record in records
            ]
            happened = _kill_mid_run(
                ctx, commands, records, lambda: _pgqueuer_state(url)[0] == 0, count
            )
            queued, _, distinct, _ = _pgqueuer_state(url)
        _expect("PgQueuer jobs left in the queue", queued, 0)
        _expect("PgQueuer jobs logged successful", distinct, count)
        executions = _executions(records)
        _expect("PgQueuer jobs executed at least once", len(executions), count)
        happened.pop("reports")
        figures["duplicates_pgqueuer"] = Sample(
            _duplicates(executions),
            {
                "jobs": count,
                "executions": sum(executions.values()),
                "jobs_executed_twice_or_more": sum(1 for n in executions.values() if n > 1),
                "heartbeat_timeout_seconds": LEASE_EXPIRY_SECONDS,
                **happened,
            },
        )

    # oncewire: the same kill; the sink is a receiver (receipts) whose work writes a row.
    with fresh_schema(ctx, "dupo") as url:
        _accept_batched(ctx, url, count)
        _execute(url, "CREATE TABLE bench_downstream (id BIGSERIAL PRIMARY KEY, key TEXT NOT NULL)")
        records = [ctx.workdir / f"oncewire-{i}.keys" for i in range(2)]
        commands = [
            _oncewire_args(
                url,
                batch=FAILOVER_BATCH,
                extra=("--receipts", "--record", str(record), *lease, *delay),
            )
            for record in records
        ]
        happened = _kill_mid_run(
            ctx, commands, records, lambda: effect_states(url) == {"done": count}, count
        )
        rows = _query(url, "SELECT key, COUNT(*) FROM bench_downstream GROUP BY key")
        receipts = _query(url, "SELECT COUNT(*) FROM oncewire_receipts")[0][0]
    applied: Counter[str] = Counter({str(key): int(n) for key, n in rows})
    _expect("keys with a downstream row", len(applied), count)
    _expect("receipts", receipts, count)
    calls = _executions(records)
    _expect("keys whose sink was called", len(calls), count)
    reports = happened.pop("reports")
    redelivered = sum(r.get("stats", {}).get("redeliveries", 0) for r in reports)
    details = {
        "effects": count,
        "sink_calls": sum(calls.values()),
        "sink_calls_beyond_one_per_key": _duplicates(calls),
        "redeliveries_flagged": redelivered,
        "downstream_rows": sum(applied.values()),
        "lease_seconds": LEASE_EXPIRY_SECONDS,
        **happened,
    }
    figures["duplicates_oncewire"] = Sample(_duplicates(applied), details)
    figures["redeliveries_oncewire"] = Sample(_duplicates(calls), details)
    return figures


# -- 6. failover: a worker SIGKILLed while it holds claims -------------------------------------


def _claims_of(conn: Any, pid: int) -> list[str]:
    return _held_by(conn, pid)[0]


def _held_by(conn: Any, pid: int) -> tuple[list[str], list[str]]:
    """The keys claimed by the worker ``pid``, and those of them recorded as starting (their
    sink may have run: only these are redelivered after a kill), read in one statement."""
    rows = conn.execute(
        "SELECT key, started_fence = fence FROM oncewire_effects"
        " WHERE state = 'claimed' AND lease_owner LIKE %s",
        (f"%:{pid}:%:%",),
    ).fetchall()
    return [str(row[0]) for row in rows], [str(row[0]) for row in rows if row[1]]


VICTIM = "oncewire_bench_failover_victim"


def quiet(conn: Any) -> Callable[[], bool]:
    """A check that is true once the victim's connections were seen idle on two polls in a row
    (none running a statement, a COMMIT included)."""
    seen = [0]
    give_up = time.monotonic() + 2.0

    def check() -> bool:
        (busy,) = conn.execute(
            "SELECT COUNT(*) FILTER (WHERE state = 'active') FROM pg_stat_activity"
            " WHERE application_name = %s",
            (VICTIM,),
        ).fetchone()
        seen[0] = 0 if busy else seen[0] + 1
        # Two quiet polls, or two seconds of polls: a connection the stopped worker left
        # running a statement that waits on the worker itself never turns idle.
        return seen[0] >= 2 or time.monotonic() > give_up

    return check


def _failover(ctx: Context, mode: str) -> Sample:
    """Two workers, ``ctx.failover`` effects whose sink sleeps a little. Once a quarter are
    done and the first worker holds claims, it is SIGKILLed (``mode`` "same_host" or
    "lease_expiry"), or, for the baseline ("none"), only looked at. The figure runs from that
    instant until every effect it held is done, read from the database; its details say when
    the claims were seen released (polled every few milliseconds: an upper bound)."""
    psycopg = _psycopg()
    count = ctx.failover
    extra: tuple[str, ...] = ("--sink-delay", str(FAILOVER_SINK_DELAY))
    lease_seconds = 30.0
    if mode == "lease_expiry":
        lease_seconds = LEASE_EXPIRY_SECONDS
        extra += ("--lease-seconds", str(lease_seconds), "--owner-host", OTHER_HOST)
    with fresh_schema(ctx, f"fo_{mode}") as url, psycopg.connect(url, autocommit=True) as conn:
        _accept_batched(ctx, url, count)
        victim_url = f"{url}&application_name={VICTIM}"
        commands = [
            _oncewire_args(victim_url, batch=FAILOVER_BATCH, extra=extra),
            _oncewire_args(url, batch=FAILOVER_BATCH, extra=extra),
        ]
        group = Workers(commands)
        try:
            group.go()
            victim = group.procs[0]
            held: list[str] = []
            started: list[str] = []
            instant = 0.0

            def ready() -> bool:
                nonlocal held, instant
                done = conn.execute(
                    "SELECT COUNT(*) FROM oncewire_effects WHERE state = 'done'"
                ).fetchone()[0]
                if done < count // 4:
                    return False
                instant = time.time()  # the claims read next were held at this instant
                held = _claims_of(conn, victim.pid)
                return bool(held)

            _wait_for("the first worker holding claims", ready, every=0.002)
            if mode != "none":
                # Stopped first, then read, then killed: a COMMIT the worker had sent when the
                # kill landed is still finished by the server, and read right after a bare
                # SIGKILL it could commit later (a claim, or a start) and be missed. Once every
                # connection of the stopped worker has been idle twice in a row, nothing it
                # sent is left to commit; what is held then is what the kill leaves.
                group.freeze(victim)
                _wait_for("the stopped worker's connections idle", quiet(conn), every=0.02)
                held, started = _held_by(conn, victim.pid)
                instant = group.kill(victim)
                if not held:
                    raise BenchmarkError("the killed worker held no claims")
            released_at: float | None = None

            def finished() -> bool:
                nonlocal released_at
                polled = time.time()
                claimed, done = conn.execute(
                    "SELECT COUNT(*) FILTER (WHERE state = 'claimed'), "
                    "COUNT(*) FILTER (WHERE state = 'done') "
                    "FROM oncewire_effects WHERE key = ANY(%s)",
                    (held,),
                ).fetchone()
                if released_at is None and not claimed:
                    released_at = polled
                return bool(done == len(held))

            _wait_for("the held effects done", finished, every=0.002)
            _wait_for("every effect done", lambda: effect_states(url) == {"done": count})
            reports = group.finish(terminate=True)
            last = conn.execute(
                "SELECT MAX(updated_at) FROM oncewire_effects WHERE key = ANY(%s)", (held,)
            ).fetchone()[0]
            released = sum(r.get("stats", {}).get("released", 0) for r in reports)
            redelivered = sum(r.get("stats", {}).get("redeliveries", 0) for r in reports)
        finally:
            group.kill_all()
    if mode != "none":
        _expect("the killed worker's return code", victim.returncode, -signal.SIGKILL)
        _expect("claims released by the survivor", released, len(held))
        _expect("redeliveries", redelivered, len(started))
    elapsed = float(last) - instant
    return Sample(
        elapsed,
        {
            "effects": count,
            "held": len(held),
            "batch_size": FAILOVER_BATCH,
            "sink_delay_seconds": FAILOVER_SINK_DELAY,
            "lease_seconds": lease_seconds,
            "owner_host": OTHER_HOST if mode == "lease_expiry" else "this host",
            "seconds_to_release": None if released_at is None else released_at - instant,
            "released": released,
            "started_at_kill": len(started),
            "redeliveries": redelivered,
        },
    )


def failover(ctx: Context) -> dict[str, Sample]:
    figures = {"failover_none": _failover(ctx, "none")}
    for mode in ("same_host", "lease_expiry"):
        sample = _failover(ctx, mode)
        figures[f"failover_{mode}"] = sample
        released = sample.details["seconds_to_release"]
        if released is None:
            raise BenchmarkError(f"failover_{mode}: the release was not seen")
        figures[f"release_{mode}"] = Sample(released, sample.details)
    return figures
