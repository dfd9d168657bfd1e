"""Tampering with a run's history by editing the database directly (a SQLite file, a
PostgreSQL schema), and the constraints that hold the run ledger's invariants in the database
itself."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.core.errors import ConfigurationError, HistoryTampered, TransitionRefused
from oncewire.testing import ManualClock
from tests.support.runs_db import RunsDatabase

SCOPE = "scope-t"
KEY = b"held-outside-the-database"
CANDIDATE: dict[str, Any] = {
    "candidate_id": "c-1",
    "snapshot_sha256": "a" * 64,
    "evidence_sha256": "e" * 64,
    "artifact_set_sha256": "b" * 64,
    "artifact_ids": ["artifact-1"],
    "version_ids": ["version-1"],
}


@pytest.fixture
def db(store_url: str) -> Iterator[RunsDatabase]:
    opened = RunsDatabase(store_url)
    yield opened


def open_ledger(db: RunsDatabase, key: bytes | None = None) -> Ledger:
    return Ledger(db.url, clock=ManualClock(), runs_key=key)


@pytest.fixture
def ledger(db: RunsDatabase) -> Iterator[Ledger]:
    opened = open_ledger(db)
    try:
        yield opened
    finally:
        opened.close()


def verified_run(ledger: Ledger, run_id: str = "run-1", scope: str = SCOPE) -> None:
    runs = ledger.runs
    runs.start(run_id, key="start", scope=scope, owner="worker")
    runs.review.record_candidate(run_id, key="candidate", **CANDIDATE)
    runs.review.start_review(
        run_id, key="review", review_id="r-1", candidate_id="c-1", evidence_sha256="e" * 64
    )
    runs.review.complete_review(run_id, key="review-done", review_id="r-1", verdict="pass")
    runs.review.terminate(run_id, key="terminal", status="verified", reason="review_passed")


def unkeyed(run_id: str, seq: int, type_: str, prev: str, payload: str) -> str:
    return hashlib.sha256(
        f"{run_id}\x1f{seq}\x1f{type_}\x1f{prev}\x1f{payload}".encode()
    ).hexdigest()


def rewrite_chain(db: RunsDatabase, run_id: str, mutate_seq: int, mutate: Any, digest: Any) -> None:
    """Edit one event's payload, then re-hash it and every later event and the run row's head,
    the most a tamperer without the key can do."""
    events = db.query(
        "SELECT id, seq, type, prev_hash, payload FROM oncewire_run_events "
        "WHERE run_id = ? ORDER BY seq",
        (run_id,),
    )
    statements: list[tuple[str, tuple[Any, ...]]] = []
    prev = events[0]["prev_hash"]
    for event in events:
        payload = event["payload"]
        if event["seq"] == mutate_seq:
            payload = mutate(payload)
        new_hash = digest(run_id, event["seq"], event["type"], prev, payload)
        statements.append(
            (
                "UPDATE oncewire_run_events SET payload = ?, prev_hash = ?, hash = ? WHERE id = ?",
                (payload, prev, new_hash, event["id"]),
            )
        )
        prev = new_hash
    statements.append(("UPDATE oncewire_runs SET head_hash = ? WHERE run_id = ?", (prev, run_id)))
    db.tamper(*statements)


def downgrade(payload_json: str) -> str:
    payload = json.loads(payload_json)
    payload["at"] = payload["at"] + 1  # an edit the fold cannot see: only the key catches it
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def test_an_edited_payload_breaks_the_chain_at_the_next_event(
    ledger: Ledger, db: RunsDatabase
) -> None:
    verified_run(ledger)
    event = db.query("SELECT * FROM oncewire_run_events WHERE seq = 2")[0]
    payload = downgrade(event["payload"])
    db.tamper(
        (
            "UPDATE oncewire_run_events SET payload = ?, hash = ? WHERE id = ?",
            (payload, unkeyed("run-1", 2, event["type"], event["prev_hash"], payload), event["id"]),
        ),
    )
    result = ledger.runs.verify("run-1")[0]
    assert not result.ok and result.first_bad_seq == 3
    assert ledger.runs.get("run-1").status == "failed"


def test_with_a_key_a_fully_rehashed_history_is_still_detected(db: RunsDatabase) -> None:
    with open_ledger(db, KEY) as keyed:
        verified_run(keyed)
        assert keyed.runs.verify("run-1")[0].ok

    def hmac_with_wrong_key(run_id: str, seq: int, type_: str, prev: str, payload: str) -> str:
        return unkeyed(run_id, seq, type_, prev, payload)

    rewrite_chain(db, "run-1", 2, downgrade, hmac_with_wrong_key)
    with open_ledger(db, KEY) as keyed:
        result = keyed.runs.verify("run-1")[0]
        assert not result.ok and result.first_bad_seq == 1
        run = keyed.runs.get("run-1")
        assert (run.status, run.terminal_reason, run.claimed_status) == (
            "failed",
            "safety_boundary",
            "verified",
        )


def test_with_the_key_an_honest_history_verifies_and_without_it_is_refused_unjudged(
    db: RunsDatabase,
) -> None:
    with open_ledger(db, KEY) as keyed:
        verified_run(keyed)
        first_hash = db.query(
            "SELECT hash, prev_hash, payload, type FROM oncewire_run_events ORDER BY id"
        )[0]
        material = f"run-1\x1f1\x1f{first_hash['type']}\x1f{first_hash['prev_hash']}\x1f"
        expected = hmac.new(KEY, (material + first_hash["payload"]).encode(), "sha256").hexdigest()
        assert first_hash["hash"] == expected
    events = len(db.query("SELECT id FROM oncewire_run_events"))
    with open_ledger(db) as keyless:
        # Without the key there is nothing truthful to say: a configuration error, no verdict.
        with pytest.raises(ConfigurationError, match="ONCEWIRE_RUNS_KEY"):
            keyless.runs.verify("run-1")
        with pytest.raises(ConfigurationError, match="ONCEWIRE_RUNS_KEY"):
            keyless.runs.review.terminate("run-1", key="again", status="failed", reason="x")
    assert len(db.query("SELECT id FROM oncewire_run_events")) == events


def test_without_a_key_a_semantic_edit_is_caught_by_the_fold_even_when_fully_rehashed(
    ledger: Ledger, db: RunsDatabase
) -> None:
    verified_run(ledger)

    def swap_candidate(payload_json: str) -> str:
        payload = json.loads(payload_json)
        payload["request"]["candidate_id"] = "c-other"
        return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    rewrite_chain(db, "run-1", 3, swap_candidate, unkeyed)
    result = ledger.runs.verify("run-1")[0]
    assert not result.ok and result.first_bad_seq == 3
    assert "request" in (result.reason or "")


def test_swapped_order_is_named_at_the_first_bad_event(ledger: Ledger, db: RunsDatabase) -> None:
    verified_run(ledger)
    db.tamper(
        ("UPDATE oncewire_run_events SET seq = 99 WHERE run_id = 'run-1' AND seq = 2", ()),
        ("UPDATE oncewire_run_events SET seq = 2 WHERE run_id = 'run-1' AND seq = 3", ()),
        ("UPDATE oncewire_run_events SET seq = 3 WHERE run_id = 'run-1' AND seq = 99", ()),
    )
    result = ledger.runs.verify("run-1")[0]
    assert not result.ok and result.first_bad_seq == 2


def test_a_changed_event_type_fails_verification(ledger: Ledger, db: RunsDatabase) -> None:
    verified_run(ledger)
    db.tamper(("UPDATE oncewire_run_events SET type = 'review_started' WHERE seq = 4", ()))
    result = ledger.runs.verify("run-1")[0]
    assert not result.ok and result.first_bad_seq == 4


def test_an_event_moved_to_another_run_fails_both_runs(ledger: Ledger, db: RunsDatabase) -> None:
    verified_run(ledger, "run-1", scope="scope-a")
    verified_run(ledger, "run-2", scope="scope-b")
    db.drop_run_references()  # the move passes through a run id that has no row
    db.tamper(
        (
            "UPDATE oncewire_run_events SET run_id = 'run-9', idempotency_key = 'moved' "
            "WHERE run_id = 'run-2' AND seq = 3",
            (),
        ),
        ("UPDATE oncewire_run_events SET seq = 6 WHERE run_id = 'run-9'", ()),
        ("UPDATE oncewire_run_events SET run_id = 'run-1' WHERE run_id = 'run-9'", ()),
    )
    results = {v.run_id: v for v in ledger.runs.verify()}
    assert not results["run-1"].ok and results["run-1"].first_bad_seq == 6
    assert not results["run-2"].ok and results["run-2"].first_bad_seq == 3


def test_events_whose_run_row_was_deleted_are_reported(ledger: Ledger, db: RunsDatabase) -> None:
    verified_run(ledger)
    db.drop_run_references()
    db.tamper(("DELETE FROM oncewire_runs WHERE run_id = 'run-1'", ()))
    (result,) = ledger.runs.verify()
    assert (result.run_id, result.ok, result.events) == ("run-1", False, 5)
    assert ledger.runs.project(SCOPE).run is None  # nothing is shown, so nothing authorised


def test_a_deleted_event_is_a_gap(ledger: Ledger, db: RunsDatabase) -> None:
    verified_run(ledger)
    db.tamper(("DELETE FROM oncewire_run_events WHERE seq = 3", ()))
    result = ledger.runs.verify("run-1")[0]
    assert not result.ok and result.first_bad_seq == 3


def test_an_edited_run_row_is_refused_by_the_next_command_and_shown_failed(
    ledger: Ledger, db: RunsDatabase
) -> None:
    runs = ledger.runs
    runs.start("run-1", key="start", scope=SCOPE, owner="worker")
    runs.review.record_candidate("run-1", key="candidate", **CANDIDATE)
    db.tamper(("UPDATE oncewire_runs SET status = 'reviewing' WHERE run_id = 'run-1'", ()))
    with pytest.raises(HistoryTampered):
        runs.review.terminate("run-1", key="t", status="review_unavailable", reason="x")
    with pytest.raises(HistoryTampered):  # the incremental check, on an ordinary command
        runs.review.start_review(
            "run-1", key="review", review_id="r-1", candidate_id="c-1", evidence_sha256="e" * 64
        )
    run = runs.get("run-1")
    assert (run.status, run.claimed_status) == ("failed", "reviewing")
    # Never rewritten: the stored row still says what it said.
    assert db.query("SELECT status FROM oncewire_runs")[0]["status"] == "reviewing"
    assert db.query("SELECT COUNT(*) FROM oncewire_run_events")[0][0] == 2


def test_an_un_abandoned_run_row_fails_verification(ledger: Ledger, db: RunsDatabase) -> None:
    runs = ledger.runs
    runs.start("run-1", key="start", scope=SCOPE, owner="worker")
    checkpoint = runs.checkpoint("cp", scope=SCOPE)
    runs.review.record_candidate("run-1", key="candidate", **CANDIDATE)
    assert runs.revert(scope=SCOPE, checkpoint_id=checkpoint.checkpoint_id).abandoned == ["run-1"]
    db.tamper(
        (
            "UPDATE oncewire_runs SET abandoned_at = NULL, abandon_reason = NULL, hidden = FALSE "
            "WHERE run_id = 'run-1'",
            (),
        ),
    )
    result = runs.verify("run-1")[0]
    assert not result.ok and "release" in (result.reason or "")
    with pytest.raises(TransitionRefused, match="abandoned"):  # its own history says so
        runs.review.start_review(
            "run-1", key="review", review_id="r-1", candidate_id="c-1", evidence_sha256="e" * 64
        )


def test_an_edited_head_event_is_refused_by_the_next_command(
    ledger: Ledger, db: RunsDatabase
) -> None:
    runs = ledger.runs
    runs.start("run-1", key="start", scope=SCOPE, owner="worker")
    runs.review.record_candidate("run-1", key="candidate", **CANDIDATE)
    db.tamper(
        (
            "UPDATE oncewire_run_events SET payload = replace(payload, 'c-1', 'c-2') WHERE seq = 2",
            (),
        ),
    )
    with pytest.raises(HistoryTampered) as refused:
        runs.review.start_review(
            "run-1", key="review", review_id="r-1", candidate_id="c-1", evidence_sha256="e" * 64
        )
    assert refused.value.code == "history_tampered" and refused.value.fields["seq"] == 2


# -- constraints held by the database ------------------------------------------------------------
def test_the_database_allows_one_active_run_per_branch(ledger: Ledger, db: RunsDatabase) -> None:
    ledger.runs.start("run-1", key="start", scope=SCOPE, owner="worker")
    with pytest.raises(db.integrity_errors):
        db.execute(
            (
                "INSERT INTO oncewire_runs (run_id, scope, branch, workflow, chain, status, "
                "state, head_hash, created_at, updated_at) "
                "SELECT 'run-2', scope, branch, workflow, chain, 'running', state, head_hash, "
                "created_at, updated_at FROM oncewire_runs WHERE run_id = 'run-1'",
                (),
            )
        )


INSERT_EVENT = (
    "INSERT INTO oncewire_run_events (run_id, scope, branch, seq, type, "
    "idempotency_key, request_digest, terminal, payload, prev_hash, hash, at) "
    "VALUES ('run-1', ?, ?, ?, 'run_terminated', ?, 'd', TRUE, '{}', ?, 'h', 0)"
)


def test_the_database_allows_one_terminal_event_and_none_while_a_phase_is_open(
    ledger: Ledger, db: RunsDatabase
) -> None:
    verified_run(ledger)
    head = db.query("SELECT head_seq, head_hash FROM oncewire_runs")[0]
    with pytest.raises(db.integrity_errors):
        db.execute((INSERT_EVENT, (SCOPE, SCOPE, head[0] + 1, "second-terminal", head[1])))
    with pytest.raises(db.integrity_errors):  # not at the head: refused by the trigger
        db.execute((INSERT_EVENT.replace("TRUE, '{}'", "FALSE, '{}'"), (SCOPE, SCOPE, 2, "k", "x")))
    with pytest.raises(db.integrity_errors):
        db.execute(("UPDATE oncewire_run_events SET payload = '{}' WHERE seq = 1", ()))
    with pytest.raises(db.integrity_errors):
        db.execute(("DELETE FROM oncewire_run_events WHERE seq = 1", ()))


def test_the_database_refuses_a_terminal_while_a_phase_is_open(
    ledger: Ledger, db: RunsDatabase
) -> None:
    runs = ledger.runs
    runs.start("run-1", key="start", scope=SCOPE, owner="worker")
    runs.review.record_candidate("run-1", key="candidate", **CANDIDATE)
    runs.review.start_review(
        "run-1", key="review", review_id="r-1", candidate_id="c-1", evidence_sha256="e" * 64
    )
    head = db.query("SELECT head_seq, head_hash FROM oncewire_runs")[0]
    with pytest.raises(db.integrity_errors, match="phase is open"):
        db.execute((INSERT_EVENT, (SCOPE, SCOPE, head[0] + 1, "k", head[1])))
