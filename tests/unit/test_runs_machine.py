"""The run ledger's pure logic: the transition table, the review preset's guards, the recovery
plan and the hash chain. No I/O."""

from __future__ import annotations

from typing import Any

import pytest

from oncewire.runs.chain import event_hash, genesis_hash, verify_chain
from oncewire.runs.machine import NEW, Refusal, Step, Transition, Workflow, apply_command
from oncewire.runs.records import TERMINAL_STATUSES
from oncewire.runs.review import REVIEW, UNAVAILABLE_SUMMARY, recovery_plan

CANDIDATE = {
    "candidate_id": "c-1",
    "snapshot_sha256": "a",
    "evidence_sha256": "e",
    "artifact_set_sha256": "b",
    "artifact_ids": [],
    "version_ids": [],
}


class Run:
    """Drives the review preset in memory, as the service and the verifier do."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"status": NEW}
        self.seq = 0

    def __call__(self, command: str, **request: Any) -> Any:
        self.seq += 1
        return apply_command(REVIEW, self.state, command, request, Step("r", self.seq, 1.0, None))

    def reviewed(self, verdict: str, findings: list[dict[str, Any]] | None = None) -> Run:
        self("start", workflow="review", scope="s", branch="s", turn=None, params={})
        self("record_candidate", candidate=CANDIDATE)
        self("start_review", review_id="r-1", candidate_id="c-1", evidence_sha256="e")
        self(
            "complete_review",
            review_id="r-1",
            status="completed",
            verdict=verdict,
            findings=findings or [],
        )
        return self


def test_the_table_is_declarative_and_complete() -> None:
    rows = REVIEW.describe()
    assert {row["command"] for row in rows} == set(REVIEW.commands())
    assert [row["event"] for row in rows if row["terminal"]] == ["run_terminated"]
    assert REVIEW.terminal_statuses == {str(s) for s in TERMINAL_STATUSES}
    # Every event type maps back to exactly one command: verification relies on it.
    assert len(REVIEW.by_event) == len(REVIEW.transitions)


def test_a_table_with_an_ambiguous_row_is_refused() -> None:
    row = Transition("go", frozenset({"a"}), "went", "b", lambda *_: None)
    with pytest.raises(ValueError, match="twice"):
        Workflow(
            "bad",
            (row, Transition("go", frozenset({"a"}), "went2", "c", lambda *_: None)),
            frozenset(),
        )


def test_verified_needs_a_passing_review_of_the_current_candidate() -> None:
    run = Run().reviewed("issues", [{"finding_id": "f-1"}])
    with pytest.raises(Refusal, match="says issues"):
        run("terminate", status="verified", reason="x")
    run("terminate", status="completed_with_issues", reason="issues_remain")
    assert run.state["status"] == "completed_with_issues"

    fresh = Run().reviewed("pass")
    fresh("record_candidate", candidate={**CANDIDATE, "candidate_id": "c-2"})
    with pytest.raises(Refusal, match="no review"):
        fresh("terminate", status="verified", reason="x")


def test_no_terminal_while_a_phase_is_open_and_no_command_from_a_terminal() -> None:
    run = Run().reviewed("pass")
    run("start_review", review_id="r-2", candidate_id="c-1", evidence_sha256="e")
    with pytest.raises(Refusal, match="still open"):
        run("terminate", status="failed", reason="x")
    run("complete_review", review_id="r-2", status="unavailable", verdict="review_unavailable")
    run("terminate", status="review_unavailable", reason="x")
    with pytest.raises(Refusal, match="not allowed from review_unavailable"):
        run("record_candidate", candidate=CANDIDATE)


def test_a_review_binds_to_its_candidate_and_its_open_phase() -> None:
    run = Run()
    run("start", workflow="review", scope="s", branch="s", turn=None, params={})
    run("record_candidate", candidate=CANDIDATE)
    with pytest.raises(Refusal, match="current candidate"):
        run("start_review", review_id="r-1", candidate_id="c-other", evidence_sha256="e")
    run("start_review", review_id="r-1", candidate_id="c-1", evidence_sha256="e")
    with pytest.raises(Refusal, match="not the open review"):
        run("complete_review", review_id="r-9", status="completed", verdict="pass")
    with pytest.raises(Refusal, match="another candidate"):
        run(
            "complete_review",
            review_id="r-1",
            status="completed",
            verdict="issues",
            findings=[{"finding_id": "f", "candidate_id": "c-other"}],
        )
    with pytest.raises(Refusal, match="no findings"):
        run(
            "complete_review",
            review_id="r-1",
            status="unavailable",
            verdict="review_unavailable",
            findings=[{"finding_id": "f"}],
        )


def repairing(*, bind: bool, action_class: str | None, effect_key: str | None = None) -> Run:
    run = Run().reviewed("issues", [{"finding_id": "f-1"}])
    run("start_repair", repair_id="p-1", finding_ids=["f-1"], checkpoint_id=None)
    if bind:
        run("bind_actions", repair_id="p-1")
    if action_class:
        run(
            "propose_action",
            action_id="a-1",
            kind="write",
            arguments={},
            side_effect_class=action_class,
            resource_keys=[],
            effect_key=effect_key,
        )
    return run


def plan(run: Run, effects: dict[str, str] | None = None) -> tuple[list[Any], str | None]:
    return recovery_plan(run.state, effects or {}, reason="lease_expired")


def test_recovery_closes_a_review_as_unavailable_without_findings() -> None:
    run = Run().reviewed("pass")
    run("start_review", review_id="r-2", candidate_id="c-1", evidence_sha256="e")
    steps, abandon = plan(run)
    assert abandon is None
    assert [c for c, _ in steps] == ["complete_review", "terminate"]
    assert steps[0][1]["findings"] == [] and steps[0][1]["verdict"] == "review_unavailable"
    assert steps[0][1]["assessment"]["summary"] == UNAVAILABLE_SUMMARY
    assert steps[1][1] == {"status": "review_unavailable", "reason": "lease_expired"}


@pytest.mark.parametrize(
    ("bind", "action_class", "effects", "expected"),
    [
        (False, None, {}, "abandon"),
        (True, "workspace_write", {}, ("outcome_unknown", "outcome_unknown")),
        (True, "read_only", {}, ("interrupted", "completed_with_issues")),
        (True, None, {}, ("interrupted", "completed_with_issues")),
        (True, "external", {"k": "done"}, ("outcome_unknown", "outcome_unknown")),
        (True, "external", {"k": "rejected"}, ("interrupted", "completed_with_issues")),
        (True, "external", {"k": "pending"}, ("outcome_unknown", "outcome_unknown")),
    ],
)
def test_recovery_of_an_interrupted_repair_says_only_what_is_known(
    bind: bool, action_class: str | None, effects: dict[str, str], expected: Any
) -> None:
    run = repairing(bind=bind, action_class=action_class, effect_key="k" if effects else None)
    steps, abandon = plan(run, effects)
    if expected == "abandon":
        assert (steps, abandon) == ([], "repair_untracked")
        return
    repair = next(r for c, r in steps if c == "complete_repair")
    final = next(r for c, r in steps if c == "terminate")
    assert (repair["status"], final["status"]) == expected
    # The plan is executable through the normal path, in order.
    for command, request in steps:
        run(command, **request)
    assert run.state["status"] == expected[1]


def test_the_chain_binds_order_content_and_run() -> None:
    rows = []
    prev = genesis_hash("r", None)
    for seq, payload in enumerate(['{"a":1}', '{"b":2}', '{"c":3}'], start=1):
        own = event_hash(None, "r", seq, "t", prev, payload)
        rows.append((seq * 10, seq, "t", prev, own, payload))
        prev = own
    assert verify_chain("r", rows, None)[0] is None
    assert verify_chain("other-run", rows, None)[0].seq == 1  # type: ignore[union-attr]
    assert verify_chain("r", rows, b"key")[0].seq == 1  # type: ignore[union-attr]
    edited = [*rows[:1], (*rows[1][:5], '{"b":3}'), rows[2]]
    assert verify_chain("r", edited, None)[0].seq == 2  # type: ignore[union-attr]
    swapped = [rows[0], rows[2], rows[1]]
    assert verify_chain("r", swapped, None)[0].seq == 2  # type: ignore[union-attr]
    cursor_swapped = [rows[0], (25, *rows[1][1:]), (15, *rows[2][1:])]
    assert verify_chain("r", cursor_swapped, None)[0].seq == 3  # type: ignore[union-attr]
    resumed = verify_chain("r", rows[2:], None, after_seq=2, after_hash=rows[1][4], after_cursor=20)
    assert resumed[0] is None and resumed[1] == 3
    assert genesis_hash("r", b"k1") != genesis_hash("r", b"k2") != genesis_hash("r", None)
