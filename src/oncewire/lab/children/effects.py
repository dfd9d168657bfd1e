"""The outbox suites' child process: ``python -m oncewire.lab.children.effects ROLE ...``.

accept    accept one operation and its effect in one transaction of the caller's store
dispatch  run a dispatcher until idle; the sink runs ``service`` as a separate process
service   the downstream service: write one ticket (through receipts unless disabled)
torture   a dispatcher whose sink writes tickets in-process, for random-kill runs (with
          --standby it waits for SIGUSR1 after saying "ready": a spare the lab starts early)

Each prints one JSON object on stdout. ``service`` exits 3 on a payload conflict.
These modes exist so that experiments cross real process boundaries; do not point them at
unrelated database files.

The lab starts hundreds of these processes, and most of a short one's life is Python importing
oncewire: each role imports only what it uses (``service`` the receiver, ``accept`` the ledger,
the dispatching roles the dispatcher too), not the whole package. A process started with a
crash point armed imports every module that declares an outbox point first, so that
:func:`~oncewire.core.crash.check_armed` can tell a typo from a point declared in code this
role does not load (the whole process tree inherits the armed names).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from oncewire.core import crash
from oncewire.core.canonical import canonical_json, loads
from oncewire.core.errors import PayloadConflict
from oncewire.lab.fixtures import KIND

if TYPE_CHECKING:
    from oncewire.dispatch.retry import RetryPolicy
    from oncewire.effects.attempt import Attempt
    from oncewire.receipts.service import Receipts
    from oncewire.storage import Transaction

EXIT_CONFLICT = 3
MODULE = "oncewire.lab.children.effects"
# The modules that register the points the outbox suites arm (see crashpoints.OUTBOX_PREFIXES).
POINT_MODULES = ("oncewire.effects.outbox", "oncewire.dispatch.dispatcher", "oncewire.receipts")


def lab_retry() -> RetryPolicy:
    """Short backoffs: the lab's sinks refuse on purpose, and a run should not sit waiting."""
    from oncewire.dispatch.retry import RetryPolicy

    return RetryPolicy(base_seconds=0.02, cap_seconds=0.25)


def accept(caller: str, key: str, payload: Any) -> dict[str, Any]:
    from oncewire.ledger import Ledger

    with Ledger(caller) as ledger, ledger.transaction() as tx:
        tx.execute(
            "INSERT INTO operations (id, payload, created_by) VALUES (:id, :payload, :pid)",
            {"id": key, "payload": canonical_json(payload), "pid": os.getpid()},
        )
        tx.accept(key, KIND, payload)
    return {"accepted": key}


def _insert_ticket(
    tx: Transaction, key: str, payload: Any, attempt: int, redelivery: bool
) -> dict[str, int]:
    row = tx.execute(
        "INSERT INTO tickets (operation_id, payload, attempt, redelivery, service_pid) "
        "VALUES (:key, :payload, :attempt, :redelivery, :pid) RETURNING id",
        {
            "key": key,
            "payload": canonical_json(payload),
            "attempt": attempt,
            "redelivery": int(redelivery),
            "pid": os.getpid(),
        },
    ).fetchone()
    return {"ticket_id": int(row[0])}


def write_ticket(
    receipts: Receipts, key: str, payload: Any, attempt: int, redelivery: bool, deduplicate: bool
) -> tuple[Any, bool]:
    """The downstream service's one operation: (result, replayed)."""
    if deduplicate:
        outcome = receipts.run_once(
            key, payload, lambda tx: _insert_ticket(tx, key, payload, attempt, redelivery)
        )
        return outcome.result, outcome.replayed
    with receipts.store.transaction() as tx:
        return _insert_ticket(tx, key, payload, attempt, redelivery), False


def service(downstream: str, key: str, payload: Any, deduplicate: bool) -> dict[str, Any]:
    attempt = int(os.environ.get("ONCEWIRE_ATTEMPT", "1"))
    redelivery = os.environ.get("ONCEWIRE_REDELIVERY") == "1"
    from oncewire.receipts.service import Receipts

    with Receipts(downstream, retention_seconds=None) as receipts:
        result, replayed = write_ticket(receipts, key, payload, attempt, redelivery, deduplicate)
    return {"result": result, "replayed": replayed, "service_pid": os.getpid()}


