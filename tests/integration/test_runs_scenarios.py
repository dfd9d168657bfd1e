"""The run ledger's required scenarios, on a real SQLite file and a real PostgreSQL schema.

Each test is one scenario the run ledger must keep: tampered histories fail closed, branches and
reverts never let a hidden tail authorise anything, a revert barrier holds new work, boot
reconciliation closes what a dead owner left without inventing a verdict, and completion
deliveries are settled once without changing their bytes. Invariants are read from the tables
directly, not only through the API.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.core.errors import (
    BranchBusy,
    HistoryHidden,
    HistoryTampered,
    RevertBarrierHeld,
    RunError,
)
from oncewire.runs import artifact_manifest
from oncewire.testing import ManualClock
from tests.support.runs_db import Row, RunsDatabase

SCOPE = "session-1"
LEASE = 30.0
EVIDENCE = {"candidate_id": "candidate-1", "complete": True}
EVIDENCE_SHA = hashlib.sha256(
    json.dumps(EVIDENCE, sort_keys=True, separators=(",", ":")).encode()
).hexdigest()
CANDIDATE: dict[str, Any] = {
    "candidate_id": "candidate-1",
    "snapshot_sha256": "a" * 64,
    "evidence_sha256": EVIDENCE_SHA,
    "artifact_set_sha256": "b" * 64,
    "artifact_ids": ["artifact-1"],
    "version_ids": ["version-1"],
}
PARAMS = {"mode": "auto_fix", "budgets": {"max_review_attempts": 2, "max_repair_rounds": 2}}
MINOR = {
    "finding_id": "finding-1",
    "severity": "minor",
    "claim": "Clarify one supporting note.",
    "evidence_refs": ["cell-1"],
}


# -- fixtures and helpers ------------------------------------------------------------------------
@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def db(store_url: str) -> Iterator[RunsDatabase]:
    opened = RunsDatabase(store_url)
    yield opened


@pytest.fixture
def ledger(db: RunsDatabase, clock: ManualClock) -> Iterator[Ledger]:
    opened = Ledger(db.url, clock=clock)
    try:
        yield opened
    finally:
        opened.close()


def rehash(run_id: str, seq: int, type_: str, prev_hash: str, payload_json: str) -> str:
    """The event hash recomputed without a key, as a tamperer with the code would."""
    material = f"{run_id}\x1f{seq}\x1f{type_}\x1f{prev_hash}\x1f{payload_json}".encode()
    return hashlib.sha256(material).hexdigest()


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def start(
    ledger: Ledger,
    run_id: str = "run-1",
    *,
    branch: str | None = None,
    turn: str = "turn-1",
    owner: str = "daemon-A",
    scope: str = SCOPE,
) -> Any:
    return ledger.runs.start(
        run_id,
        key=f"{turn}:start",
        scope=scope,
        branch=branch,
        turn=turn,
        owner=owner,
        lease_seconds=LEASE,
        params=PARAMS,
    )


def candidate(ledger: Ledger, run_id: str = "run-1", key: str = "candidate:1") -> Any:
    return ledger.runs.review.record_candidate(run_id, key=key, **CANDIDATE)


def start_review(
    ledger: Ledger, run_id: str = "run-1", review_id: str = "review-1", attempt: int = 1
) -> Any:
    return ledger.runs.review.start_review(
        run_id,
        key=f"{review_id}:start",
        review_id=review_id,
        candidate_id="candidate-1",
        evidence_sha256=EVIDENCE_SHA,
        attempt=attempt,
        reviewer={"profile_id": "reviewer", "model": "reviewer-model-v1"},
    )


def complete_review(
    ledger: Ledger,
    run_id: str = "run-1",
    review_id: str = "review-1",
    verdict: str = "pass",
    findings: list[dict[str, Any]] | None = None,
) -> Any:
    return ledger.runs.review.complete_review(
        run_id,
        key=f"{review_id}:complete",
        review_id=review_id,
        verdict=verdict,
        assessment={"summary": f"Independent review: {verdict}."},
        findings=findings or [],
        usage={"input_tokens": 10, "output_tokens": 5},
    )


def terminate_verified(ledger: Ledger, run_id: str = "run-1") -> Any:
    return ledger.runs.review.terminate(
        run_id, key="terminal:1", status="verified", reason="review_passed"
    )


def build_verified(ledger: Ledger, findings: list[dict[str, Any]] | None = None) -> None:
    start(ledger)
    candidate(ledger)
    start_review(ledger)
    complete_review(ledger, findings=findings)
    terminate_verified(ledger)


def assert_safety_boundary(ledger: Ledger, claimed: str = "verified") -> None:
    run = ledger.runs.project(SCOPE).run
    assert run is not None
    assert run.status == "failed"
    assert run.terminal_reason == "safety_boundary"
    assert run.claimed_status == claimed
    assert not ledger.runs.verify("run-1")[0].ok


def crash_mid_review(ledger: Ledger, clock: ManualClock) -> None:
    """What a SIGKILL during the review leaves: the review started, never completed, and the
    owner's lease runs out."""
    start(ledger, owner="daemon-DEAD")
    candidate(ledger)
    start_review(ledger)
    clock.advance(LEASE * 2)


