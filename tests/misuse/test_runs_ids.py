"""Misuse of the run ledger's own ids: a review, repair, finding, action or checkpoint id used
twice. Each reuse is refused as a typed error before anything is written (or is the replay of the
same command it claims to be), so the history and the phase, finding and action rows can never
disagree through the API, and a healthy run is never judged tampered."""

from __future__ import annotations

from typing import Any

import pytest

from oncewire import Ledger
from oncewire.core.errors import ConfigurationError, RunConflict, TransitionRefused
from tests.contract.conftest import RawDatabase

E = "e" * 64


def candidate(candidate_id: str = "c-1") -> dict[str, Any]:
    return {
        "candidate_id": candidate_id,
        "snapshot_sha256": "a" * 64,
        "evidence_sha256": E,
        "artifact_set_sha256": "b" * 64,
        "artifact_ids": [],
        "version_ids": [],
    }


def reviewed(ledger: Ledger, verdict: str = "pass", **findings: Any) -> None:
    runs = ledger.runs
    runs.start("r1", key="start", scope="s1", owner="w")
    runs.review.record_candidate("r1", key="cand", **candidate())
    runs.review.start_review(
        "r1", key="rv-open", review_id="rv", candidate_id="c-1", evidence_sha256=E
    )
    runs.review.complete_review(
        "r1", key="rv-done", review_id="rv", verdict=verdict, findings=findings.get("f", ())
    )


def snapshot(raw: RawDatabase) -> tuple[Any, ...]:
    return tuple(
        tuple(tuple(row) for row in raw.query(sql))
        for sql in (
            "SELECT seq, hash FROM oncewire_run_events ORDER BY seq",
            "SELECT phase_id, status, opened_seq, closed_seq FROM oncewire_run_phases "
            "ORDER BY phase_id",
            "SELECT finding_id, phase_id FROM oncewire_run_findings ORDER BY finding_id",
            "SELECT action_id, status, proposed_seq, resolved_seq FROM oncewire_run_actions "
            "ORDER BY action_id",
            "SELECT status, head_seq, head_hash FROM oncewire_runs",
        )
    )


def assert_healthy(ledger: Ledger) -> None:
    (verification,) = ledger.runs.verify("r1")
    assert verification.ok, verification
    assert ledger.runs.get("r1").terminal_reason != "safety_boundary"


def test_a_reused_review_id_is_refused_and_the_run_stays_healthy(
    ledger: Ledger, raw: RawDatabase
) -> None:
    reviewed(ledger)
    before = snapshot(raw)
    with pytest.raises(RunConflict, match="'rv'"):
        ledger.runs.review.start_review(
            "r1", key="rv-again", review_id="rv", candidate_id="c-1", evidence_sha256=E
        )
    assert snapshot(raw) == before
    assert_healthy(ledger)
    # The run goes on: a new review id is accepted and the run can be verified to the end.
    ledger.runs.review.start_review(
        "r1", key="rv2-open", review_id="rv2", candidate_id="c-1", evidence_sha256=E
    )
    ledger.runs.review.complete_review("r1", key="rv2-done", review_id="rv2", verdict="pass")
    done = ledger.runs.review.terminate("r1", key="end", status="verified", reason="review_passed")
    assert done.run.status == "verified"
    assert_healthy(ledger)


def test_the_same_start_review_again_is_a_replay_not_a_conflict(ledger: Ledger) -> None:
    reviewed(ledger)
    first = ledger.runs.events("r1")[2]
    again = ledger.runs.review.start_review(
        "r1", key="rv-open", review_id="rv", candidate_id="c-1", evidence_sha256=E
    )
    assert again.replayed and again.event.hash == first.hash
    assert_healthy(ledger)


def test_a_repair_id_that_names_an_earlier_review_is_refused(
    ledger: Ledger, raw: RawDatabase
) -> None:
    reviewed(ledger, verdict="issues", f=[{"finding_id": "f1"}])
    before = snapshot(raw)
    with pytest.raises(RunConflict, match="'rv'"):
        ledger.runs.review.start_repair("r1", key="rp", repair_id="rv", finding_ids=["f1"])
    assert snapshot(raw) == before
    assert_healthy(ledger)


def test_a_reused_repair_id_is_refused(ledger: Ledger, raw: RawDatabase) -> None:
    reviewed(ledger, verdict="issues", f=[{"finding_id": "f1"}])
    runs = ledger.runs
    runs.review.start_repair("r1", key="rp", repair_id="rp", finding_ids=["f1"])
    runs.review.bind_actions("r1", key="rp-bind", repair_id="rp")
    runs.review.complete_repair(
        "r1", key="rp-done", repair_id="rp", status="completed", candidate=candidate("c-2")
    )
    runs.review.start_review(
        "r1", key="rv2", review_id="rv2", candidate_id="c-2", evidence_sha256=E
    )
    runs.review.complete_review(
        "r1", key="rv2-done", review_id="rv2", verdict="issues", findings=[{"finding_id": "f2"}]
    )
    before = snapshot(raw)
    with pytest.raises(RunConflict, match="'rp'"):
        runs.review.start_repair("r1", key="rp-again", repair_id="rp", finding_ids=["f2"])
    assert snapshot(raw) == before
    assert_healthy(ledger)


def test_a_reused_finding_id_is_a_typed_refusal_not_a_storage_error(
    ledger: Ledger, raw: RawDatabase
) -> None:
    reviewed(ledger, verdict="issues", f=[{"finding_id": "f1"}])
    runs = ledger.runs
    runs.review.start_review(
        "r1", key="rv2", review_id="rv2", candidate_id="c-1", evidence_sha256=E
    )
    before = snapshot(raw)
    with pytest.raises(RunConflict, match="'f1'"):
        runs.review.complete_review(
            "r1", key="rv2-done", review_id="rv2", verdict="issues", findings=[{"finding_id": "f1"}]
        )
    assert snapshot(raw) == before
    assert_healthy(ledger)
    runs.review.complete_review(
        "r1", key="rv2-done-2", review_id="rv2", verdict="issues", findings=[{"finding_id": "f9"}]
    )
    assert_healthy(ledger)


