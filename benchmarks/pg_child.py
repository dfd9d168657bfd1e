"""Worker processes for the PostgreSQL figures. run.py starts them; they are not meant for people.

python benchmarks/pg_child.py oncewire URL [options]
    a Dispatcher on the PostgreSQL store at URL (a search_path names the schema). Prints
    "ready" once connected, waits for a line on stdin, then runs: until idle (``--until-idle``)
    or until SIGTERM. Prints its stats as one JSON line when it stops.

python benchmarks/pg_child.py pgqueuer URL [options]
    a PgQueuer QueueManager (asyncpg) on URL with a no-op entrypoint, same protocol: "ready",
    a line on stdin, then drain (``--until-idle``) or run until SIGTERM.

``--record FILE`` appends the key (job id) of every sink call to FILE, one write(2) per call,
so the lines survive a SIGKILL of this process: the parent counts executions per key.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
import uuid
from typing import Any

KIND = "noop"
ENTRYPOINT = "noop"


def _recorder(path: str | None) -> Any:
    if path is None:
        return None
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _wait_for_go() -> float:
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()
    return time.time()


def run_oncewire(args: argparse.Namespace) -> dict[str, Any]:
    from oncewire import Attempt, Dispatcher, Ledger, Receipts
    from oncewire.core.ids import process_start_ticks

    record = _recorder(args.record)
    ledger = Ledger(args.url, create=False)
    receipts = Receipts(args.url, create=False) if args.receipts else None
    delay = args.sink_delay

    def work(attempt: Attempt) -> Any:
        if delay:
            time.sleep(delay)
        return None

    def sink(attempt: Attempt) -> Any:
        if record is not None:
            os.write(record, f"{attempt.key}\n".encode())
        if receipts is None:
            return work(attempt)

        def apply(tx: Any) -> None:
            work(attempt)
            tx.execute("INSERT INTO bench_downstream (key) VALUES (:key)", {"key": attempt.key})

        return receipts.run_once(attempt.key, attempt.payload, apply).result

    owner = None
    if args.owner_host:
        # An owner on another host: peers cannot check its pid and must wait for its lease.
        pid = os.getpid()
        start = process_start_ticks(pid) or 0
        owner = f"{args.owner_host}:{pid}:{start}:{uuid.uuid4().hex[:8]}"
    dispatcher = Dispatcher(
        ledger,
        {KIND: sink},
        batch_size=args.batch_size,
        lease_seconds=args.lease_seconds,
        owner=owner,
    )
    # Warm the connection the loop will use (the store opened one on this thread).
    ledger.store.backlog([KIND])
    go = _wait_for_go()
    try:
        stats = dispatcher.run(until_idle=args.until_idle, handle_signals=True)
    finally:
        ledger.close()
        if receipts is not None:
            receipts.close()
    return {
        "pid": os.getpid(),
        "owner": dispatcher.owner,
        "host": socket.gethostname(),
        "go": go,
        "stopped": time.time(),
        "stats": stats.as_dict(),
    }


def run_pgqueuer(args: argparse.Namespace) -> dict[str, Any]:
    import asyncio
    from datetime import timedelta

    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    record = _recorder(args.record)
    calls = 0

    async def main() -> float:
        nonlocal calls
        conn = await asyncpg.connect(args.url)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint(ENTRYPOINT)
        async def noop(job: Any) -> None:
            nonlocal calls
            calls += 1
            if record is not None:
                os.write(record, f"{job.id}\n".encode())
            if args.sink_delay:
                await asyncio.sleep(args.sink_delay)

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, qm.shutdown.set)
        await conn.execute("SELECT 1")
        go = await loop.run_in_executor(None, _wait_for_go)
        await qm.run(
            batch_size=args.batch_size,
            mode=QueueExecutionMode.drain if args.until_idle else QueueExecutionMode.continuous,
            heartbeat_timeout=timedelta(seconds=args.lease_seconds),
            dequeue_timeout=timedelta(seconds=args.poll_seconds),
        )
        return go

    go = asyncio.run(main())
    return {"pid": os.getpid(), "go": go, "stopped": time.time(), "calls": calls}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pg_child.py")
    parser.add_argument("system", choices=("oncewire", "pgqueuer"))
    parser.add_argument("url")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--lease-seconds", type=float, default=30.0)
    parser.add_argument("--poll-seconds", type=float, default=0.5)
    parser.add_argument("--sink-delay", type=float, default=0.0)
    parser.add_argument("--until-idle", action="store_true")
    parser.add_argument("--receipts", action="store_true")
    parser.add_argument("--owner-host")
    parser.add_argument("--record")
    args = parser.parse_args(argv)
    report = run_oncewire(args) if args.system == "oncewire" else run_pgqueuer(args)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