def next_turn(ledger: Ledger, owner: str = "daemon-NEW") -> str:
    start(ledger, "run-2", turn="turn-2", owner=owner)
    run = ledger.runs.project(SCOPE).run
    assert run is not None and run.run_id == "run-2"
    return run.status


def event_types(ledger: Ledger, run_id: str = "run-1") -> list[str]:
    return [event.type for event in ledger.runs.events(run_id)]


# -- tampered histories --------------------------------------------------------------------------
@pytest.mark.parametrize("replay", ["start", "candidate", "terminal"])
def test_exact_replays_fail_closed_after_the_review_proof_is_edited(
    ledger: Ledger, db: RunsDatabase, replay: str
) -> None:
    build_verified(ledger)
    assert terminate_verified(ledger).replayed  # before the edit, a replay is a replay
    db.tamper(
        (
            "UPDATE oncewire_run_phases SET result = '{}' WHERE phase_id = 'review-1'",
            (),
        ),
    )
    with pytest.raises(HistoryTampered):
        if replay == "start":
            start(ledger)
        elif replay == "candidate":
            candidate(ledger)
        else:
            terminate_verified(ledger)
    assert_safety_boundary(ledger)
    # The evidence is kept, not repaired.
    assert db.query("SELECT result FROM oncewire_run_phases")[0]["result"] == "{}"


def test_a_finding_rebound_to_another_candidate_fails_verification(
    ledger: Ledger, db: RunsDatabase
) -> None:
    build_verified(ledger, findings=[MINOR])
    db.tamper(
        (
            "UPDATE oncewire_run_findings SET candidate_id = 'candidate-other' "
            "WHERE finding_id = 'finding-1'",
            (),
        ),
    )
    assert_safety_boundary(ledger)


@pytest.mark.parametrize("ordinal", ["seq", "id"])
def test_swapping_the_review_events_fails_verification(
    ledger: Ledger, db: RunsDatabase, ordinal: str
) -> None:
    build_verified(ledger)
    rows = {
        row["type"]: row[ordinal]
        for row in db.query(f"SELECT type, {ordinal} FROM oncewire_run_events")
    }
    first, second = rows["review_started"], rows["review_completed"]
    table = "oncewire_run_events"
    db.tamper(
        (f"UPDATE {table} SET {ordinal} = 9999 WHERE type = 'review_started'", ()),
        (f"UPDATE {table} SET {ordinal} = ? WHERE type = 'review_completed'", (first,)),
        (f"UPDATE {table} SET {ordinal} = ? WHERE type = 'review_started'", (second,)),
    )
    assert_safety_boundary(ledger)


@pytest.mark.parametrize("edit", ["rehashed_downgrade", "event_type"])
def test_an_edited_terminal_cannot_hide_the_integrity_failure(
    ledger: Ledger, db: RunsDatabase, edit: str
) -> None:
    build_verified(ledger)
    row = db.query(
        "SELECT id, run_id, seq, type, prev_hash, payload FROM oncewire_run_events "
        "WHERE type = 'run_terminated'",
    )[0]
    if edit == "rehashed_downgrade":
        payload = json.loads(row["payload"])
        payload["request"]["status"] = "review_unavailable"
        payload["request"]["reason"] = "timeout"
        text = canonical(payload)
        new_hash = rehash(row["run_id"], row["seq"], row["type"], row["prev_hash"], text)
        db.tamper(
            (
                "UPDATE oncewire_run_events SET payload = ?, hash = ? WHERE id = ?",
                (text, new_hash, row["id"]),
            ),
        )
    else:
        db.tamper(
            ("UPDATE oncewire_run_events SET type = 'repair_completed' WHERE id = ?", (row["id"],)),
        )
    assert_safety_boundary(ledger)


