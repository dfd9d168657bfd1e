"""Tampering with a run's history by editing the SQLite file directly, and the constraints
that hold the run ledger's invariants in the database itself."""

from __future__ import annotations

import hashlib
import hmac
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger, ManualClock
from oncewire.core.errors import HistoryTampered, TransitionRefused

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
def path(tmp_path: Path) -> Path:
    return tmp_path / "tamper.db"


def open_ledger(path: Path, key: bytes | None = None) -> Ledger:
    return Ledger(str(path), clock=ManualClock(), runs_key=key)


@pytest.fixture
def ledger(path: Path) -> Iterator[Ledger]:
    opened = open_ledger(path)
    try:
        yield opened
    finally:
        opened.close()


def verified_run(ledger: Ledger, run_id: str = "run-1", scope: str = SCOPE) -> None:
    runs = ledger.runs
    runs.start(run_id, key="start", scope=scope, owner="worker")
    runs.record_candidate(run_id, key="candidate", **CANDIDATE)
    runs.start_review(
        run_id, key="review", review_id="r-1", candidate_id="c-1", evidence_sha256="e" * 64
    )
    runs.complete_review(run_id, key="review-done", review_id="r-1", verdict="pass")
    runs.terminate(run_id, key="terminal", status="verified", reason="review_passed")


def edit(path: Path, *statements: tuple[str, tuple[Any, ...]]) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("DROP TRIGGER IF EXISTS oncewire_run_events_no_update")
        conn.execute("DROP TRIGGER IF EXISTS oncewire_run_events_no_delete")
        for sql, params in statements:
            conn.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