def dispatch(caller: str, downstream: str, deduplicate: bool) -> dict[str, Any]:
    from oncewire.dispatch.dispatcher import Dispatcher
    from oncewire.effects.outcomes import Done
    from oncewire.ledger import Ledger
    from oncewire.sinks.subprocess import SubprocessSink

    argv = [sys.executable, "-m", MODULE, "service"]
    argv += ["--caller", caller, "--downstream", downstream]
    if not deduplicate:
        argv.append("--no-deduplication")
    sink = SubprocessSink(
        argv, timeout_seconds=30, rejected_exit_codes=(EXIT_CONFLICT,), keep_history=True
    )

    def ticket_sink(attempt: Attempt) -> Any:
        # The service answers {"result": ..., "replayed": ..., "service_pid": ...}; the effect's
        # result is the ticket itself, the rest stays in the sink's history for the evidence.
        outcome = sink(attempt)
        if isinstance(outcome, Done) and isinstance(outcome.result, dict):
            return Done(outcome.result.get("result"))
        return outcome

    with Ledger(caller) as ledger:
        dispatcher = Dispatcher(
            ledger, {KIND: ticket_sink}, batch_size=8, poll_seconds=0.02, retry=lab_retry()
        )
        stats = dispatcher.run(until_idle=True)
        if stats.claimed == 0 and stats.released == 0:
            return {"idle": True}
        results = {
            e.key: {"state": str(e.state), "result": e.result}
            for e in ledger.effects.list(limit=100_000)
        }
    return {"stats": stats.as_dict(), "effects": results, "downstream": sink.history}


class TortureSink:
    """Writes tickets in-process, and misbehaves on purpose (seeded per key and attempt)."""

    def __init__(self, downstream: str, deduplicate: bool, seed: int, delay: float) -> None:
        from oncewire.receipts.service import Receipts

        self.receipts = Receipts(downstream, retention_seconds=None)
        self.deduplicate = deduplicate
        self.seed = seed
        self.delay = delay

    def __call__(self, attempt: Attempt) -> Any:
        from oncewire.effects.outcomes import Done, MaybeSent, NotSent

        rng = random.Random(f"{self.seed}/{attempt.key}/{attempt.number}")
        roll = rng.random()
        time.sleep(rng.random() * self.delay)
        if roll < 0.08:
            return NotSent("receiver busy (before any write)", retry_after=0.01)
        result, _ = write_ticket(
            self.receipts,
            attempt.key,
            attempt.payload,
            attempt.number,
            attempt.redelivery,
            self.deduplicate,
        )
        if roll > 0.94:
            # The ticket is committed but the answer is lost on the way back.
            return MaybeSent("connection reset after the receiver committed")
        return Done(result)


def torture(args: argparse.Namespace) -> dict[str, Any]:
    from oncewire.dispatch.dispatcher import Dispatcher
    from oncewire.ledger import Ledger

    if args.standby:  # blocked before "ready", so a SIGUSR1 sent right after it waits for us
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    sink = TortureSink(args.downstream, not args.no_deduplication, args.seed, args.sink_delay)
    with Ledger(args.caller) as ledger:
        print("ready", flush=True)  # imports done, stores open: the lab may kill from here
        if args.standby:
            signal.sigwait({signal.SIGUSR1})
        dispatcher = Dispatcher(
            ledger,
            {KIND: sink},
            batch_size=args.batch_size,
            concurrency=args.concurrency,
            lease_seconds=args.lease_seconds,
            poll_seconds=0.02,
            retry=lab_retry(),
        )
        stats = dispatcher.run(until_idle=True)
    sink.receipts.close()
    return {"stats": stats.as_dict(), "owner": dispatcher.owner, "pid": os.getpid()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    parser.add_argument("role", choices=["accept", "dispatch", "service", "torture"])
    parser.add_argument("--caller", required=True, help="the caller's store (path or URL)")
    parser.add_argument("--downstream", required=True, help="the downstream store")
    parser.add_argument("--key", default=os.environ.get("ONCEWIRE_KEY", "operation-001"))
    parser.add_argument("--payload", help="JSON; read from stdin when omitted")
    parser.add_argument("--no-deduplication", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lease-seconds", type=float, default=5.0)
    parser.add_argument("--sink-delay", type=float, default=0.008, help="max seconds per call")
    parser.add_argument(
        "--standby",
        action="store_true",
        help="torture: after 'ready', wait for SIGUSR1 before dispatching (a spare the lab "
        "starts ahead of a kill, so a restart does not wait for Python to import oncewire)",
    )
    args = parser.parse_args(argv)
    if crash.armed():
        for module in POINT_MODULES:
            importlib.import_module(module)
    crash.check_armed()
    deduplicate = not args.no_deduplication
    if args.role in ("accept", "service"):
        payload = loads(args.payload if args.payload is not None else sys.stdin.read())
    if args.role == "accept":
        result = accept(args.caller, args.key, payload)
    elif args.role == "service":
        try:
            result = service(args.downstream, args.key, payload, deduplicate)
        except PayloadConflict:
            print(json.dumps({"error": "payload_conflict"}))
            return EXIT_CONFLICT
    elif args.role == "dispatch":
        result = dispatch(args.caller, args.downstream, deduplicate)
    else:
        result = torture(args)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