def test_a_historical_prefix_and_its_fork_do_not_inherit_a_later_terminal(
    ledger: Ledger,
) -> None:
    start(ledger)
    candidate(ledger)
    checkpoint = ledger.runs.checkpoint("checkpoint-candidate", scope=SCOPE, reason="candidate")
    start_review(ledger)
    complete_review(ledger)
    terminate_verified(ledger)

    historical = ledger.runs.project(SCOPE, upto=checkpoint.cursor).run
    ledger.runs.fork(scope=SCOPE, checkpoint_id=checkpoint.checkpoint_id, branch="branch-b")
    forked = ledger.runs.project(SCOPE, "branch-b").run
    assert historical is not None and forked is not None
    assert historical.status == "candidate" and historical.claimed_status is None
    assert forked.status == "candidate" and forked.claimed_status is None
    assert ledger.runs.project(SCOPE).run.status == "verified"  # type: ignore[union-attr]


def test_a_fork_of_an_active_run_can_start_an_independent_child_run(ledger: Ledger) -> None:
    start(ledger, "parent-run")
    checkpoint = ledger.runs.checkpoint("checkpoint-parent", scope=SCOPE, reason="active_parent")
    ledger.runs.fork(scope=SCOPE, checkpoint_id=checkpoint.checkpoint_id, branch="branch-child")
    start(ledger, "child-run", branch="branch-child", turn="turn-child")
    assert ledger.runs.project(SCOPE).run.run_id == "parent-run"  # type: ignore[union-attr]
    child = ledger.runs.project(SCOPE, "branch-child").run
    assert child is not None and child.run_id == "child-run" and child.status == "running"


def test_reverting_before_a_terminal_lets_a_new_continuation_start(
    ledger: Ledger, db: RunsDatabase
) -> None:
    start(ledger)
    candidate(ledger)
    checkpoint = ledger.runs.checkpoint("before-terminal", scope=SCOPE, reason="candidate")
    start_review(ledger)
    complete_review(ledger)
    terminate_verified(ledger)
    ledger.runs.checkpoint("undo", scope=SCOPE, reason="undo_capture")
    ledger.runs.revert(scope=SCOPE, checkpoint_id=checkpoint.checkpoint_id)
    assert ledger.runs.project(SCOPE).run.status == "candidate"  # type: ignore[union-attr]

    start(ledger, "continuation-run", turn="turn-2")
    assert ledger.runs.project(SCOPE).run.run_id == "continuation-run"  # type: ignore[union-attr]
    old = db.query("SELECT status, abandoned_at FROM oncewire_runs WHERE run_id = 'run-1'")[0]
    assert old["status"] == "verified"  # a real terminal stays what it was
    assert old["abandoned_at"] is None


def test_a_revert_hiding_a_started_review_abandons_the_old_active_run(
    ledger: Ledger, db: RunsDatabase
) -> None:
    start(ledger)
    candidate(ledger)
    checkpoint = ledger.runs.checkpoint("before-review", scope=SCOPE, reason="candidate")
    start_review(ledger)
    ledger.runs.revert(scope=SCOPE, checkpoint_id=checkpoint.checkpoint_id)
    start(ledger, "continuation-run", turn="turn-2")

    old = db.query("SELECT status, abandoned_at FROM oncewire_runs WHERE run_id = 'run-1'")[0]
    assert old["status"] == "reviewing"  # what it was doing, not an invented terminal
    assert old["abandoned_at"] is not None
    assert ledger.runs.project(SCOPE).run.run_id == "continuation-run"  # type: ignore[union-attr]
    with pytest.raises(HistoryHidden):
        complete_review(ledger)
    with pytest.raises(HistoryHidden):
        start(ledger)
    # The release is part of the verified history (in the hidden tail), not only a row flag.
    assert event_types(ledger)[-1] == "run_abandoned"
    assert ledger.runs.verify("run-1")[0].ok


def test_a_reverted_candidate_and_review_cannot_authorise_a_transition(ledger: Ledger) -> None:
    start(ledger)
    checkpoint = ledger.runs.checkpoint("start-only", scope=SCOPE, reason="start_only")
    candidate(ledger)
    start_review(ledger)
    complete_review(ledger)
    ledger.runs.revert(scope=SCOPE, checkpoint_id=checkpoint.checkpoint_id)
    assert ledger.runs.project(SCOPE).run.status == "running"  # type: ignore[union-attr]

    with pytest.raises(HistoryHidden):
        start_review(ledger, review_id="review-hidden", attempt=2)
    with pytest.raises(HistoryHidden):
        ledger.runs.review.terminate(
            "run-1", key="terminal:hidden", status="verified", reason="hidden_review_passed"
        )
    with pytest.raises(HistoryHidden):
        start(ledger)


