"""Suite ``outbox``: the five two-store scenarios, with three kinds of process.

An ``accept`` process writes an operation and its effect in one transaction of the caller's
store; a ``dispatch`` process claims it and runs the downstream ``service`` as its own process;
the service writes a ticket (and, with deduplication, a receipt) in the downstream store. The
dispatcher is killed with SIGKILL at named crash points, restarted, and the stores are read
directly afterwards.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from oncewire.core.canonical import canonical_json
from oncewire.lab.fixtures import FIXTURE, StorePair, snapshot
from oncewire.lab.framework import LabContext, ScenarioResult, Suite

__all__ = ["SUITE", "run_outbox"]

KEY = "operation-001"
KILLED = -signal.SIGKILL

# The seed's crash names, mapped to oncewire's registered crash points.
CRASH_BEFORE_DISPATCH = "dispatch.after_claim"
CRASH_AFTER_DOWNSTREAM_COMMIT = "dispatch.after_sink_before_record"
CRASH_DURING_ACCEPTANCE = "effects.accept_before_commit"


def _accept(ctx: LabContext, pair: StorePair, *, arm: str | None = None) -> Any:
    return ctx.child(
        "accept",
        [*pair.args(), "--key", KEY],
        arm=arm,
        stdin=canonical_json(FIXTURE),
    )


def _dispatch(
    ctx: LabContext, pair: StorePair, *, deduplicate: bool, arm: str | None = None
) -> Any:
    args = pair.args()
    if not deduplicate:
        args.append("--no-deduplication")
    return ctx.child("dispatch", args, arm=arm)


def _dispatch_crash(ctx: LabContext, name: str, crash: str, deduplicate: bool) -> ScenarioResult:
    result = ScenarioResult(name)
    stores = ctx.stores("outbox", name)
    acceptance = _accept(ctx, stores)
    failed = _dispatch(ctx, stores, deduplicate=deduplicate, arm=crash)
    result.processes += [acceptance, failed]
    result.require(acceptance.exit_code == 0, f"acceptance failed: {acceptance.stderr}")
    result.require(failed.exit_code == KILLED, f"dispatcher did not die from SIGKILL: {failed}")

    before = snapshot(stores)
    result.before = before
    expected_before = 0 if crash == CRASH_BEFORE_DISPATCH else 1
    result.require(
        len(before["tickets"]) == expected_before,
        f"expected {expected_before} ticket(s) before recovery, found {len(before['tickets'])}",
    )
    effect = before["effects"][0] if before["effects"] else {}
    result.require(effect.get("state") == "claimed", f"effect before recovery: {effect}")
    result.require(effect.get("result") is None, "the caller has a result before recovery")

    recovered = _dispatch(ctx, stores, deduplicate=deduplicate)
    result.processes.append(recovered)
    result.require(recovered.exit_code == 0, f"recovery failed: {recovered.stderr}")
    after = snapshot(stores)
    result.after = after
    expected_after = 1 if deduplicate or crash == CRASH_BEFORE_DISPATCH else 2
    result.require(
        len(after["tickets"]) == expected_after,
        f"expected {expected_after} ticket(s) after recovery, found {len(after['tickets'])}",
    )
    done = after["effects"][0] if after["effects"] else {}
    result.require(done.get("state") == "done", f"effect after recovery: {done}")
    stored = (recovered.response or {}).get("effects", {}).get(KEY, {}).get("result")
    result.require(
        done.get("result") == canonical_json(stored),
        "the caller's stored result is not the one returned",
    )
    ticket_id = stored.get("ticket_id") if isinstance(stored, dict) else None
    result.require(
        ticket_id == after["tickets"][-1]["id"] if after["tickets"] else False,
        "the recovered result does not name the last ticket",
    )
    if deduplicate:
        result.require(stored == {"ticket_id": 1}, f"original result not recovered: {stored}")
        receipt = after["receipts"][0]["result"] if after["receipts"] else None
        result.require(receipt == canonical_json(stored), "the receipt does not match the result")
    else:
        extra = after["tickets"][1:]
        result.require(
            all(ticket["redelivery"] == 1 for ticket in extra),
            "a duplicate ticket arrived without the redelivery flag",
        )
    if crash == CRASH_AFTER_DOWNSTREAM_COMMIT:
        calls = (recovered.response or {}).get("downstream", [])
        result.require(
            bool(calls) and all(call["redelivery"] for call in calls),
            "the attempt after the crash was not flagged as a redelivery",
        )

    idle = _dispatch(ctx, stores, deduplicate=deduplicate)
    result.processes.append(idle)
    result.require(
        idle.response == {"idle": True}, f"a completed effect was dispatched again: {idle.response}"
    )
    result.require(snapshot(stores) == after, "an idle dispatcher changed the stores")
    result.summary = {
        "crash_exit": failed.exit_code,
        "tickets_before": len(before["tickets"]),
        "tickets_after": len(after["tickets"]),
        "caller_state": done.get("state"),
        "ticket_id": ticket_id,
    }
    return result


def _acceptance_crash(ctx: LabContext) -> ScenarioResult:
    result = ScenarioResult("crash_during_acceptance")
    stores = ctx.stores("outbox", "acceptance_rollback")
    failed = _accept(ctx, stores, arm=CRASH_DURING_ACCEPTANCE)
    result.processes.append(failed)
    result.require(failed.exit_code == KILLED, f"the accepting process survived: {failed}")
    before = snapshot(stores)
    result.before = before
    result.require(
        before == {"operations": [], "effects": [], "tickets": [], "receipts": []},
        "a partial acceptance survived the crash",
    )
    accepted = _accept(ctx, stores)
    recovered = _dispatch(ctx, stores, deduplicate=True)
    result.processes += [accepted, recovered]
    after = snapshot(stores)
    result.after = after
    result.require(accepted.exit_code == 0 and recovered.exit_code == 0, "resubmission failed")
    result.require(len(after["operations"]) == 1, "the operation row is missing")
    result.require(
        len(after["tickets"]) == 1 and after["effects"][0]["state"] == "done",
        "the resubmitted operation was not delivered once",
    )
    result.summary = {
        "crash_exit": failed.exit_code,
        "partial_operations": len(before["operations"]),
        "partial_outbox": len(before["effects"]),
        "tickets_after": len(after["tickets"]),
    }
    return result


def _changed_payload(ctx: LabContext) -> ScenarioResult:
    result = ScenarioResult("changed_payload_rejected")
    stores = ctx.pairs["outbox/crash_after_downstream_commit"]
    original = snapshot(stores)
    changed = {**FIXTURE, "priority": "urgent"}
    conflict = ctx.child(
        "service",
        [*stores.args(), "--key", KEY, "--payload", canonical_json(changed)],
    )
    result.processes.append(conflict)
    result.require(conflict.exit_code == 3, f"expected exit 3, got {conflict.exit_code}")
    result.require(
        conflict.response == {"error": "payload_conflict"}, f"unexpected answer {conflict.response}"
    )
    result.require(snapshot(stores) == original, "the rejected payload changed a store")
    result.before = result.after = original
    result.summary = {"exit_code": conflict.exit_code, "tickets_after": len(original["tickets"])}
    return result


def _timed(scenario: Callable[[], ScenarioResult]) -> ScenarioResult:
    started = time.monotonic()
    result = scenario()
    result.duration_seconds = time.monotonic() - started
    return result


def run_outbox(ctx: LabContext) -> Iterator[ScenarioResult]:
    """The first four scenarios side by side, then the one that reads another's stores.

    Each of the four has its own stores and its own processes, and spends most of its time
    waiting for a child Python process to start; run one after another they wait in turn.
    Their results come back in this order whichever finishes first.
    """
    independent: list[Callable[[], ScenarioResult]] = [
        lambda: _dispatch_crash(ctx, "crash_before_dispatch", CRASH_BEFORE_DISPATCH, True),
        lambda: _dispatch_crash(
            ctx, "crash_after_downstream_commit", CRASH_AFTER_DOWNSTREAM_COMMIT, True
        ),
        lambda: _dispatch_crash(
            ctx, "deduplication_disabled", CRASH_AFTER_DOWNSTREAM_COMMIT, False
        ),
        lambda: _acceptance_crash(ctx),
    ]
    with ThreadPoolExecutor(max_workers=len(independent), thread_name_prefix="lab-outbox") as pool:
        running = [pool.submit(_timed, scenario) for scenario in independent]
        for future in running:
            yield future.result()
    yield _timed(lambda: _changed_payload(ctx))


SUITE = Suite(
    "outbox",
    "the five two-store outbox scenarios with real SIGKILL",
    run_outbox,
    key_numbers=("crash_exit", "exit_code", "tickets_before", "tickets_after", "caller_state"),
)
