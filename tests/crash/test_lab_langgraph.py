"""The crash lab's langgraph suite, run for real on SQLite and on PostgreSQL, and the stores it
kept read back here with the plain drivers.

The default run takes the suite's default slice on each backend (the reference run, one armed
point per outcome class, the random kills and the negative control); the whole suite on both
backends is ``slow`` (``make soak``)."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from oncewire.lab.fixtures import Backend, rows, with_search_path
from oncewire.lab.framework import LabContext, Progress
from oncewire.lab.runner import run_lab
from oncewire.lab.suites.langgraph import DEFAULT_POINTS, all_points, run_points
from tests.support.pg import server_url

pytestmark = pytest.mark.crash

pytest.importorskip("langgraph.checkpoint.sqlite", reason="needs the langgraph extra")

THREAD = "lab-thread-1"
ONE_EACH = Counter({"call-1": 1, "call-2": 1, "call-4": 1})
# The saver's crash points, and what the lab saw of the interrupted call right after the kill.
SAVER_POINTS = {
    "langgraph.put_before_commit": "not stored",
    "langgraph.put_after_commit": "committed, the chain's head",
    "langgraph.writes_before_commit": "not stored",
    "langgraph.writes_after_commit": "committed, the chain's head",
}


def _stores(folder: Path) -> tuple[str, str, str]:
    """(dialect, caller, downstream) of a scenario folder the lab kept."""
    listed = folder / "schemas.txt"
    if listed.exists():
        caller, downstream = listed.read_text().split()
        url = server_url()
        return "postgresql", with_search_path(url, caller), with_search_path(url, downstream)
    return "sqlite", str(folder / "caller.sqlite"), str(folder / "downstream.sqlite")


def _tickets(dialect: str, downstream: str) -> Counter[str]:
    return Counter(r["tool_call_id"] for r in rows(dialect, downstream, "SELECT * FROM tickets"))


def _check(root: Path, scenarios: dict[str, Any], backend: str, points: list[str]) -> None:
    """The scenarios (by name, as the evidence writes them) of a run of ``points``, and the
    stores they kept under ``root``."""
    assert all(not s["failures"] for s in scenarios.values()), json.dumps(
        {n: s["failures"] for n, s in scenarios.items() if s["failures"]}, indent=1
    )
    armed = [name for name in scenarios if name.startswith("armed[")]
    assert armed == [f"armed[{point}]" for point in points]
    # The saver's points are reached, and each kill was seen in its window before the resume.
    for (point, landed), hit in itertools.product(SAVER_POINTS.items(), ("", "@3")):
        if point + hit not in points:
            continue
        scenario = scenarios[f"armed[{point}{hit}]"]
        assert not scenario["skipped"], point + hit
        assert scenario["summary"]["kills"] == 1, point + hit
        assert landed in (scenario["summary"]["window"] or ""), (point + hit, scenario["summary"])
    # A later put has a parent: the newest checkpoint after the kill before its commit is one.
    later = scenarios["armed[langgraph.put_before_commit@3]"]["summary"]["window"]
    assert "newest checkpoint None" not in later, later
    for point in ("langgraph.tool_returned", "lab.langgraph.before_first_checkpoint"):
        if point in points:
            assert not scenarios[f"armed[{point}]"]["skipped"], point
    for name in armed:
        assert scenarios[name]["skipped"] or scenarios[name]["summary"]["kills"] == 1, name
    durable = ["uninterrupted", "random_kills", *armed]
    for name in durable:
        summary = scenarios[name]["summary"]
        assert scenarios[name]["skipped"] or summary["backend"] == backend, name
    assert scenarios["random_kills"]["summary"]["duplicates"] == 0
    # The random kills are armed once the child is ready: they land in the run's work (the
    # run recorded, resumed after each), and some inside a tool.
    random_kills = scenarios["random_kills"]["summary"]
    assert random_kills["kills"] >= 1
    assert random_kills["run_attempts"] >= 2
    assert random_kills["kills_in_tools"] >= 1

    suite = root / "langgraph"
    control = _tickets("sqlite", str(suite / "upstream" / "downstream.sqlite"))
    assert max(control.values()) == 2, "the negative control lost its duplicate"
    assert control["call-4"] == 1
    for folder in sorted(p for p in suite.iterdir() if p.is_dir() and p.name != "upstream"):
        dialect, caller, downstream = _stores(folder)
        assert dialect == backend, folder
        assert _tickets(dialect, downstream) == ONE_EACH, folder.name
        runs = rows(dialect, caller, "SELECT thread_id, state FROM oncewire_lg_runs")
        assert [(r["thread_id"], r["state"]) for r in runs] == [(THREAD, "done")], folder.name
        states = rows(dialect, caller, "SELECT state FROM oncewire_effects")
        assert [r["state"] for r in states] == ["done"] * 4, folder.name
    # The run killed before its first checkpoint was resumed from its recorded input.
    first = suite / "armed-lab.langgraph.before_first_checkpoint"
    dialect, caller, _ = _stores(first)
    assert rows(dialect, caller, "SELECT attempts FROM oncewire_lg_runs") == [{"attempts": 2}]


def _slice(root: Path, backend: Backend, points: Sequence[str]) -> dict[str, Any]:
    """The suite's scenarios for ``points`` run into ``root``, as the evidence writes them."""
    root.mkdir()
    ctx = LabContext(root, 1, {}, Progress(enabled=False), backend, keep=True)
    return {r.name: r.as_dict() for r in run_points(ctx, points)}


@pytest.fixture
def pg_lab(tmp_path: Path) -> Iterator[Path]:
    lab = tmp_path / "lab"
    yield lab
    import psycopg

    with psycopg.connect(server_url(), autocommit=True) as conn:
        for listed in lab.glob("langgraph/*/schemas.txt"):
            for schema in listed.read_text().split():
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


def _pg(tmp_path: Path) -> Backend:
    return Backend("postgresql", server_url(), run_id=f"test{tmp_path.name[-6:]}")


@pytest.mark.timeout(900)
def test_the_default_slice_of_the_langgraph_suite_passes_on_sqlite(tmp_path: Path) -> None:
    scenarios = _slice(tmp_path / "lab", Backend(), DEFAULT_POINTS)
    _check(tmp_path / "lab", scenarios, "sqlite", list(DEFAULT_POINTS))


@pytest.mark.timeout(900)
def test_the_default_slice_of_the_langgraph_suite_passes_on_postgresql(
    tmp_path: Path, pg_lab: Path
) -> None:
    scenarios = _slice(pg_lab, _pg(tmp_path), DEFAULT_POINTS)
    _check(pg_lab, scenarios, "postgresql", list(DEFAULT_POINTS))


def _whole(root: Path, evidence: dict[str, Any], backend: str) -> None:
    scenarios = evidence["suites"]["langgraph"]["scenarios"]
    assert evidence["passed"]
    points = all_points()
    for point in ("langgraph.tools_accepted", *SAVER_POINTS):
        assert point in points, point
    _check(root, scenarios, backend, points)


# About 30 graph processes of ~4 s each (most of it importing): two to three minutes.
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_langgraph_suite_passes_on_sqlite_and_its_stores_agree(tmp_path: Path) -> None:
    evidence = run_lab(["langgraph"], directory=tmp_path / "lab")
    _whole(tmp_path / "lab", evidence, "sqlite")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_langgraph_suite_passes_on_postgresql_and_its_stores_agree(
    tmp_path: Path, pg_lab: Path
) -> None:
    evidence = run_lab(["langgraph"], directory=pg_lab, backend=_pg(tmp_path))
    _whole(pg_lab, evidence, "postgresql")