def test_a_newer_failed_review_cannot_be_rehashed_away_to_resurrect_an_old_pass(
    ledger: Ledger, db: RunsDatabase
) -> None:
    start(ledger)
    candidate(ledger)
    start_review(ledger)
    complete_review(ledger)
    start_review(ledger, review_id="review-2", attempt=2)
    complete_review(ledger, review_id="review-2", verdict="failed")
    row = db.query(
        "SELECT id, run_id, seq, type, prev_hash, payload FROM oncewire_run_events "
        "WHERE idempotency_key = 'review-2:complete'",
    )[0]
    payload = json.loads(row["payload"])
    payload["request"]["review_id"] = "review-other"
    payload["request"]["verdict"] = "pass"
    text = canonical(payload)
    db.tamper(
        (
            "UPDATE oncewire_run_events SET payload = ?, hash = ? WHERE id = ?",
            (
                text,
                rehash(row["run_id"], row["seq"], row["type"], row["prev_hash"], text),
                row["id"],
            ),
        ),
    )
    with pytest.raises(HistoryTampered):
        ledger.runs.review.terminate(
            "run-1", key="terminal:no-fallback", status="verified", reason="must_not_fallback"
        )
    assert db.query("SELECT COUNT(*) FROM oncewire_run_events WHERE terminal")[0][0] == 0


def test_an_edited_current_candidate_fails_both_the_read_and_the_replay(
    ledger: Ledger, db: RunsDatabase
) -> None:
    start(ledger)
    candidate(ledger)
    row = db.query(
        "SELECT id, run_id, seq, type, prev_hash, payload FROM oncewire_run_events "
        "WHERE type = 'candidate_recorded'",
    )[0]
    payload = json.loads(row["payload"])
    payload["request"]["candidate"]["candidate_id"] = "candidate-tampered"
    text = canonical(payload)
    db.tamper(
        (
            "UPDATE oncewire_run_events SET payload = ?, hash = ? WHERE id = ?",
            (
                text,
                rehash(row["run_id"], row["seq"], row["type"], row["prev_hash"], text),
                row["id"],
            ),
        ),
    )
    assert_safety_boundary(ledger, claimed="candidate")
    with pytest.raises(HistoryTampered):
        candidate(ledger)


def test_an_unresolved_revert_barrier_denies_new_work_but_keeps_late_evidence(
    ledger: Ledger, db: RunsDatabase
) -> None:
    start(ledger)
    ledger.runs.review.propose_action(
        "run-1",
        key="action:admitted",
        action_id="admitted-before-revert",
        kind="shell",
        arguments={"cmd": "make"},
        side_effect_class="workspace_write",
    )
    ledger.runs.hold(scope=SCOPE, operation_id="revert-fault", state="recovery_required")

    with pytest.raises(RevertBarrierHeld):
        candidate(ledger)
    with pytest.raises(RevertBarrierHeld):
        start(ledger, "run-2", turn="turn-2", branch="other-branch")
    with pytest.raises(RevertBarrierHeld):
        ledger.runs.review.propose_action(
            "run-1",
            key="action:blocked",
            action_id="blocked-proposal",
            kind="shell",
            arguments={},
            side_effect_class="external",
        )
    late = ledger.runs.review.resolve_action(
        "run-1",
        key="action:admitted:failed",
        action_id="admitted-before-revert",
        status="failed",
        result={"error": "late terminal evidence"},
    )
    assert late.event.type == "action_resolved"
    stored = db.query("SELECT action_id, status FROM oncewire_run_actions")
    assert [(r["action_id"], r["status"]) for r in stored] == [("admitted-before-revert", "failed")]


# -- boot reconciliation -------------------------------------------------------------------------
def test_a_crash_mid_review_wedges_the_branch_until_reconciled(
    ledger: Ledger, clock: ManualClock
) -> None:
    crash_mid_review(ledger, clock)
    assert ledger.runs.project(SCOPE).run.status == "reviewing"  # type: ignore[union-attr]
    with pytest.raises(BranchBusy) as refused:
        next_turn(ledger)
    assert refused.value.fields["run_id"] == "run-1"
    assert refused.value.fields["requires_reconciliation"] is True


def test_reconciliation_moves_a_crashed_run_to_review_unavailable(
    ledger: Ledger, clock: ManualClock
) -> None:
    crash_mid_review(ledger, clock)
    now = clock.now()
    reports = ledger.runs.reconcile(owner="daemon-NEW")
    assert [(r.run_id, r.outcome, r.status, r.reason) for r in reports] == [
        ("run-1", "terminal", "review_unavailable", "lease_expired")
    ]
    run = ledger.runs.project(SCOPE).run
    assert run is not None and run.claimed_status is None  # the closed history verifies
    assert (run.status, run.terminal_reason, run.finished_at) == (
        "review_unavailable",
        "lease_expired",
        now,
    )
    assert next_turn(ledger) == "running"


