"""Suite ``crashpoints``: every crash point of the outbox path, with deduplication on and off.

The matrix is enumerated from the crash point registry: a point registered in the effects,
dispatch or receipts code joins it without new test code. Each cell accepts three operations
and dispatches them with the point armed once for the whole process tree (accept, dispatch and
the downstream service all inherit it; whichever reaches it first dies). The lab restarts
whatever died, then checks the stores:

* the point was reached, and the process that reached it died from SIGKILL;
* no accepted operation is lost, every effect is ``done``;
* with receipts, exactly one ticket per key, and the caller's result names it;
* without receipts, every ticket beyond the first for a key carries the redelivery flag.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator

from oncewire.core import crash
from oncewire.core.canonical import canonical_json
from oncewire.lab.fixtures import FIXTURE, snapshot
from oncewire.lab.framework import LabContext, ProcessRecord, ScenarioResult, Suite

__all__ = ["OUTBOX_PREFIXES", "SUITE", "outbox_points", "run_crashpoints"]

OUTBOX_PREFIXES = ("effects.", "dispatch.", "receipts.")
KEYS = ("operation-001", "operation-002", "operation-003")
KILLED = -signal.SIGKILL
MAX_RESTARTS = 5


def outbox_points() -> list[str]:
    import oncewire.dispatch
    import oncewire.effects
    import oncewire.receipts  # noqa: F401  (importing registers their points)

    return [name for name in crash.registry() if name.startswith(OUTBOX_PREFIXES)]


def _cell(ctx: LabContext, point: str, deduplicate: bool) -> ScenarioResult:
    mode = "dedup" if deduplicate else "no_dedup"
    result = ScenarioResult(f"{point}[{mode}]")
    if point.startswith("receipts.") and not deduplicate:
        result.skipped = "receipts are not on the path when deduplication is off"
        return result
    stores = ctx.stores("crashpoints", f"{point}-{mode}")
    token = ctx.root / "crashpoints" / f"{point}-{mode}" / "crash.token"
    died: list[ProcessRecord] = []

    def run(role: str, args: list[str], stdin: str | None = None) -> ProcessRecord:
        for _ in range(MAX_RESTARTS):
            record = ctx.child(role, args, arm=point, token=token, stdin=stdin)
            result.processes.append(record)
            if record.exit_code != KILLED:
                return record
            died.append(record)
        return record

    for key in KEYS:
        record = run("accept", [*stores.args(), "--key", key], canonical_json(FIXTURE))
        result.require(record.exit_code == 0, f"accept {key} failed: {record.stderr[-300:]}")
    before = snapshot(stores)
    dispatch_args = stores.args() + ([] if deduplicate else ["--no-deduplication"])
    record = run("dispatch", dispatch_args)
    result.require(record.exit_code == 0, f"dispatch failed: {record.stderr[-300:]}")
    after = snapshot(stores)
    result.before, result.after = before, after

    fired = token.read_text().split() if token.exists() else []
    result.require(bool(fired), f"crash point {point} was never reached")
    downstream_killed = [
        entry
        for process in result.processes
        for entry in (process.response or {}).get("downstream", [])
        if isinstance(process.response, dict) and entry.get("exit_code") == KILLED
    ]
    result.require(
        len(died) + len(downstream_killed) == (1 if fired else 0),
        f"expected one SIGKILL, saw {len(died)} here and {len(downstream_killed)} downstream",
    )
    keys = [effect["key"] for effect in after["effects"]]
    result.require(sorted(keys) == list(KEYS), f"effects lost or invented: {keys}")
    result.require(
        all(effect["state"] == "done" for effect in after["effects"]),
        f"not every effect is done: {[(e['key'], e['state']) for e in after['effects']]}",
    )
    result.require(len(after["operations"]) == len(KEYS), "an operation row is missing")
    per_key = Counter(ticket["operation_id"] for ticket in after["tickets"])
    result.require(set(per_key) == set(KEYS), f"a key has no ticket: {dict(per_key)}")
    if deduplicate:
        result.require(all(n == 1 for n in per_key.values()), f"duplicate tickets: {dict(per_key)}")
        by_key = {t["operation_id"]: t["id"] for t in after["tickets"]}
        for effect in after["effects"]:
            result.require(
                effect["result"] == canonical_json({"ticket_id": by_key.get(effect["key"])}),
                f"{effect['key']}: the caller's result does not name its ticket",
            )
    else:
        seen: set[str] = set()
        for ticket in after["tickets"]:
            if ticket["operation_id"] in seen:
                result.require(
                    ticket["redelivery"] == 1,
                    f"ticket {ticket['id']} duplicates {ticket['operation_id']} unflagged",
                )
            seen.add(ticket["operation_id"])
    result.summary = {
        "fired_in_pid": int(fired[1]) if len(fired) > 1 else None,
        "killed_roles": [p.role for p in died] + ["service"] * len(downstream_killed),
        "tickets": len(after["tickets"]),
        "duplicates": sum(n - 1 for n in per_key.values()),
        "flagged_redeliveries": sum(t["redelivery"] for t in after["tickets"]),
        "effects_done": sum(e["state"] == "done" for e in after["effects"]),
    }
    return result


def run_crashpoints(ctx: LabContext) -> Iterator[ScenarioResult]:
    for point in outbox_points():
        for deduplicate in (True, False):
            ctx.progress.update(f"crashpoints: {point} dedup={'on' if deduplicate else 'off'}")
            yield _cell(ctx, point, deduplicate)


SUITE = Suite(
    "crashpoints",
    "every registered outbox crash point x deduplication on/off",
    run_crashpoints,
    key_numbers=("killed_roles", "effects_done", "tickets", "duplicates", "flagged_redeliveries"),
)
