"""Suite ``runs``: a run-ledger process killed with SIGKILL mid-review, mid-repair and between
its candidate and its completion delivery, then reconciled by restarted processes.

Each scenario runs :mod:`oncewire.lab.children.runs` on a fresh store of the lab's backend (a
SQLite file, or a schema of its PostgreSQL database) with a crash point armed, observes exit
-9, and then:

* reconciles at once, while the dead owner's lease is still running: nothing may be touched;
* waits for the lease to run out and reconciles in a new process;
* reconciles once more in another process: nothing may change (no second terminal).

The invariants are read with the plain driver (sqlite3 or psycopg): the run's status, exactly
one terminal event, how the open phase was closed, that no verdict, finding, resolution or
delivery was invented, that a committed delivery was published once with its bytes unchanged,
and that the whole history still verifies.
"""

from __future__ import annotations

import hashlib
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from oncewire import Ledger
from oncewire.lab.children.runs import CONTENT, RUN_ID
from oncewire.lab.fixtures import dialect_of, rows
from oncewire.lab.framework import LabContext, ProcessRecord, ScenarioResult, Suite

__all__ = ["MODULE", "SUITE", "run_runs", "snapshot"]

MODULE = "oncewire.lab.children.runs"
KILLED = -signal.SIGKILL
LEASE_SECONDS = 2.5
# Every run-ledger table, in the order its rows were written.
TABLES = {
    "oncewire_runs": "created_at, run_id",
    "oncewire_run_events": "id",
    "oncewire_run_phases": "run_id, opened_seq",
    "oncewire_run_findings": "run_id, finding_id",
    "oncewire_run_actions": "run_id, proposed_seq",
    "oncewire_run_deliveries": "created_at, delivery_id",
    "oncewire_run_reports": "id",
}


def snapshot(db: str) -> dict[str, list[dict[str, Any]]]:
    """Every run-ledger table, read around oncewire (``db`` is a file or a PostgreSQL URL)."""
    dialect = dialect_of(db)
    return {
        table: rows(dialect, db, f"SELECT * FROM {table} ORDER BY {order}")
        for table, order in TABLES.items()
    }


def _store(ctx: LabContext, folder: Path, key: str) -> str:
    """One scenario's store on the lab's backend: a file in ``folder``, or a fresh schema."""
    if ctx.backend.name == "sqlite":
        return str(folder / "runs.db")
    pair = ctx.backend.pair(folder)
    ctx.pairs[key] = pair
    return pair.caller


Check = Callable[[ScenarioResult, dict[str, list[dict[str, Any]]]], None]


def _scenario(
    ctx: LabContext, name: str, role: str, arm: str, expect_status: str, check: Check
) -> ScenarioResult:
    result = ScenarioResult(name)
    folder = ctx.scenario_dir("runs", name)
    db = _store(ctx, folder, f"runs/{name}")
    args = ["--db", db, "--lease-seconds", str(LEASE_SECONDS)]

    spawned = time.monotonic()  # the dead owner's lease began after this instant
    killed = ctx.child(role, args, arm=arm, module=MODULE)
    died_at = time.monotonic()
    result.processes.append(killed)
    result.require(killed.exit_code == KILLED, f"the worker did not die from SIGKILL: {killed}")
    before = snapshot(db)
    result.before = before

    def reconcile(owner: str) -> ProcessRecord:
        record = ctx.child("reconcile", ["--db", db, "--owner", owner], module=MODULE)
        result.processes.append(record)
        result.require(record.exit_code == 0, f"reconcile failed: {record.stderr[-400:]}")
        return record

    early = reconcile("restart-early")
    reports = (early.response or {}).get("reports")
    live_lease_kept = reports == [] and snapshot(db) == before
    lease_certainly_live = time.monotonic() - spawned < LEASE_SECONDS
    if lease_certainly_live:
        result.require(live_lease_kept, f"a live lease was reconciled: {reports}")
    time.sleep(max(0.0, died_at + LEASE_SECONDS + 0.2 - time.monotonic()))
    recovered = reconcile("restart-1")
    after = snapshot(db)
    result.after = after
    again = reconcile("restart-2")
    result.require(
        (again.response or {}).get("reports") == [], f"a second reconcile acted: {again.response}"
    )
    result.require(snapshot(db) == after, "a second reconcile changed the database")

    runs = after["oncewire_runs"]
    run = runs[0] if runs else {}
    result.require(len(runs) == 1, f"expected one run, found {len(runs)} (none invented)")
    result.require(run.get("status") == expect_status, f"run status is {run.get('status')}")
    terminals = [e for e in after["oncewire_run_events"] if e["terminal"]]
    result.require(len(terminals) == 1, f"expected one terminal event, found {len(terminals)}")
    prefix = after["oncewire_run_events"][: len(before["oncewire_run_events"])]
    result.require(prefix == before["oncewire_run_events"], "a pre-crash event was rewritten")
    with Ledger(db, create=False) as ledger:
        verification = ledger.runs.verify(RUN_ID)[0]
    result.require(verification.ok, f"the history does not verify: {verification.reason}")
    check(result, after)
    result.summary = {
        "crash_exit": killed.exit_code,
        "events_before": len(before["oncewire_run_events"]),
        "events_after": len(after["oncewire_run_events"]),
        "status": run.get("status"),
        "terminal_reason": run.get("terminal_reason"),
        "reports": (recovered.response or {}).get("reports"),
        "early_reconcile_untouched": live_lease_kept,
        "early_reconcile_within_lease": lease_certainly_live,
    }
    return result