def test_reconciliation_closes_the_stranded_review_without_inventing_a_verdict(
    ledger: Ledger, clock: ManualClock, db: RunsDatabase
) -> None:
    crash_mid_review(ledger, clock)
    now = clock.now()
    ledger.runs.reconcile(owner="daemon-NEW")
    review = db.query(
        "SELECT status, verdict, closed_at, result FROM oncewire_run_phases "
        "WHERE phase_id = 'review-1'",
    )[0]
    assert (review["status"], review["verdict"], review["closed_at"]) == (
        "unavailable",
        "review_unavailable",
        now,
    )
    assert db.query("SELECT COUNT(*) FROM oncewire_run_findings")[0][0] == 0
    phases = ledger.runs.phases("run-1")
    assert [(p["status"], p["verdict"]) for p in phases] == [("unavailable", "review_unavailable")]
    assert "exited before" in phases[0]["result"]["assessment"]["summary"]


def test_reconciliation_preserves_every_committed_fact(
    ledger: Ledger, clock: ManualClock, db: RunsDatabase
) -> None:
    crash_mid_review(ledger, clock)
    before = db.query("SELECT id, seq, type, payload, hash FROM oncewire_run_events")
    candidate_before = ledger.runs.get("run-1").candidate
    assert event_types(ledger) == ["run_started", "candidate_recorded", "review_started"]
    ledger.runs.reconcile(owner="daemon-NEW")
    after = db.query("SELECT id, seq, type, payload, hash FROM oncewire_run_events")
    assert [tuple(r) for r in after[: len(before)]] == [tuple(r) for r in before]
    assert event_types(ledger) == [
        "run_started",
        "candidate_recorded",
        "review_started",
        "review_completed",
        "run_terminated",
    ]
    assert ledger.runs.get("run-1").candidate == candidate_before == CANDIDATE


def test_reconciliation_never_touches_a_live_run(ledger: Ledger, clock: ManualClock) -> None:
    start(ledger, owner="daemon-LIVE")
    candidate(ledger)
    start_review(ledger)
    clock.advance(LEASE / 2)  # the owner is alive: its lease has not run out
    assert ledger.runs.reconcile(owner="daemon-LIVE") == []
    assert ledger.runs.reconcile(owner="daemon-OTHER") == []
    assert ledger.runs.project(SCOPE).run.status == "reviewing"  # type: ignore[union-attr]
    complete_review(ledger)  # the in-flight review still commits its real verdict
    assert ledger.runs.project(SCOPE).run.status == "candidate"  # type: ignore[union-attr]


def test_reconciliation_is_idempotent_across_repeated_restarts(
    ledger: Ledger, clock: ManualClock, db: RunsDatabase
) -> None:
    crash_mid_review(ledger, clock)
    finished = clock.now()
    assert len(ledger.runs.reconcile(owner="daemon-NEW")) == 1
    for _ in range(2):
        clock.advance(100)
        assert ledger.runs.reconcile(owner="daemon-NEWER") == []
    assert db.query("SELECT COUNT(*) FROM oncewire_run_events WHERE terminal")[0][0] == 1
    assert ledger.runs.project(SCOPE).run.finished_at == finished  # type: ignore[union-attr]


def test_reconciliation_leaves_an_already_terminal_run_alone(
    ledger: Ledger, clock: ManualClock
) -> None:
    build_verified(ledger)
    clock.advance(LEASE * 2)
    assert ledger.runs.reconcile(owner="daemon-NEW") == []
    run = ledger.runs.project(SCOPE).run
    assert run is not None and (run.status, run.terminal_reason) == ("verified", "review_passed")


def test_reconciliation_defers_to_an_unresolved_revert_barrier(
    ledger: Ledger, clock: ManualClock, db: RunsDatabase
) -> None:
    crash_mid_review(ledger, clock)
    ledger.runs.hold(scope=SCOPE, operation_id="op-1", state="reverting")
    reports = ledger.runs.reconcile(owner="daemon-NEW")
    assert [(r.run_id, r.outcome, r.reason) for r in reports] == [
        ("run-1", "deferred", "revert_barrier")
    ]
    row = db.query(
        "SELECT status, finished_at, abandoned_at FROM oncewire_runs WHERE run_id = 'run-1'"
    )[0]
    assert (row["status"], row["finished_at"], row["abandoned_at"]) == ("reviewing", None, None)
    assert db.query("SELECT outcome FROM oncewire_run_reports")[0]["outcome"] == "deferred"