def test_a_reused_action_id_is_refused_after_it_resolved(ledger: Ledger, raw: RawDatabase) -> None:
    reviewed(ledger)
    runs = ledger.runs
    runs.review.propose_action(
        "r1",
        key="a1",
        action_id="act",
        kind="http",
        arguments={"n": 1},
        side_effect_class="external",
    )
    runs.review.resolve_action(
        "r1", key="a1-done", action_id="act", status="succeeded", result={"ok": 1}
    )
    before = snapshot(raw)
    with pytest.raises(RunConflict, match="'act'"):
        runs.review.propose_action(
            "r1",
            key="a2",
            action_id="act",
            kind="http",
            arguments={"n": 2},
            side_effect_class="external",
        )
    assert snapshot(raw) == before
    (row,) = raw.query("SELECT arguments, status FROM oncewire_run_actions")
    assert tuple(row) == ('{"n":1}', "succeeded")
    assert_healthy(ledger)


def test_an_action_proposed_twice_while_open_stays_a_transition_refusal(ledger: Ledger) -> None:
    reviewed(ledger)
    runs = ledger.runs
    runs.review.propose_action(
        "r1", key="a1", action_id="act", kind="http", arguments={}, side_effect_class="external"
    )
    with pytest.raises(TransitionRefused, match="already proposed"):
        runs.review.propose_action(
            "r1", key="a2", action_id="act", kind="http", arguments={}, side_effect_class="external"
        )
    assert_healthy(ledger)


def test_a_checkpoint_id_reused_for_another_checkpoint_is_refused(
    ledger: Ledger, raw: RawDatabase
) -> None:
    reviewed(ledger)
    first = ledger.runs.checkpoint("cp", scope="s1", reason="before", metadata={"n": 1})
    # The same call again is a replay of the checkpoint it made.
    assert ledger.runs.checkpoint("cp", scope="s1", reason="before", metadata={"n": 1}) == first
    with pytest.raises(RunConflict, match="'cp'"):
        ledger.runs.checkpoint("cp", scope="s1", reason="other", metadata={"n": 2})
    with pytest.raises(RunConflict, match="'cp'"):
        ledger.runs.checkpoint("cp", scope="s2")
    rows = raw.query("SELECT scope, reason, metadata FROM oncewire_run_checkpoints")
    assert [tuple(r) for r in rows] == [("s1", "before", '{"n":1}')]


def test_a_branch_name_reused_for_another_fork_is_refused(ledger: Ledger, raw: RawDatabase) -> None:
    runs = ledger.runs
    runs.start("r0", key="start", scope="s1", owner="w")
    early = runs.checkpoint("cp-early", scope="s1")
    runs.review.record_candidate("r0", key="cand", **candidate())
    late = runs.checkpoint("cp-late", scope="s1")
    runs.fork(scope="s1", checkpoint_id=early.checkpoint_id, branch="b")
    runs.fork(scope="s1", checkpoint_id=early.checkpoint_id, branch="b")  # the same fork: a replay
    with pytest.raises(RunConflict, match="'b'"):
        runs.fork(scope="s1", checkpoint_id=late.checkpoint_id, branch="b")
    with pytest.raises(RunConflict, match="'s1'"):
        runs.fork(scope="s1", checkpoint_id=early.checkpoint_id, branch="s1")
    assert raw.count("oncewire_run_branches") == 2


def test_a_delivery_key_reused_for_another_message_is_refused(
    ledger: Ledger, raw: RawDatabase
) -> None:
    deliveries = ledger.runs.deliveries
    first = deliveries.commit("d1", scope="s1", content="hello", manifest={"m": 1})
    assert deliveries.commit("d1", scope="s1", content="hello", manifest={"m": 1}) == first
    with pytest.raises(RunConflict, match="'d1'"):
        deliveries.commit("d1", scope="s1", content="other", manifest={"m": 1})
    (row,) = raw.query("SELECT content FROM oncewire_run_deliveries")
    assert row[0] == "hello"


@pytest.mark.parametrize(
    ("run_id", "problem"),
    [
        (
            "r\u200b1",
            "must not contain a format character (Unicode category Cf): U+200B at index 1",
        ),
        (
            "\u202e1r",
            "must not contain a format character (Unicode category Cf): U+202E at index 0",
        ),
        (
            "r1\u2069",
            "must not contain a format character (Unicode category Cf): U+2069 at index 2",
        ),
        ("r\x001", "must not contain a control character: U+0000 at index 1"),
        ("r1 ", "must not start or end with whitespace: 'r1 '"),
        ("", "must not be empty"),
        (7, "must be a string, not int"),
    ],
    ids=["zero-width-space", "rtl-override", "pdi", "nul", "trailing-space", "empty", "int"],
)
def test_a_run_id_that_prints_as_another_is_refused_and_nothing_is_stored(
    ledger: Ledger, raw: RawDatabase, run_id: Any, problem: str
) -> None:
    """Regression: a run id with a zero-width or bidi-override character was accepted, and
    showed as another run's id in `oncewire runs list` and on the dashboard."""
    with pytest.raises(ConfigurationError) as caught:
        ledger.runs.start(run_id, key="start", scope="s1", owner="w")
    assert str(caught.value) == f"a run id {problem}"
    assert raw.count("oncewire_runs") == raw.count("oncewire_run_events") == 0