def _mid_review(result: ScenarioResult, db: dict[str, list[dict[str, Any]]]) -> None:
    phases = db["oncewire_run_phases"]
    result.require(
        [(p["status"], p["verdict"]) for p in phases] == [("unavailable", "review_unavailable")],
        f"the interrupted review was closed as {[(p['status'], p['verdict']) for p in phases]}",
    )
    result.require(not db["oncewire_run_findings"], "a finding was invented")


def _mid_repair(result: ScenarioResult, db: dict[str, list[dict[str, Any]]]) -> None:
    repair = [p for p in db["oncewire_run_phases"] if p["kind"] == "repair"]
    result.require(
        [p["status"] for p in repair] == ["outcome_unknown"],
        f"the interrupted repair was closed as {[p['status'] for p in repair]}",
    )
    actions = [(a["action_id"], a["status"]) for a in db["oncewire_run_actions"]]
    result.require(actions == [("write-1", "proposed")], f"actions after recovery: {actions}")


def _before_delivery(result: ScenarioResult, db: dict[str, list[dict[str, Any]]]) -> None:
    result.require(not db["oncewire_run_deliveries"], "a delivery was invented")


def _before_publish(result: ScenarioResult, db: dict[str, list[dict[str, Any]]]) -> None:
    deliveries = db["oncewire_run_deliveries"]
    result.require(len(deliveries) == 1, f"expected one delivery, found {len(deliveries)}")
    if not deliveries:
        return
    delivery = deliveries[0]
    result.require(delivery["status"] == "published", f"delivery is {delivery['status']}")
    result.require(
        delivery["review_status"] == "review_unavailable",
        f"an unreviewed candidate was settled as {delivery['review_status']}",
    )
    result.require(delivery["content"] == CONTENT, "the message bytes changed")
    result.require(
        delivery["content_sha256"] == hashlib.sha256(CONTENT.encode()).hexdigest(),
        "the message digest changed",
    )


def run_runs(ctx: LabContext) -> Iterator[ScenarioResult]:
    cells = [
        # start, candidate, start_review: the third command commits, the reviewer never answers
        ("mid_review", "review", "runs.command_after_commit@3", "review_unavailable", _mid_review),
        # ... start_repair, bind_actions, propose_action: the seventh, a write never resolved
        ("mid_repair", "repair", "runs.command_after_commit@7", "outcome_unknown", _mid_repair),
        # start, candidate: the second commits, the delivery is never committed
        (
            "candidate_before_delivery",
            "deliver",
            "runs.command_after_commit@2",
            "review_unavailable",
            _before_delivery,
        ),
        # the delivery is committed with its manifest, never published
        (
            "delivery_before_publish",
            "deliver",
            "runs.delivery_after_commit",
            "review_unavailable",
            _before_publish,
        ),
    ]
    for name, role, arm, status, check in cells:
        ctx.progress.update(f"runs: {name}")
        yield _scenario(ctx, name, role, arm, status, check)


SUITE = Suite(
    "runs",
    "run ledger: SIGKILL mid-review, mid-repair and before delivery; reconcile",
    run_runs,
    key_numbers=("crash_exit", "events_before", "events_after", "status"),
)