def test_opening_the_ledger_can_reconcile_at_boot(
    ledger: Ledger, clock: ManualClock, db: RunsDatabase
) -> None:
    crash_mid_review(ledger, clock)
    with Ledger(db.url, clock=clock, reconcile_runs_as="daemon-NEW") as booted:
        assert [r.run_id for r in booted.runs.last_reconciliation] == ["run-1"]
        assert booted.runs.project(SCOPE).run.status == "review_unavailable"  # type: ignore[union-attr]
        assert next_turn(booted) == "running"


# -- completion deliveries -----------------------------------------------------------------------
def commit_candidate_delivery(
    ledger: Ledger,
    *,
    turn: str,
    scope: str = SCOPE,
    branch: str | None = None,
    owner: str = "daemon-before-crash",
) -> Any:
    data = b"orphaned-candidate-artifact"
    manifest = artifact_manifest([("artifact-1", "version-1", "candidate.csv", data)])
    return ledger.runs.deliveries.commit(
        f"{scope}/{branch}/{turn}:candidate-delivery",
        scope=scope,
        branch=branch,
        turn=turn,
        content="Candidate result: artifact-1@version-1",
        manifest=manifest,
        owner=owner,
        lease_seconds=LEASE,
    )


def delivery_row(db: RunsDatabase, delivery_id: str) -> Row:
    return db.query("SELECT * FROM oncewire_run_deliveries WHERE delivery_id = ?", (delivery_id,))[
        0
    ]


def test_reopening_settles_a_candidate_delivery_once_without_changing_its_bytes(
    db: RunsDatabase, clock: ManualClock
) -> None:
    with Ledger(db.url, clock=clock) as before_crash:
        committed = commit_candidate_delivery(before_crash, turn="turn-before-run")
    original = delivery_row(db, committed.delivery_id)
    clock.advance(LEASE * 2)
    recovered_at = clock.now()

    with Ledger(db.url, clock=clock, reconcile_runs_as="daemon-after-crash") as reopened:
        reports = reopened.runs.last_reconciliation
        assert [(r.subject, r.subject_id, r.outcome, r.status, r.reason) for r in reports] == [
            (
                "delivery",
                committed.delivery_id,
                "settled",
                "review_unavailable",
                "restart_before_run",
            )
        ]
        settled = reopened.runs.deliveries.get(committed.delivery_id)
    assert db.query("SELECT COUNT(*) FROM oncewire_runs")[0][0] == 0  # no invented run
    assert settled.status == "published" and settled.published_at == recovered_at
    assert settled.review_status == "review_unavailable"
    assert settled.recovery == {
        "schema_version": 1,
        "reason": "restart_before_run",
        "reconciled_at": recovered_at,
    }
    first = delivery_row(db, committed.delivery_id)
    for column in ("content", "content_sha256", "manifest", "manifest_sha256", "created_at"):
        assert first[column] == original[column]

    clock.advance(10)
    with Ledger(db.url, clock=clock, reconcile_runs_as="daemon-after-second") as again:
        assert again.runs.last_reconciliation == []
    assert tuple(delivery_row(db, committed.delivery_id)) == tuple(first)


def test_reopening_settles_a_delivery_owned_by_a_prestarted_run_without_a_second_run(
    db: RunsDatabase, clock: ManualClock
) -> None:
    with Ledger(db.url, clock=clock) as before_crash:
        start(before_crash, "run-pre", turn="turn-pre", owner="daemon-before-crash")
        committed = commit_candidate_delivery(before_crash, turn="turn-pre")
    clock.advance(LEASE * 2)
    recovered_at = clock.now()
    with Ledger(db.url, clock=clock, reconcile_runs_as="daemon-after-crash") as reopened:
        reports = reopened.runs.last_reconciliation
        assert [(r.subject, r.run_id, r.status, r.reason) for r in reports] == [
            ("run", "run-pre", "review_unavailable", "lease_expired"),
            ("delivery", "run-pre", "review_unavailable", "restart_before_promotion"),
        ]
        run = reopened.runs.project(SCOPE).run
        assert run is not None and (run.run_id, run.status) == ("run-pre", "review_unavailable")
        settled = reopened.runs.deliveries.get(committed.delivery_id)
    assert db.query("SELECT COUNT(*) FROM oncewire_runs")[0][0] == 1
    assert settled.status == "published" and settled.published_at == recovered_at
    assert settled.content == committed.content
    assert settled.recovery == {
        "schema_version": 1,
        "reason": "restart_before_promotion",
        "reconciled_at": recovered_at,
        "run_id": "run-pre",
    }


