"""Bad input to the run ledger gets a typed error and leaves the store untouched (on both
backends)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from oncewire import Ledger
from oncewire.core.errors import (
    BranchBusy,
    ConfigurationError,
    InvalidPayload,
    RevertBarrierHeld,
    RunConflict,
    RunNotFound,
    TransitionRefused,
)
from oncewire.testing import ManualClock
from tests.support.runs_db import RunsDatabase


@pytest.fixture
def db(store_url: str) -> Iterator[RunsDatabase]:
    opened = RunsDatabase(store_url)
    yield opened


@pytest.fixture
def ledger(db: RunsDatabase) -> Iterator[Ledger]:
    opened = Ledger(db.url, clock=ManualClock())
    try:
        opened.runs.start("r", key="start", scope="s", owner="w")
        yield opened
    finally:
        opened.close()


def snapshot(db: RunsDatabase) -> list[tuple[object, ...]]:
    tables = [
        "oncewire_runs",
        "oncewire_run_events",
        "oncewire_run_actions",
        "oncewire_run_branches",
        "oncewire_run_checkpoints",
        "oncewire_run_barriers",
    ]
    return [
        tuple(row)
        for table in tables
        for row in sorted(db.query(f"SELECT * FROM {table}"), key=repr)
    ]


def test_bad_requests_are_typed_errors_that_write_nothing(ledger: Ledger, db: RunsDatabase) -> None:
    runs = ledger.runs
    before = snapshot(db)
    with pytest.raises(InvalidPayload):
        runs.review.propose_action(
            "r",
            key="nan",
            action_id="a",
            kind="k",
            arguments={"x": float("nan")},
            side_effect_class="external",
        )
    with pytest.raises(TransitionRefused):
        runs.review.propose_action(
            "r", key="cls", action_id="a", kind="k", arguments={}, side_effect_class="magic"
        )
    with pytest.raises(TransitionRefused):
        runs.review.terminate("r", key="t", status="running", reason="not a terminal")
    with pytest.raises(TransitionRefused):
        runs.review.resolve_action("r", key="res", action_id="never-proposed", status="succeeded")
    with pytest.raises(TransitionRefused):
        runs.review.complete_review("r", key="cr", review_id="none", verdict="pass")
    with pytest.raises(ConfigurationError):
        runs.review.terminate("r", key="", status="failed", reason="x")
    with pytest.raises(ConfigurationError):
        runs.start("r2", key="k", scope="s2", workflow_name="no-such-workflow")
    with pytest.raises(RunNotFound):
        runs.review.terminate("nope", key="t", status="failed", reason="x")
    with pytest.raises(RunNotFound):
        runs.get("nope")
    with pytest.raises(BranchBusy):
        runs.start("r2", key="k", scope="s")
    with pytest.raises(RunNotFound):
        runs.revert(scope="s", checkpoint_id="missing")
    with pytest.raises(ConfigurationError):
        runs.hold(scope="s", operation_id="op", state="paused")
    assert snapshot(db) == before


def test_checkpoints_forks_and_holds_are_idempotent_and_exclusive(ledger: Ledger) -> None:
    runs = ledger.runs
    first = runs.checkpoint("cp", scope="s", reason="r")
    assert runs.checkpoint("cp", scope="s", reason="r") == first
    runs.fork(scope="s", checkpoint_id="cp", branch="b")
    runs.fork(scope="s", checkpoint_id="cp", branch="b")  # the same fork again: a no-op
    runs.review.propose_action(
        "r", key="p", action_id="a", kind="read", arguments={}, side_effect_class="read_only"
    )
    runs.checkpoint("cp-2", scope="s", reason="later")
    with pytest.raises(RunConflict):
        runs.fork(scope="s", checkpoint_id="cp-2", branch="b")
    runs.hold(scope="s", operation_id="op-1")
    with pytest.raises(RevertBarrierHeld):
        runs.hold(scope="s", operation_id="op-2")
    runs.release_hold(scope="s", operation_id="op-1")
    runs.hold(scope="s", operation_id="op-2", state="recovery_required")
    with pytest.raises(TransitionRefused):
        runs.hold(scope="s", operation_id="op-1", state="reverting")  # resolved stays resolved


def test_a_delivery_key_is_bound_to_its_message(ledger: Ledger) -> None:
    deliveries = ledger.runs.deliveries
    first = deliveries.commit("d", scope="s", content="hello", manifest={"artifacts": []})
    assert deliveries.commit("d", scope="s", content="hello", manifest={"artifacts": []}) == first
    with pytest.raises(RunConflict):
        deliveries.commit("d", scope="s", content="changed", manifest={"artifacts": []})
    with pytest.raises(TransitionRefused):
        deliveries.commit(
            "e", scope="s", content="x", manifest={}, expected_manifest_sha256="0" * 64
        )
    published = deliveries.publish(first.delivery_id)
    assert published.status == "published" and published.content == "hello"
    assert deliveries.publish(first.delivery_id) == published
