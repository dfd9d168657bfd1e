"""Suite ``workers``: four dispatcher processes on one store, under fire.

Four workers share the caller's outbox and a receipts-backed receiver. While they work, the lab
SIGKILLs some of them at random (each is replaced at once), SIGSTOPs one while it holds claims
and keeps it stopped past its lease (its peers take its effects over; when it is resumed with
SIGCONT, the outcomes it then tries to record must be refused by the fence), and on PostgreSQL
terminates every worker's database connection with ``pg_terminate_backend``. Invariants, read
from both stores: no effect lost, every effect terminal, exactly one ticket per key, nothing left
claimed, and at least one stale outcome refused.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from collections import Counter
from typing import Any

from oncewire.lab.fixtures import (
    accept_all,
    claims_held_by,
    claims_lockable,
    snapshot,
    terminate_connections,
)
from oncewire.lab.framework import LabContext, ScenarioResult, Suite

__all__ = ["SUITE", "run_workers"]

WORKERS = 4
LEASE_SECONDS = 2.0
DEFAULT_OPERATIONS = 600
DEFAULT_KILLS = 3


def _finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    stdout, stderr = process.communicate(timeout=180)
    lines = stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines and lines[-1] != "ready" else None
    except json.JSONDecodeError:
        answer = None
    return {
        "pid": process.pid,
        "exit_code": process.returncode,
        "stats": (answer or {}).get("stats"),
        "stderr": stderr[-1500:],
    }


def run_workers(ctx: LabContext) -> list[ScenarioResult]:
    result = ScenarioResult(f"four_workers[{ctx.backend.name}]")
    rng = random.Random(f"workers/{ctx.seed}")
    operations = int(ctx.options.get("operations") or DEFAULT_OPERATIONS)
    kills_option = ctx.options.get("kills")
    kills_wanted = DEFAULT_KILLS if kills_option is None else min(int(kills_option), 6)
    stores = ctx.stores("workers", ctx.backend.name)
    keys = accept_all(stores, operations)
    args = [
        *stores.args(),
        "--seed",
        str(ctx.seed),
        "--lease-seconds",
        str(LEASE_SECONDS),
        "--sink-delay",
        "0.03",
        "--batch-size",
        "8",
    ]

    def start(standby: bool = False) -> subprocess.Popen[str]:
        process = ctx.spawn("torture", [*args, "--standby"] if standby else args)
        assert process.stdout is not None
        process.stdout.readline()  # "ready"
        return process

    # The four start together: each waits, stores open, for SIGUSR1. Started one after the
    # other, the first ones could finish the work before the last one is ready on a busy
    # machine, and there would be no claims left to stop a worker with.
    live = [start(standby=True) for _ in range(WORKERS)]
    for process in live:
        process.send_signal(signal.SIGUSR1)
    finished: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    began = time.monotonic()

    # One worker is stopped while it holds claims, and kept stopped past its lease: the first
    # one seen holding claims (on a loaded machine a given worker may claim little or late).
    # Not while it is inside a write transaction: then it holds the lock a release of its
    # claims needs, its peers cannot take them over however long it stays stopped, and it
    # would find its claims still its own when it resumes (nothing stale to refuse).
    stopped = live[0]
    stopped_with = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not stopped_with:
        for candidate in live:
            if candidate.poll() is None and claims_held_by(stores, candidate.pid):
                candidate.send_signal(signal.SIGSTOP)
                stopped_with = claims_held_by(stores, candidate.pid)
                if stopped_with and claims_lockable(stores, candidate.pid):
                    stopped = candidate
                    break
                stopped_with = 0
                candidate.send_signal(signal.SIGCONT)
        time.sleep(0.005)
    stop_at = time.monotonic()
    events.append(
        {
            "at": round(stop_at - began, 3),
            "event": "SIGSTOP",
            "pid": stopped.pid,
            "claims_held": stopped_with,
        }
    )
    result.require(stopped_with > 0, "could not stop a worker while it held claims")

    # Within the stopped worker's lease its peers cannot go idle (its claims are still held),
    # so every kill finds a live worker to hit.
    kill_times = sorted(rng.uniform(0.1, LEASE_SECONDS * 0.9) for _ in range(kills_wanted))
    terminate_at = (
        rng.uniform(0.3, LEASE_SECONDS * 0.8) if ctx.backend.name == "postgresql" else None
    )
    resume_at = LEASE_SECONDS + 1.5
    kills = terminations = 0
    resumed = False
    while not resumed:
        elapsed = time.monotonic() - stop_at
        if kill_times and elapsed >= kill_times[0]:
            kill_times.pop(0)
            candidates = [p for p in live if p is not stopped and p.poll() is None]
            if candidates:
                victim = rng.choice(candidates)
                victim.send_signal(signal.SIGKILL)
                finished.append(_finish(victim))
                live.remove(victim)
                live.append(start())
                kills += 1
                events.append(
                    {
                        "at": round(time.monotonic() - began, 3),
                        "event": "SIGKILL",
                        "pid": victim.pid,
                    }
                )
        if terminate_at is not None and elapsed >= terminate_at:
            terminate_at = None
            assert ctx.backend.url is not None
            terminations = terminate_connections(
                ctx.backend.url, f"oncewire-lab-{ctx.backend.run_id}"
            )
            events.append(
                {
                    "at": round(time.monotonic() - began, 3),
                    "event": "pg_terminate_backend",
                    "connections": terminations,
                }
            )
        if elapsed >= resume_at and not kill_times and terminate_at is None:
            stopped.send_signal(signal.SIGCONT)
            resumed = True
            events.append(
                {"at": round(time.monotonic() - began, 3), "event": "SIGCONT", "pid": stopped.pid}
            )
        time.sleep(0.01)

    for process in live:
        finished.append(_finish(process))
    drain = ctx.child("torture", args, deadline_seconds=120)
    result.processes.append(drain)

    after = snapshot(stores)
    result.after = {"counts": {name: len(rows) for name, rows in after.items()}}
    stopped_report = next(f for f in finished if f["pid"] == stopped.pid)
    refused = (stopped_report["stats"] or {}).get("stale_refused", 0)
    for report in finished:
        expected = (
            -signal.SIGKILL
            if any(e["event"] == "SIGKILL" and e["pid"] == report["pid"] for e in events)
            else 0
        )
        result.require(
            report["exit_code"] == expected,
            f"worker {report['pid']} exited {report['exit_code']}, expected {expected}: "
            f"{report['stderr'][-300:]}",
        )
    result.require(drain.exit_code == 0, f"the draining worker failed: {drain.stderr[-300:]}")
    effects = {e["key"]: e for e in after["effects"]}
    result.require(sorted(effects) == keys, "an accepted effect is missing")
    states = Counter(e["state"] for e in after["effects"])
    result.require(
        states == Counter({"done": len(keys)}), f"not every effect is done: {dict(states)}"
    )
    per_key = Counter(t["operation_id"] for t in after["tickets"])
    result.require(
        all(per_key.get(key) == 1 for key in keys) and len(per_key) == len(keys),
        f"tickets per key not exactly one: {[k for k in keys if per_key.get(k) != 1][:5]}",
    )
    result.require(refused >= 1, "the resumed worker recorded no refused stale outcome")
    result.require(kills == kills_wanted, f"{kills} of {kills_wanted} kills landed")
    if ctx.backend.name == "postgresql":
        result.require(terminations >= 1, "no database connection was terminated")
    result.summary = {
        "workers": WORKERS,
        "effects": len(keys),
        "done": states.get("done", 0),
        "tickets": len(after["tickets"]),
        "duplicates": sum(n - 1 for n in per_key.values()),
        "kills": kills,
        "stopped_with_claims": stopped_with,
        "stale_outcomes_refused": refused,
        "connections_terminated": terminations,
        "storage_errors_survived": sum(
            (f["stats"] or {}).get("storage_errors", 0) for f in finished
        ),
        "redeliveries": sum((f["stats"] or {}).get("redeliveries", 0) for f in finished),
    }
    result.details = {"events": events, "workers": finished}
    return [result]


SUITE = Suite(
    "workers",
    "four workers, random SIGKILLs, a SIGSTOP past the lease, dropped connections",
    run_workers,
    key_numbers=(
        "effects",
        "done",
        "kills",
        "duplicates",
        "stopped_with_claims",
        "stale_outcomes_refused",
        "connections_terminated",
    ),
)
