"""The crash lab's langgraph suite, run for real, and its kept stores read back here."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from contextlib import closing
from pathlib import Path

import pytest

from oncewire.lab.runner import run_lab

pytestmark = pytest.mark.crash


def _tickets(path: Path) -> Counter[str]:
    with closing(sqlite3.connect(path)) as db:
        return Counter(row[0] for row in db.execute("SELECT tool_call_id FROM tickets"))


# About 15 graph processes of ~2 s each: a minute and a half on a quiet machine.
@pytest.mark.timeout(600)
def test_langgraph_suite_passes_and_its_stores_agree(tmp_path: Path) -> None:
    pytest.importorskip("langgraph.checkpoint.sqlite", reason="needs the langgraph extra")
    evidence = run_lab(["langgraph"], directory=tmp_path / "lab")
    scenarios = evidence["suites"]["langgraph"]["scenarios"]
    assert evidence["passed"], json.dumps(
        {n: s["failures"] for n, s in scenarios.items() if s["failures"]}, indent=1
    )
    armed = [name for name in scenarios if name.startswith("armed[")]
    assert "armed[langgraph.tool_returned]" in armed
    assert "armed[langgraph.tools_accepted]" in armed
    for name in armed:
        assert scenarios[name]["skipped"] or scenarios[name]["summary"]["kills"] == 1, name
    assert scenarios["random_kills"]["summary"]["duplicates"] == 0

    root = tmp_path / "lab" / "langgraph"
    control = _tickets(root / "upstream" / "downstream.sqlite")
    assert max(control.values()) == 2, "the negative control lost its duplicate"
    assert control["call-4"] == 1
    for folder in ("armed-lab.langgraph.ticket_written", "armed-langgraph.tool_returned"):
        assert _tickets(root / folder / "downstream.sqlite") == Counter(
            {"call-1": 1, "call-2": 1, "call-4": 1}
        ), folder
