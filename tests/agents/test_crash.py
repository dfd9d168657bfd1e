"""The agents lab suite's scenarios, run here on SQLite and on PostgreSQL: a real child process
running a durable Agents SDK run, SIGKILLed (at a crash point, or from outside at random), then
started again with the same run_key until it ends, judged by the suite's own verdict from the
stores (:mod:`oncewire.lab.suites.agents_checks`).

A scenario is written once, in the lab (:func:`oncewire.lab.suites.agents.scenarios`). The
default run has one scenario per outcome class on each backend (:data:`DEFAULT_CELLS`: a kill
before the tool ran, replayed; one after it may have acted, redelivered and kept from acting
twice by the receipt; one after its effect ended, answered from the record; and the plain
Runner's duplicate, the negative control, on SQLite), spread over the sync, async and streamed
modes; the whole matrix runs with ``--soak`` (``make soak``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncewire.lab.fixtures import Backend
from oncewire.lab.forking import Forker
from oncewire.lab.framework import LabContext
from oncewire.lab.suites.agents import CHILD, DEFAULT_CELLS, Scenario, run_scenario, scenarios
from oncewire.lab.suites.agents_checks import OUTCOMES
from tests.support.pg import server_url

pytestmark = pytest.mark.crash


def _default(backend: str, scenario: Scenario) -> bool:
    # The control's SDK Runner keeps nothing in the ledger: on PostgreSQL only the receiver
    # moves, so its default cell is SQLite's.
    return scenario.name in DEFAULT_CELLS and (backend == "sqlite" or scenario.kind != "control")


CELLS = [
    pytest.param(
        backend,
        s,
        id=f"{backend}-{s.name}",
        marks=() if _default(backend, s) else pytest.mark.slow,
    )
    for backend in ("sqlite", "postgresql")
    for s in scenarios()
]


def test_the_default_cells_cover_every_outcome_class_and_mode() -> None:
    chosen = [s for s in scenarios() if s.name in DEFAULT_CELLS]
    assert len(chosen) == len(DEFAULT_CELLS)
    assert {s.outcome for s in chosen} == {*OUTCOMES, None}
    assert {s.mode for s in chosen} == {"sync", "async", "streamed", "plain"}


@pytest.fixture(scope="module")
def forker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forker]:
    """One warm parent per module and worker: the SDK imported once, each run forked."""
    warm = Forker(CHILD, tmp_path_factory.mktemp("agents-forker") / "forker.log")
    try:
        yield warm
    finally:
        warm.close()


@pytest.fixture
def lab(backend: str, tmp_path: Path) -> Iterator[LabContext]:
    chosen = Backend()
    if backend == "postgresql":
        chosen = Backend("postgresql", server_url(), run_id=f"agents-{tmp_path.name[-6:]}")
    ctx = LabContext(tmp_path / "lab", seed=1, backend=chosen)
    try:
        yield ctx
    finally:
        ctx.cleanup()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("backend", "scenario"), CELLS)
def test_a_killed_run_resumes_with_nothing_twice(
    lab: LabContext, forker: Forker, scenario: Scenario
) -> None:
    result = run_scenario(lab, forker, scenario)
    evidence = result.as_dict()
    assert result.skipped is None, result.skipped
    assert result.passed, json.dumps(
        {"failures": evidence["failures"], "summary": evidence["summary"]}, indent=1
    )
    summary = result.summary
    assert summary["backend"] == lab.backend.name
    if scenario.kind == "control":
        assert summary["duplicates"] >= 1  # the duplicate the durable runs never have
        return
    assert summary["duplicates"] == 0
    if scenario.kind == "armed":
        assert [p.exit_code for p in result.processes] == [-9, 0]
    if scenario.mode == "streamed" and scenario.outcome == "replayed":
        # Killed after the second step was recorded: the resumed stream shows the two recorded
        # steps as one completed response each, and streams the third live.
        assert (summary["replayed_steps"], summary["live_steps"]) == (2, 1)