def test_delivery_recovery_matches_a_run_in_the_exact_scope_and_branch(
    ledger: Ledger, clock: ManualClock, db: RunsDatabase
) -> None:
    protected = commit_candidate_delivery(ledger, turn="turn-shared")
    sibling = commit_candidate_delivery(ledger, turn="turn-shared", branch="branch-child")
    other_scope = commit_candidate_delivery(ledger, turn="turn-shared", scope="session-2")
    clock.advance(LEASE * 2)  # the deliveries' own leases ran out ...
    start(ledger, "run-exact", turn="turn-shared", owner="daemon-live")  # ... one has a live run
    reports = ledger.runs.reconcile(owner="daemon-live")
    assert {r.subject_id for r in reports} == {sibling.delivery_id, other_scope.delivery_id}

    def review_status(delivery_id: str) -> str:
        return str(delivery_row(db, delivery_id)["review_status"])

    assert review_status(protected.delivery_id) == "candidate"
    assert review_status(sibling.delivery_id) == "review_unavailable"
    assert review_status(other_scope.delivery_id) == "review_unavailable"


def test_a_failed_delivery_settlement_rolls_back_and_succeeds_later(
    ledger: Ledger, clock: ManualClock, db: RunsDatabase
) -> None:
    committed = commit_candidate_delivery(ledger, turn="turn-atomic")
    clock.advance(LEASE * 2)
    if db.dialect == "sqlite":
        db.execute(
            (
                "CREATE TRIGGER fail_settlement BEFORE UPDATE OF status ON "
                "oncewire_run_deliveries BEGIN SELECT RAISE(ABORT, 'injected settlement failure'); "
                "END",
                (),
            )
        )
    else:
        db.execute(
            (
                "CREATE FUNCTION fail_settlement() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'injected settlement failure'; END; $$",
                (),
            ),
            (
                "CREATE TRIGGER fail_settlement BEFORE UPDATE OF status ON "
                "oncewire_run_deliveries FOR EACH ROW EXECUTE FUNCTION fail_settlement()",
                (),
            ),
        )
    failed = ledger.runs.reconcile(owner="daemon-NEW")
    assert [(r.subject_id, r.outcome) for r in failed] == [(committed.delivery_id, "failed")]
    assert failed[0].error and "injected settlement failure" in failed[0].error
    still = delivery_row(db, committed.delivery_id)
    assert (still["status"], still["review_status"], still["recovery"]) == (
        "committed",
        "candidate",
        None,
    )
    stored = db.query("SELECT outcome, error FROM oncewire_run_reports")
    assert stored[0]["outcome"] == "failed" and "injected" in stored[0]["error"]

    on = " ON oncewire_run_deliveries" if db.dialect == "postgresql" else ""
    db.execute((f"DROP TRIGGER fail_settlement{on}", ()))
    recovered = ledger.runs.reconcile(owner="daemon-NEW")
    assert [(r.outcome, r.status) for r in recovered] == [("settled", "review_unavailable")]
    settled = delivery_row(db, committed.delivery_id)
    assert (settled["status"], settled["review_status"]) == ("published", "review_unavailable")


# -- repairs and sweeps --------------------------------------------------------------------------
def crash_mid_repair(ledger: Ledger, clock: ManualClock, *, bind_ledger: bool) -> None:
    """What a SIGKILL during a repair leaves; with the ledger bound, a proposed write that was
    never resolved."""
    start(ledger, owner="daemon-DEAD")
    candidate(ledger)
    start_review(ledger)
    complete_review(
        ledger,
        verdict="issues",
        findings=[{"finding_id": "finding-1", "severity": "major", "claim": "Outruns evidence."}],
    )
    checkpoint = ledger.runs.checkpoint("pre-repair", scope=SCOPE, reason="pre_repair")
    ledger.runs.review.start_repair(
        "run-1",
        key="repair-1:start",
        repair_id="repair-1",
        finding_ids=["finding-1"],
        checkpoint_id=checkpoint.checkpoint_id,
    )
    if bind_ledger:
        ledger.runs.review.bind_actions("run-1", key="repair-1:bind", repair_id="repair-1")
        ledger.runs.review.propose_action(
            "run-1",
            key="repair-write:proposed",
            action_id="repair-write",
            kind="write_file",
            arguments={"path": "result.txt", "content": "repaired\n"},
            side_effect_class="workspace_write",
            resource_keys=["workspace:result.txt"],
        )
    clock.advance(LEASE * 2)


