"""A run's action accepts its effect through the outbox's one accept path: the same limits,
the same ``max_payload_bytes``, the same conflicts and the same crash point as
``ledger.transaction().accept``; a refused effect leaves neither the proposal nor the effect.
Also: what the run ledger returns is its own records (a fork's Branch, the stored reports)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from oncewire import ConfigurationError, Ledger, PayloadConflict
from oncewire.errors import InvalidPayload, KindConflict
from oncewire.runs import Branch, ReconcileReport
from oncewire.testing import ManualClock
from tests.contract.conftest import RawDatabase

E = "e" * 64


def propose(ledger: Ledger, action: str, kind: str, payload: Any, *, key: str = "") -> Any:
    return ledger.runs.review.propose_action(
        "r1",
        key=key or f"propose-{action}",
        action_id=action,
        kind="tool",
        arguments={},
        side_effect_class="external",
        effect_key=f"effect-{action}",
        dispatch=(kind, payload),
    )


def stored(raw: RawDatabase) -> tuple[int, int, int]:
    return (
        raw.count("oncewire_run_events"),
        raw.count("oncewire_run_actions"),
        raw.count("oncewire_effects"),
    )


@pytest.fixture
def small(store_url: str, clock: ManualClock) -> Any:
    with Ledger(store_url, clock=clock, max_payload_bytes=64) as opened:
        opened.runs.start("r1", key="start", scope="s1", owner="w")
        yield opened


def test_an_action_effect_over_the_ledgers_payload_limit_is_refused_with_nothing_written(
    small: Ledger, raw: RawDatabase
) -> None:
    before = stored(raw)
    with pytest.raises(InvalidPayload, match="64"):
        propose(small, "a1", "charge", {"blob": "x" * 100})
    assert stored(raw) == before
    propose(small, "a2", "charge", {"blob": "x"})  # within the limit: accepted
    assert raw.effect_row("effect-a2")["kind"] == "charge"


@pytest.mark.parametrize(
    ("kind", "problem"),
    [("k" * 129, "at most 128"), (" charge", "whitespace"), ("", "empty")],
    ids=["kind-too-long", "edge-whitespace", "empty"],
)
def test_an_action_effect_kind_follows_the_outbox_rules(
    ledger: Ledger, raw: RawDatabase, kind: str, problem: str
) -> None:
    ledger.runs.start("r1", key="start", scope="s1", owner="w")
    before = stored(raw)
    with pytest.raises(ConfigurationError):
        propose(ledger, "a1", kind, {"n": 1})
    assert stored(raw) == before
    with pytest.raises(ConfigurationError):  # what the outbox itself says of that kind
        ledger.accept("plain-key", kind, {"n": 1})


def test_an_action_effect_under_a_key_bound_to_another_kind_is_a_kind_conflict(
    ledger: Ledger, raw: RawDatabase
) -> None:
    ledger.runs.start("r1", key="start", scope="s1", owner="w")
    ledger.accept("effect-a1", "email", {"n": 1})
    before = stored(raw)
    with pytest.raises(KindConflict):
        propose(ledger, "a1", "charge", {"n": 1})
    with pytest.raises(PayloadConflict):
        propose(ledger, "a1", "email", {"n": 2})
    assert stored(raw) == before
    propose(ledger, "a1", "email", {"n": 1})  # the same effect again: linked, not duplicated
    assert stored(raw) == (before[0] + 1, before[1] + 1, before[2])


PROPOSE = """
import sys
from oncewire import Ledger
with Ledger(sys.argv[1]) as ledger:
    ledger.runs.start("r1", key="start", scope="s1", owner="w")
    print("started", flush=True)
    ledger.runs.review.propose_action(
        "r1", key="p1", action_id="a1", kind="tool", arguments={},
        side_effect_class="external", effect_key="effect-a1", dispatch=("charge", {"n": 1}),
    )
print("proposed", flush=True)
"""


@pytest.mark.crash
@pytest.mark.parametrize("armed", [True, False], ids=["killed-before-commit", "not-armed"])
def test_an_action_effect_hits_the_outbox_crash_point_and_is_all_or_nothing(
    store_url: str,
    raw: RawDatabase,
    python_child: Callable[..., subprocess.Popen[str]],
    child_env: Callable[..., dict[str, str]],
    armed: bool,
) -> None:
    extra = {"ONCEWIRE_CRASH": "effects.accept_before_commit"} if armed else {}
    child = python_child(PROPOSE, store_url, env=child_env(**extra))
    out, err = child.communicate(timeout=60)
    if armed:
        assert child.returncode == -signal.SIGKILL, err
        assert out == "started\n"
        assert stored(raw) == (1, 0, 0)  # the start only: no proposal, no effect
    else:
        assert child.returncode == 0, err
        assert out == "started\nproposed\n"
        assert stored(raw) == (2, 1, 1)


def test_a_fork_returns_a_branch_record(ledger: Ledger) -> None:
    ledger.runs.start("r1", key="start", scope="s1", owner="w")
    checkpoint = ledger.runs.checkpoint("cp", scope="s1")
    branch = ledger.runs.fork(scope="s1", checkpoint_id="cp", branch="b")
    assert isinstance(branch, Branch)
    assert (branch.scope, branch.branch, branch.parent) == ("s1", "b", "s1")
    assert branch.segments == [("s1", 0, checkpoint.cursor), ("b", 0, None)]
    assert ledger.runs.fork(scope="s1", checkpoint_id="cp", branch="b") == branch  # a replay


def test_reports_are_reconcile_reports_as_stored(
    ledger: Ledger, clock: ManualClock, raw: RawDatabase
) -> None:
    ledger.runs.start("r1", key="start", scope="s1", owner="dead", lease_seconds=10)
    clock.advance(60)
    (swept,) = ledger.runs.reconcile(owner="sweeper")
    (report,) = ledger.runs.reports()
    assert isinstance(report, ReconcileReport)
    (row,) = raw.query(
        "SELECT pass_id, owner, outcome, status, created_at FROM oncewire_run_reports"
    )
    assert (
        report.pass_id,
        report.owner,
        report.outcome,
        report.status,
        report.created_at,
    ) == tuple(row)
    assert (report.subject, report.subject_id, report.outcome) == (
        swept.subject,
        swept.subject_id,
        swept.outcome,
    )
