"""Child-process roles for the ``runs`` lab suite: ``python -m oncewire.lab.children.runs ROLE``.

review     start a run, record a candidate, review it (pass) and terminate it verified
repair     start, candidate, a review with issues, a repair that binds its action ledger and
           proposes a world-changing write, then resolve it, finish the repair and close
deliver    start, candidate, commit the completion delivery, publish it, close the run
reconcile  open the ledger with boot reconciliation as ``--owner`` and report what it did

Every command goes through the public API, so a crash point armed in the environment
(``runs.command_after_commit@N``, ``runs.delivery_after_commit``) kills the process at that
instant. Each role prints one JSON object on stdout when it finishes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from oncewire import Ledger
from oncewire.core import crash
from oncewire.runs import artifact_manifest

SCOPE = "lab-session"
RUN_ID = "lab-run"
CONTENT = "Candidate result: report.csv (version v1)"
ARTIFACT = b"column\nvalue\n"
CANDIDATE: dict[str, Any] = {
    "candidate_id": "candidate-1",
    "snapshot_sha256": "a" * 64,
    "evidence_sha256": "e" * 64,
    "artifact_set_sha256": "b" * 64,
    "artifact_ids": ["report"],
    "version_ids": ["v1"],
}


def _begin(ledger: Ledger, lease: float) -> None:
    ledger.runs.start(
        RUN_ID,
        key="turn-1:start",
        scope=SCOPE,
        turn="turn-1",
        owner=f"lab-worker:{os.getpid()}",
        lease_seconds=lease,
        params={"budgets": {"max_review_attempts": 2, "max_repair_rounds": 1}},
    )
    ledger.runs.review.record_candidate(RUN_ID, key="candidate-1", **CANDIDATE)


def _review(ledger: Ledger, review_id: str, verdict: str, findings: list[dict[str, Any]]) -> None:
    ledger.runs.review.start_review(
        RUN_ID,
        key=f"{review_id}:start",
        review_id=review_id,
        candidate_id=CANDIDATE["candidate_id"],
        evidence_sha256=CANDIDATE["evidence_sha256"],
    )
    ledger.runs.review.complete_review(
        RUN_ID, key=f"{review_id}:complete", review_id=review_id, verdict=verdict, findings=findings
    )


def review(ledger: Ledger, lease: float) -> dict[str, Any]:
    _begin(ledger, lease)
    _review(ledger, "review-1", "pass", [])
    outcome = ledger.runs.review.terminate(
        RUN_ID, key="terminal", status="verified", reason="passed"
    )
    return {"status": outcome.run.status}


def repair(ledger: Ledger, lease: float) -> dict[str, Any]:
    _begin(ledger, lease)
    _review(ledger, "review-1", "issues", [{"finding_id": "f-1", "severity": "major"}])
    runs = ledger.runs.review
    runs.start_repair(RUN_ID, key="repair-1:start", repair_id="repair-1", finding_ids=["f-1"])
    runs.bind_actions(RUN_ID, key="repair-1:bind", repair_id="repair-1")
    runs.propose_action(
        RUN_ID,
        key="write-1:proposed",
        action_id="write-1",
        kind="write_file",
        arguments={"path": "report.csv", "content": "column\nrepaired\n"},
        side_effect_class="workspace_write",
        resource_keys=["workspace:report.csv"],
    )
    runs.resolve_action(RUN_ID, key="write-1:resolved", action_id="write-1", status="succeeded")
    repaired = {**CANDIDATE, "candidate_id": "candidate-2", "version_ids": ["v2"]}
    runs.complete_repair(RUN_ID, key="repair-1:done", repair_id="repair-1", candidate=repaired)
    outcome = runs.terminate(RUN_ID, key="terminal", status="review_unavailable", reason="budget")
    return {"status": outcome.run.status}


def deliver(ledger: Ledger, lease: float) -> dict[str, Any]:
    _begin(ledger, lease)
    manifest = artifact_manifest([("report", "v1", "report.csv", ARTIFACT)])
    delivery = ledger.runs.deliveries.commit(
        "turn-1:delivery",
        scope=SCOPE,
        turn="turn-1",
        run_id=RUN_ID,
        content=CONTENT,
        manifest=manifest,
        owner=f"lab-worker:{os.getpid()}",
        lease_seconds=lease,
    )
    ledger.runs.deliveries.publish(delivery.delivery_id)
    outcome = ledger.runs.review.terminate(
        RUN_ID, key="terminal", status="review_unavailable", reason="not_reviewed"
    )
    return {"status": outcome.run.status, "delivery_id": delivery.delivery_id}


def reconcile(db: str, owner: str) -> dict[str, Any]:
    with Ledger(db, create=False, reconcile_runs_as=owner) as ledger:
        return {"reports": [r.as_dict() for r in ledger.runs.last_reconciliation]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m oncewire.lab.children.runs", description=__doc__
    )
    parser.add_argument("role", choices=["review", "repair", "deliver", "reconcile"])
    parser.add_argument("--db", required=True, help="a SQLite file or a postgresql:// URL")
    parser.add_argument("--lease-seconds", type=float, default=1.0)
    parser.add_argument("--owner", default=f"lab-reconciler:{os.getpid()}")
    args = parser.parse_args(argv)
    crash.check_armed()
    if args.role == "reconcile":
        result = reconcile(args.db, args.owner)
    else:
        with Ledger(args.db) as ledger:
            role = {"review": review, "repair": repair, "deliver": deliver}[args.role]
            result = role(ledger, args.lease_seconds)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