def test_reconciliation_seals_an_interrupted_repair_as_outcome_unknown(
    ledger: Ledger, clock: ManualClock, db: RunsDatabase
) -> None:
    crash_mid_repair(ledger, clock, bind_ledger=True)
    assert ledger.runs.project(SCOPE).run.status == "repairing"  # type: ignore[union-attr]
    reports = ledger.runs.reconcile(owner="daemon-NEW")
    assert [(r.run_id, r.status, r.reason) for r in reports] == [
        ("run-1", "outcome_unknown", "lease_expired")
    ]
    repair = db.query("SELECT status, result FROM oncewire_run_phases WHERE phase_id = 'repair-1'")[
        0
    ]
    assert repair["status"] == "outcome_unknown"
    assert json.loads(repair["result"])["after_version_ids"] == []
    action = db.query("SELECT status FROM oncewire_run_actions")[0]
    assert action["status"] == "proposed"  # unknown stays unknown: no invented resolution
    assert next_turn(ledger) == "running"


def test_reconciliation_releases_a_repair_that_kept_no_action_ledger(
    ledger: Ledger, clock: ManualClock, db: RunsDatabase
) -> None:
    crash_mid_repair(ledger, clock, bind_ledger=False)
    now = clock.now()
    reports = ledger.runs.reconcile(owner="daemon-NEW")
    assert [(r.run_id, r.outcome, r.reason) for r in reports] == [
        ("run-1", "abandoned", "repair_untracked")
    ]
    row = db.query(
        "SELECT status, finished_at, abandoned_at, terminal_reason FROM oncewire_runs "
        "WHERE run_id = 'run-1'",
    )[0]
    assert (row["status"], row["finished_at"], row["terminal_reason"]) == ("repairing", None, None)
    assert row["abandoned_at"] == now
    assert db.query("SELECT COUNT(*) FROM oncewire_run_events WHERE terminal")[0][0] == 0
    assert event_types(ledger)[-1] == "run_abandoned" and ledger.runs.verify("run-1")[0].ok
    assert next_turn(ledger) == "running"


def test_one_sweep_reconciles_every_dead_scope_and_spares_the_live_one(
    ledger: Ledger, clock: ManualClock
) -> None:
    for index in range(2):
        start(
            ledger,
            f"run-{index}",
            turn=f"turn-{index}",
            owner=f"daemon-DEAD-{index}",
            scope=f"session-{index}",
        )
    clock.advance(LEASE * 2)
    start(ledger, "run-2", turn="turn-2", owner="daemon-LIVE", scope="session-2")
    reports = ledger.runs.reconcile(owner="daemon-LIVE")
    assert [r.run_id for r in reports] == ["run-0", "run-1"]
    assert {r.status for r in reports} == {"review_unavailable"}
    assert ledger.runs.project("session-2").run.status == "running"  # type: ignore[union-attr]


def test_one_unreconcilable_run_does_not_deny_the_others_their_recovery(
    ledger: Ledger, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, db: RunsDatabase
) -> None:
    from oncewire.runs import recovery

    for scope in ("root-1", "root-2"):
        start(ledger, f"run-{scope}", turn="t1", owner="daemon-OLD", scope=scope)
    clock.advance(LEASE * 2)
    original = recovery.reconcile_run

    def poisoned(runs: Any, run_id: str, **kwargs: Any) -> Any:
        if run_id == "run-root-1":  # fails before the per-run transaction could catch it
            raise sqlite3.OperationalError("database is locked")
        return original(runs, run_id, **kwargs)

    monkeypatch.setattr(recovery, "reconcile_run", poisoned)
    reports = {r.run_id: r for r in ledger.runs.reconcile(owner="daemon-NEW")}
    assert reports["run-root-1"].outcome == "failed"
    assert "database is locked" in (reports["run-root-1"].error or "")
    assert reports["run-root-2"].status == "review_unavailable"
    stored = {r["subject_id"]: r["outcome"] for r in db.query("SELECT * FROM oncewire_run_reports")}
    assert stored == {"run-root-1": "failed", "run-root-2": "terminal"}

    monkeypatch.setattr(recovery, "reconcile_run", original)
    assert [r.run_id for r in ledger.runs.reconcile(owner="daemon-NEW")] == ["run-root-1"]
    with pytest.raises(RunError):
        ledger.runs.review.terminate("run-root-1", key="late", status="verified", reason="late")
