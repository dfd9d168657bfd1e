"""docs/langgraph.md's example runs as shown, in a process of its own in a fresh directory,
and the stores it names hold what the page says (read with sqlite3)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.sqlite", reason="needs the langgraph extra")

ROOT = Path(__file__).resolve().parents[2]
FIRST = "import sqlite3\n\nfrom langchain_core"


def _example() -> str:
    text = (ROOT / "docs" / "langgraph.md").read_text(encoding="utf-8")
    blocks = [
        b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if b.startswith(FIRST)
    ]
    assert len(blocks) == 1
    return blocks[0]


def test_the_documented_example_runs_as_shown(tmp_path: Path, peek: Any) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", _example()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        'tool: {"ticket": 1}',
        "tool: error: the tool refused the call: refunds over 100 need a human",
        "ai: I opened a ticket; the refund needs a human.",
    ]
    assert peek(tmp_path / "agent.db", "SELECT key, state FROM oncewire_effects ORDER BY key") == [
        ("langgraph/customer-42//call-1", "done"),
        ("langgraph/customer-42//call-2", "rejected"),
    ]
    assert peek(tmp_path / "helpdesk.db", "SELECT id, title FROM tickets") == [
        (1, "printer on fire")
    ]
    assert peek(tmp_path / "helpdesk.db", "SELECT key FROM oncewire_receipts") == [
        ("langgraph/customer-42//call-1",)
    ]