def rows(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def unkeyed(run_id: str, seq: int, type_: str, prev: str, payload: str) -> str:
    return hashlib.sha256(
        f"{run_id}\x1f{seq}\x1f{type_}\x1f{prev}\x1f{payload}".encode()
    ).hexdigest()


def rewrite_chain(path: Path, run_id: str, mutate_seq: int, mutate: Any, digest: Any) -> None:
    """Edit one event's payload, then re-hash it and every later event and the run row's head,
    the most a tamperer without the key can do."""
    events = rows(
        path,
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
    edit(path, *statements)


def downgrade(payload_json: str) -> str:
    payload = json.loads(payload_json)
    payload["at"] = payload["at"] + 1  # an edit the fold cannot see: only the key catches it
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def test_an_edited_payload_breaks_the_chain_at_the_next_event(ledger: Ledger, path: Path) -> None:
    verified_run(ledger)
    event = rows(path, "SELECT * FROM oncewire_run_events WHERE seq = 2")[0]
    payload = downgrade(event["payload"])
    edit(
        path,
        (
            "UPDATE oncewire_run_events SET payload = ?, hash = ? WHERE id = ?",
            (payload, unkeyed("run-1", 2, event["type"], event["prev_hash"], payload), event["id"]),
        ),
    )
    result = ledger.runs.verify("run-1")[0]
    assert not result.ok and result.first_bad_seq == 3
    assert ledger.runs.get("run-1").status == "failed"


def test_with_a_key_a_fully_rehashed_history_is_still_detected(path: Path) -> None:
    with open_ledger(path, KEY) as keyed:
        verified_run(keyed)
        assert keyed.runs.verify("run-1")[0].ok

    def hmac_with_wrong_key(run_id: str, seq: int, type_: str, prev: str, payload: str) -> str:
        return unkeyed(run_id, seq, type_, prev, payload)

    rewrite_chain(path, "run-1", 2, downgrade, hmac_with_wrong_key)
    with open_ledger(path, KEY) as keyed:
        result = keyed.runs.verify("run-1")[0]
        assert not result.ok and result.first_bad_seq == 1
        run = keyed.runs.get("run-1")
        assert (run.status, run.terminal_reason, run.claimed_status) == (
            "failed",
            "safety_boundary",
            "verified",
        )


def test_with_the_key_an_honest_history_verifies_and_without_it_fails_closed(path: Path) -> None:
    with open_ledger(path, KEY) as keyed:
        verified_run(keyed)
        first_hash = rows(path, "SELECT hash, prev_hash, payload, type FROM oncewire_run_events")[0]
        material = f"run-1\x1f1\x1f{first_hash['type']}\x1f{first_hash['prev_hash']}\x1f"
        expected = hmac.new(KEY, (material + first_hash["payload"]).encode(), "sha256").hexdigest()
        assert first_hash["hash"] == expected
    with open_ledger(path) as keyless:
        assert not keyless.runs.verify("run-1")[0].ok
        with pytest.raises(HistoryTampered):
            keyless.runs.terminate("run-1", key="again", status="failed", reason="x")


def test_without_a_key_a_semantic_edit_is_caught_by_the_fold_even_when_fully_rehashed(
    ledger: Ledger, path: Path
) -> None:
    verified_run(ledger)

    def swap_candidate(payload_json: str) -> str:
        payload = json.loads(payload_json)
        payload["request"]["candidate_id"] = "c-other"
        return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    rewrite_chain(path, "run-1", 3, swap_candidate, unkeyed)
    result = ledger.runs.verify("run-1")[0]
    assert not result.ok and result.first_bad_seq == 3
    assert "request" in (result.reason or "")


def test_swapped_order_is_named_at_the_first_bad_event(ledger: Ledger, path: Path) -> None:
    verified_run(ledger)
    edit(
        path,
        ("UPDATE oncewire_run_events SET seq = 99 WHERE run_id = 'run-1' AND seq = 2", ()),
        ("UPDATE oncewire_run_events SET seq = 2 WHERE run_id = 'run-1' AND seq = 3", ()),
        ("UPDATE oncewire_run_events SET seq = 3 WHERE run_id = 'run-1' AND seq = 99", ()),
    )
    result = ledger.runs.verify("run-1")[0]
    assert not result.ok and result.first_bad_seq == 2


def test_a_changed_event_type_fails_verification(ledger: Ledger, path: Path) -> None:
    verified_run(ledger)
    edit(path, ("UPDATE oncewire_run_events SET type = 'review_started' WHERE seq = 4", ()))
    result = ledger.runs.verify("run-1")[0]
    assert not result.ok and result.first_bad_seq == 4


def test_an_event_moved_to_another_run_fails_both_runs(ledger: Ledger, path: Path) -> None:
    verified_run(ledger, "run-1", scope="scope-a")
    verified_run(ledger, "run-2", scope="scope-b")
    edit(
        path,
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


def test_events_whose_run_row_was_deleted_are_reported(ledger: Ledger, path: Path) -> None:
    verified_run(ledger)
    edit(path, ("DELETE FROM oncewire_runs WHERE run_id = 'run-1'", ()))
    (result,) = ledger.runs.verify()
    assert (result.run_id, result.ok, result.events) == ("run-1", False, 5)
    assert ledger.runs.project(SCOPE).run is None  # nothing is shown, so nothing authorised


def test_a_deleted_event_is_a_gap(ledger: Ledger, path: Path) -> None:
    verified_run(ledger)
    edit(path, ("DELETE FROM oncewire_run_events WHERE seq = 3", ()))
    result = ledger.runs.verify("run-1")[0]
    assert not result.ok and result.first_bad_seq == 3


def test_an_edited_run_row_is_refused_by_the_next_command_and_shown_failed(
    ledger: Ledger, path: Path
) -> None:
    runs = ledger.runs
    runs.start("run-1", key="start", scope=SCOPE, owner="worker")
    runs.record_candidate("run-1", key="candidate", **CANDIDATE)
    edit(path, ("UPDATE oncewire_runs SET status = 'reviewing' WHERE run_id = 'run-1'", ()))
    with pytest.raises(HistoryTampered):
        runs.terminate("run-1", key="t", status="review_unavailable", reason="x")
    with pytest.raises(HistoryTampered):  # the incremental check, on an ordinary command
        runs.start_review(
            "run-1", key="review", review_id="r-1", candidate_id="c-1", evidence_sha256="e" * 64
        )
    run = runs.get("run-1")
    assert (run.status, run.claimed_status) == ("failed", "reviewing")
    # Never rewritten: the stored row still says what it said.
    assert rows(path, "SELECT status FROM oncewire_runs")[0]["status"] == "reviewing"
    assert rows(path, "SELECT COUNT(*) FROM oncewire_run_events")[0][0] == 2


def test_an_un_abandoned_run_row_fails_verification(ledger: Ledger, path: Path) -> None:
    runs = ledger.runs
    runs.start("run-1", key="start", scope=SCOPE, owner="worker")
    checkpoint = runs.checkpoint("cp", scope=SCOPE)
    runs.record_candidate("run-1", key="candidate", **CANDIDATE)
    assert runs.revert(scope=SCOPE, checkpoint_id=checkpoint.checkpoint_id).abandoned == ["run-1"]
    edit(
        path,
        (
            "UPDATE oncewire_runs SET abandoned_at = NULL, abandon_reason = NULL, hidden = 0 "
            "WHERE run_id = 'run-1'",
            (),
        ),
    )
    result = runs.verify("run-1")[0]
    assert not result.ok and "release" in (result.reason or "")
    with pytest.raises(TransitionRefused, match="abandoned"):  # its own history says so
        runs.start_review(
            "run-1", key="review", review_id="r-1", candidate_id="c-1", evidence_sha256="e" * 64
        )


def test_an_edited_head_event_is_refused_by_the_next_command(ledger: Ledger, path: Path) -> None:
    runs = ledger.runs
    runs.start("run-1", key="start", scope=SCOPE, owner="worker")
    runs.record_candidate("run-1", key="candidate", **CANDIDATE)
    edit(
        path,
        (
            "UPDATE oncewire_run_events SET payload = replace(payload, 'c-1', 'c-2') WHERE seq = 2",
            (),
        ),
    )
    with pytest.raises(HistoryTampered) as refused:
        runs.start_review(
            "run-1", key="review", review_id="r-1", candidate_id="c-1", evidence_sha256="e" * 64
        )
    assert refused.value.code == "history_tampered" and refused.value.fields["seq"] == 2


# -- constraints held by the database ------------------------------------------------------------
def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def test_the_database_allows_one_active_run_per_branch(ledger: Ledger, path: Path) -> None:
    ledger.runs.start("run-1", key="start", scope=SCOPE, owner="worker")
    conn = raw(path)
    try:
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(
                "INSERT INTO oncewire_runs (run_id, scope, branch, workflow, chain, status, "
                "state, head_hash, created_at, updated_at) "
                "SELECT 'run-2', scope, branch, workflow, chain, 'running', state, head_hash, "
                "created_at, updated_at FROM oncewire_runs WHERE run_id = 'run-1'"
            )
    finally:
        conn.close()


def test_the_database_allows_one_terminal_event_and_none_while_a_phase_is_open(
    ledger: Ledger, path: Path
) -> None:
    verified_run(ledger)
    conn = raw(path)
    try:
        head = conn.execute("SELECT head_seq, head_hash FROM oncewire_runs").fetchone()
        insert = (
            "INSERT INTO oncewire_run_events (run_id, scope, branch, seq, type, "
            "idempotency_key, request_digest, terminal, payload, prev_hash, hash, at) "
            "VALUES ('run-1', ?, ?, ?, 'run_terminated', ?, 'd', 1, '{}', ?, 'h', 0)"
        )
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(insert, (SCOPE, SCOPE, head[0] + 1, "second-terminal", head[1]))
        with pytest.raises(sqlite3.IntegrityError):  # not at the head: refused by the trigger
            conn.execute(insert.replace("1, '{}'", "0, '{}'"), (SCOPE, SCOPE, 2, "k", "x"))
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("UPDATE oncewire_run_events SET payload = '{}' WHERE seq = 1")
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("DELETE FROM oncewire_run_events WHERE seq = 1")
    finally:
        conn.close()


def test_the_database_refuses_a_terminal_while_a_phase_is_open(ledger: Ledger, path: Path) -> None:
    runs = ledger.runs
    runs.start("run-1", key="start", scope=SCOPE, owner="worker")
    runs.record_candidate("run-1", key="candidate", **CANDIDATE)
    runs.start_review(
        "run-1", key="review", review_id="r-1", candidate_id="c-1", evidence_sha256="e" * 64
    )
    conn = raw(path)
    try:
        head = conn.execute("SELECT head_seq, head_hash FROM oncewire_runs").fetchone()
        with pytest.raises(sqlite3.IntegrityError, match="phase is open"):
            conn.execute(
                "INSERT INTO oncewire_run_events (run_id, scope, branch, seq, type, "
                "idempotency_key, request_digest, terminal, payload, prev_hash, hash, at) "
                "VALUES ('run-1', ?, ?, ?, 'run_terminated', 'k', 'd', 1, '{}', ?, 'h', 0)",
                (SCOPE, SCOPE, head[0] + 1, head[1]),
            )
    finally:
        conn.close()
