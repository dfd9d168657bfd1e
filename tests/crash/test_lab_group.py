"""Eight threads sharing commits (``group_commit=True``), SIGKILLed before the shared commit,
after it (before any caller is released) and at random, on SQLite and PostgreSQL. The lab's
verdict is checked, and then the stores it kept are read again here, with the journal the
threads wrote: every caller's row and effect both exist or neither, and every caller that
returned is durable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oncewire.lab.fixtures import Backend, StorePair, dialect_of, with_search_path
from oncewire.lab.runner import run_lab
from oncewire.lab.suites.group import durable_callers, read_journal
from tests.support.pg import server_url

pytestmark = pytest.mark.crash

CELLS = ("before_commit", "after_commit", "random")


def _check(tmp_path: Path, evidence: dict[str, Any], backend: str) -> None:
    scenarios = evidence["suites"]["group"]["scenarios"]
    assert evidence["passed"], {name: s["failures"] for name, s in scenarios.items()}
    names = {"before_commit", "after_commit", "random_kills"}
    assert set(scenarios) == {f"{name}[{backend}]" for name in names}
    for name in ("before_commit", "after_commit"):
        assert scenarios[f"{name}[{backend}]"]["summary"]["exit_code"] == -9
    assert scenarios[f"after_commit[{backend}]"]["summary"]["durable_untold"] >= 1
    assert scenarios[f"random_kills[{backend}]"]["summary"]["kills"] >= 1
    for cell in CELLS:
        folder = tmp_path / "lab" / "group" / cell
        caller = str(folder / "caller.sqlite")
        if backend == "postgresql":
            schema = (folder / "schemas.txt").read_text().split()[0]
            caller = with_search_path(server_url(), schema)
        pair = StorePair(dialect_of(caller), caller, caller)
        operations, effects = durable_callers(pair)
        journal = read_journal(folder / "journal.txt")
        assert operations == effects, cell
        assert journal["ok"] <= operations, cell
        assert not journal["failed"] & operations, cell
        assert operations, cell


def test_group_commit_survives_sigkill_on_sqlite(tmp_path: Path) -> None:
    evidence = run_lab(["group"], directory=tmp_path / "lab", seed=3)
    _check(tmp_path, evidence, "sqlite")


def test_group_commit_survives_sigkill_on_postgresql(tmp_path: Path) -> None:
    url = server_url()
    backend = Backend("postgresql", url, run_id=f"test{tmp_path.name[-6:]}")
    lab = tmp_path / "lab"
    try:
        evidence = run_lab(["group"], directory=lab, seed=3, backend=backend)
        _check(tmp_path, evidence, "postgresql")
    finally:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            for listed in lab.glob("group/*/schemas.txt"):
                for schema in listed.read_text().split():
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]
