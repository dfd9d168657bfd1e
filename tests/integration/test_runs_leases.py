"""Idempotent commands, leases with fences, and actions linked to the outbox (on both
backends)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from oncewire import Dispatcher, Done, Ledger
from oncewire.core.errors import PayloadConflict, RunConflict, StaleFence, TransitionRefused
from oncewire.core.ids import process_start_ticks, this_process_owner
from oncewire.testing import ManualClock
from tests.support.runs_db import RunsDatabase

CANDIDATE = {
    "candidate_id": "c-1",
    "snapshot_sha256": "a" * 64,
    "evidence_sha256": "e" * 64,
    "artifact_set_sha256": "b" * 64,
}


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


def count(db: RunsDatabase, table: str) -> int:
    return int(db.query(f"SELECT COUNT(*) FROM {table}")[0][0])


def test_a_replay_returns_the_original_outcome_and_another_request_conflicts(
    ledger: Ledger, db: RunsDatabase
) -> None:
    runs = ledger.runs
    runs.start("r", key="start", scope="s", owner="w")
    first = runs.review.record_candidate("r", key="cand", **CANDIDATE)
    runs.review.start_review(
        "r", key="rev", review_id="v", candidate_id="c-1", evidence_sha256="e" * 64
    )
    events = count(db, "oncewire_run_events")
    again = runs.review.record_candidate("r", key="cand", **CANDIDATE)
    assert again.replayed and again.event == first.event
    assert again.run.status == "candidate"  # as it stood after that event, not "reviewing"
    with pytest.raises(RunConflict):
        runs.review.record_candidate("r", key="cand", **{**CANDIDATE, "candidate_id": "c-2"})
    with pytest.raises(RunConflict):
        runs.start("r", key="another-start", scope="s", owner="w")
    assert count(db, "oncewire_run_events") == events


def test_a_refused_command_writes_nothing(ledger: Ledger, db: RunsDatabase) -> None:
    runs = ledger.runs
    runs.start("r", key="start", scope="s", owner="w")
    with pytest.raises(TransitionRefused):
        runs.review.terminate("r", key="t", status="verified", reason="nothing reviewed")
    assert count(db, "oncewire_run_events") == 1
    # The key was not consumed: the same key may carry a legal command later.
    runs.review.terminate("r", key="t", status="cancelled", reason="withdrawn")


def test_a_lease_holder_renews_and_a_stale_owner_is_fenced_out(
    ledger: Ledger, clock: ManualClock
) -> None:
    runs = ledger.runs
    run = runs.start("r", key="start", scope="s", owner="worker-1", lease_seconds=10).run
    assert run.fence == 1
    clock.advance(8)
    runs.renew("r", owner="worker-1", fence=1, lease_seconds=10)
    clock.advance(8)
    assert runs.reconcile(owner="boot") == []  # renewed: alive
    clock.advance(8)
    (report,) = runs.reconcile(owner="boot")
    assert report.status == "review_unavailable"
    taken = runs.get("r")
    assert (taken.owner, taken.fence) == ("boot", 2)
    with pytest.raises(StaleFence):
        runs.renew("r", owner="worker-1", fence=1, lease_seconds=10)
    with pytest.raises(StaleFence):
        runs.review.record_candidate("r", key="late", fence=1, **CANDIDATE)


def test_an_action_linked_to_a_cancelled_effect_is_resolved_from_the_outbox(
    ledger: Ledger, clock: ManualClock
) -> None:
    runs = ledger.runs
    runs.start("r", key="start", scope="s", owner="dead", lease_seconds=10)
    runs.review.record_candidate("r", key="cand", **CANDIDATE)
    runs.review.start_review(
        "r", key="rev", review_id="v", candidate_id="c-1", evidence_sha256="e" * 64
    )
    runs.review.complete_review(
        "r", key="rev-done", review_id="v", verdict="issues", findings=[{"finding_id": "f"}]
    )
    runs.review.start_repair("r", key="rep", repair_id="p", finding_ids=["f"])
    with ledger.transaction() as tx:  # the tool call goes through the outbox
        tx.accept("ticket-1", "create_ticket", {"title": "fix it"})
    runs.review.propose_action(
        "r",
        key="act",
        action_id="a",
        kind="create_ticket",
        arguments={"title": "fix it"},
        side_effect_class="external",
        effect_key="ticket-1",
    )
    ledger.effects.cancel("ticket-1", "withdrawn before dispatch")
    clock.advance(60)
    (report,) = runs.reconcile(owner="boot")
    assert (report.status, report.reason) == ("completed_with_issues", "repair_interrupted")
    resolved = [e for e in runs.events("r") if e.type == "action_resolved"]
    assert resolved[0].payload["request"]["result"] == {
        "effect_key": "ticket-1",
        "effect_state": "cancelled",
    }
    assert runs.verify("r")[0].ok


def test_a_proposal_and_its_effect_commit_together_or_not_at_all(
    ledger: Ledger, db: RunsDatabase
) -> None:
    runs = ledger.runs
    runs.start("r", key="start", scope="s", owner="w")
    proposal = {
        "action_id": "a",
        "kind": "create_ticket",
        "arguments": {"title": "fix it"},
        "side_effect_class": "external",
        "effect_key": "ticket-1",
    }
    runs.review.propose_action(
        "r", key="act", dispatch=("create_ticket", {"title": "fix it"}), **proposal
    )
    effect = ledger.effects.get("ticket-1")
    assert (effect.kind, effect.payload) == ("create_ticket", {"title": "fix it"})
    again = runs.review.propose_action(
        "r", key="act", dispatch=("create_ticket", {"title": "fix it"}), **proposal
    )
    assert again.replayed
    events = count(db, "oncewire_run_events")
    with pytest.raises(PayloadConflict):  # the outbox refuses: the proposal rolls back with it
        runs.review.propose_action(
            "r",
            key="act-2",
            dispatch=("create_ticket", {"title": "something else"}),
            **{**proposal, "action_id": "b"},
        )
    assert count(db, "oncewire_run_events") == events
    assert count(db, "oncewire_run_actions") == 1


def test_an_action_whose_effect_was_delivered_is_resolved_from_the_outbox(
    db: RunsDatabase,
) -> None:
    clock = ManualClock(start=time.time())
    with Ledger(db.url, clock=clock) as ledger:
        runs = ledger.runs
        runs.start("r", key="start", scope="s", owner="dead", lease_seconds=10)
        runs.review.propose_action(
            "r",
            key="act",
            action_id="a",
            kind="create_ticket",
            arguments={"title": "fix it"},
            side_effect_class="external",
            effect_key="ticket-1",
            dispatch=("create_ticket", {"title": "fix it"}),
        )
        Dispatcher(ledger, {"create_ticket": lambda attempt: Done({"ticket": 7})}).run(
            until_idle=True, handle_signals=False
        )
        clock.advance(60)
        (report,) = runs.reconcile(owner="boot")
        # The ticket exists, so the outcome is known: the action succeeded, nothing is unknown.
        assert (report.status, report.reason) == ("review_unavailable", "lease_expired")
        resolved = [e for e in runs.events("r") if e.type == "action_resolved"]
        assert resolved[0].payload["request"]["status"] == "succeeded"


def test_a_run_whose_owner_process_is_certainly_gone_is_reconciled_before_its_lease_ends(
    ledger: Ledger,
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    ticks = process_start_ticks(child.pid)
    dead_owner = f"{socket.gethostname()}:{child.pid}:{ticks}:test"
    child.communicate(b"")  # the owner exits (and is reaped): its pid and start time are gone
    runs = ledger.runs
    runs.start("orphan", key="start", scope="s-1", owner=dead_owner, lease_seconds=3600)
    runs.start("alive", key="start", scope="s-2", owner=this_process_owner(), lease_seconds=3600)
    runs.start("named", key="start", scope="s-3", owner="peer-7", lease_seconds=3600)
    reports = runs.reconcile(owner="boot", dead_owners=["peer-7"])
    assert sorted(r.run_id for r in reports) == ["named", "orphan"]
    assert runs.get("alive").status == "running"
