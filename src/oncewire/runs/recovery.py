"""Reconciliation: closing what dead owners left, without inventing a result.

Only runs whose lease expired are touched; a live owner's run is never. What happens to a run
is its workflow's recovery plan (:data:`RECOVERY_PLANS`). The review preset's runs are
reconciled each in its own transaction, through the same commands a live run would use (an
interrupted review is completed as ``review_unavailable`` with no findings, then the run
terminates); a review run about which nothing truthful can be said (a repair that kept no action
ledger) is released as ``abandoned`` without a terminal. A turn is deferred (``resumable``): the
gateway resumes it. A scope held by a revert barrier is deferred. A run whose
history fails verification is released without touching its evidence. Committed deliveries
that no live run protects are then settled, each in its own transaction.

Every outcome is stored as a report row in the same transaction as the change it reports. A
failure is reported (in the returned list, and in a report row of its own) and never stops the
sweep: one run's failure cannot deny the others their recovery.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from oncewire.core import crash
from oncewire.core.canonical import canonical_json, digest_unchecked
from oncewire.core.ids import new_id, owner_is_dead_locally
from oncewire.runs import append
from oncewire.runs.append import RunContext
from oncewire.runs.machine import RecoveryPlan, State
from oncewire.runs.records import ReconcileReport
from oncewire.runs.review.recovery import recovery_plan as review_plan
from oncewire.runs.turn.recovery import recovery_plan as turn_plan
from oncewire.storage.runs import DeliveryRow, ReportRow, RunRow

__all__ = [
    "RECOVERY_PLANS",
    "RECOVERY_REASON",
    "reconcile",
    "reconcile_delivery",
    "reconcile_run",
]

RECOVERY_REASON = "lease_expired"


def _review(ctx: RunContext, state: State) -> RecoveryPlan:
    """The review preset closes the run through its own commands (see its recovery module),
    reading the outbox for how each linked effect ended."""
    effect_states: dict[str, str] = {}
    for action in state["unresolved"].values():
        if action.get("effect_key"):
            effect = ctx.effects.find(action["effect_key"])
            if effect is not None:
                effect_states[action["effect_key"]] = str(effect.state)
    steps, abandon = review_plan(state, effect_states, reason=RECOVERY_REASON)
    return RecoveryPlan(steps=tuple(steps), abandon=abandon)


# Each workflow's recovery plan: what reconciliation does with a run of it that a dead owner
# left. A workflow without one is deferred (``no_recovery_plan``), never closed by guesswork.
RECOVERY_PLANS: dict[str, Callable[[RunContext, State], RecoveryPlan]] = {
    "review": _review,
    "turn": turn_plan,
}

RECONCILE_BEFORE_COMMIT = crash.register(
    "runs.reconcile_before_commit", "a run's reconciliation is written but not committed"
)


def _report_row(pass_id: str, owner: str, report: ReconcileReport, now: float) -> ReportRow:
    return ReportRow(
        id=0,
        pass_id=pass_id,
        subject=report.subject,
        subject_id=report.subject_id,
        run_id=report.run_id,
        owner=owner,
        outcome=report.outcome,
        status=report.status,
        reason=report.reason,
        error=report.error,
        created_at=now,
    )


def reconcile_run(
    ctx: RunContext,
    run_id: str,
    *,
    owner: str,
    now: float,
    pass_id: str,
    dead_owners: frozenset[str] = frozenset(),
) -> ReconcileReport | None:
    """Reconcile one run in one transaction; None when it needs nothing (any more)."""
    store = ctx.store
    with store.transaction() as tx:
        context = store.command_context_in_tx(tx, run_id, "")
        if context is None or not context.run.active:
            return None
        row = context.run
        live = row.lease_expires_at is not None and row.lease_expires_at >= now
        if live and row.owner not in dead_owners:
            return None  # renewed since the sweep listed it: its owner is alive
        if context.barrier is not None:
            report = ReconcileReport(
                "run", run_id, run_id, "deferred", row.status, "revert_barrier"
            )
        else:
            result = append.audit(ctx, row)
            if not result.ok or result.state is None:
                store.abandon_run_in_tx(tx, run_id, reason="safety_boundary", now=now)
                report = ReconcileReport(
                    "run",
                    run_id,
                    run_id,
                    "abandoned",
                    "failed",
                    "safety_boundary",
                    error=None,
                )
            else:
                state = result.state
                planner = RECOVERY_PLANS.get(row.workflow)
                plan = (
                    planner(ctx, state)
                    if planner is not None
                    else RecoveryPlan(defer="no_recovery_plan")
                )
                if plan.defer is not None:
                    # Nothing is written but the report: the run, its lease and its fence stay.
                    report = ReconcileReport(
                        "run", run_id, run_id, "deferred", row.status, plan.defer
                    )
                elif plan.abandon is not None:
                    append.abandon_in_tx(ctx, tx, row, reason=plan.abandon)
                    report = ReconcileReport(
                        "run", run_id, run_id, "abandoned", row.status, plan.abandon
                    )
                else:
                    fence = row.fence + 1
                    for index, (command, request) in enumerate(plan.steps):
                        _, row, state = append.append_in_tx(
                            ctx,
                            tx,
                            row,
                            state,
                            command,
                            request,
                            key=f"reconcile:{fence}:{index}:{command}",
                            request_digest=_digest(command, request),
                            owner=owner,
                            fence=fence,
                            lease_expires_at=None,
                        )
                    report = ReconcileReport(
                        "run",
                        run_id,
                        run_id,
                        "terminal",
                        row.status,
                        row.terminal_reason,
                        finished_at=row.finished_at,
                    )
        store.insert_report_in_tx(tx, _report_row(pass_id, owner, report, now))
        RECONCILE_BEFORE_COMMIT.hit()
    return report


def _digest(command: str, request: dict[str, object]) -> str:
    return digest_unchecked({"command": command, "request": request})


def reconcile_delivery(
    ctx: RunContext, delivery_id: str, *, owner: str, now: float, pass_id: str
) -> ReconcileReport | None:
    """Settle one committed delivery in one transaction; None when a live run protects it."""
    store = ctx.store
    with store.transaction() as tx:
        row: DeliveryRow | None = store.get_delivery_in_tx(tx, delivery_id)
        if row is None or row.status != "committed":
            return None
        if row.lease_expires_at is not None and row.lease_expires_at >= now:
            return None
        candidates = store.runs_for_turn_in_tx(tx, row.scope, row.branch, row.turn)
        if row.run_id is not None:
            named = store.get_run_in_tx(tx, row.run_id)
            candidates = [r for r in candidates if r.run_id != row.run_id]
            if named is not None:
                candidates.append(named)
        if row.turn is None and row.run_id is None:
            candidates = []
        if any(r.active and (r.lease_expires_at or 0) >= now for r in candidates):
            return None  # its run is alive and will promote or settle it
        owner_run = candidates[-1] if candidates else None
        recovery: dict[str, object] = {"schema_version": 1, "reconciled_at": now}
        review_status = row.review_status
        if row.review_status == "candidate":
            # An unreviewed candidate stays unreviewed: recovery never promotes it.
            review_status = (
                "outcome_unknown"
                if owner_run is not None and owner_run.status == "outcome_unknown"
                else "review_unavailable"
            )
            recovery["reason"] = (
                "restart_before_run" if owner_run is None else "restart_before_promotion"
            )
        else:
            recovery["reason"] = "restart_before_publish"
        if owner_run is not None:
            recovery["run_id"] = owner_run.run_id
        store.settle_delivery_in_tx(
            tx,
            delivery_id,
            review_status=review_status,
            recovery_json=canonical_json(recovery),
            published_at=now,
        )
        report = ReconcileReport(
            "delivery",
            delivery_id,
            owner_run.run_id if owner_run else None,
            "settled",
            review_status,
            str(recovery["reason"]),
            finished_at=now,
        )
        store.insert_report_in_tx(tx, _report_row(pass_id, owner, report, now))
    return report


def _failed(
    ctx: RunContext,
    subject: str,
    subject_id: str,
    run_id: str | None,
    exc: BaseException,
    *,
    owner: str,
    now: float,
    pass_id: str,
) -> ReconcileReport:
    error = f"{type(exc).__name__}: {exc}"
    report = ReconcileReport(subject, subject_id, run_id, "failed", None, None, error=error)
    try:
        with ctx.store.transaction() as tx:
            ctx.store.insert_report_in_tx(tx, _report_row(pass_id, owner, report, now))
    except Exception as second:  # the store itself is failing: the returned report says so
        report = ReconcileReport(
            subject,
            subject_id,
            run_id,
            "failed",
            None,
            None,
            error=f"{error}; and its report could not be stored: {type(second).__name__}: {second}",
        )
    return report


def reconcile(
    ctx: RunContext, *, owner: str, limit: int = 100_000, dead_owners: Sequence[str] = ()
) -> list[ReconcileReport]:
    """One sweep: every run whose lease expired (or whose owner is known dead: named in
    ``dead_owners``, or a process on this host that is certainly gone), then every orphaned
    committed delivery."""
    now = ctx.now()
    pass_id = new_id()
    dead = frozenset(dead_owners) | frozenset(
        o for o in ctx.store.active_run_owners() if owner_is_dead_locally(o)
    )
    expired = ctx.store.expired_runs(now=now, limit=limit, dead_owners=sorted(dead))
    # A key that does not fit a run's history (a keyed run and no key or another key, a keyless
    # run and a key) is the caller's configuration: refused before anything is judged or
    # written, never taken for tampering and abandoned as a safety boundary.
    with ctx.store.read_snapshot():
        for row in expired:
            append.chain_key(ctx, row)
    reports: list[ReconcileReport] = []
    # Each run is reconciled in its own transaction; the runs' sweep is flushed to disk once,
    # before it returns. A power loss mid-sweep loses only reconciliations that the next boot
    # redoes (each step is idempotent); a killed process loses none of them. Deliveries keep a
    # flush per commit: settling one is what lets it be published.
    with ctx.store.group_commit():
        reports += _sweep_runs(ctx, expired, owner=owner, now=now, pass_id=pass_id, dead=dead)
    for item in ctx.store.committed_deliveries(now=now, limit=limit):
        try:
            report = reconcile_delivery(
                ctx, item.delivery_id, owner=owner, now=now, pass_id=pass_id
            )
        except Exception as exc:
            report = _failed(
                ctx,
                "delivery",
                item.delivery_id,
                item.run_id,
                exc,
                owner=owner,
                now=now,
                pass_id=pass_id,
            )
        if report is not None:
            reports.append(report)
    return reports


def _sweep_runs(
    ctx: RunContext,
    expired: Sequence[RunRow],
    *,
    owner: str,
    now: float,
    pass_id: str,
    dead: frozenset[str],
) -> list[ReconcileReport]:
    reports: list[ReconcileReport] = []
    for row in expired:
        try:
            report = reconcile_run(
                ctx, row.run_id, owner=owner, now=now, pass_id=pass_id, dead_owners=dead
            )
        except Exception as exc:  # reported below, never swallowed; the sweep goes on
            report = _failed(
                ctx, "run", row.run_id, row.run_id, exc, owner=owner, now=now, pass_id=pass_id
            )
        if report is not None:
            reports.append(report)
    return reports
