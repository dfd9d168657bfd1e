"""The example of docs/agents.md runs as shown, in a child process in a fresh folder, and twice:
the second run answers from the record (nothing asked of the model, no second ticket)."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _example() -> str:
    page = (ROOT / "docs" / "agents.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", page, re.S)[0]


def test_the_documented_example_runs_as_shown(tmp_path: Path) -> None:
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", _example()],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "Ticket opened."
    with sqlite3.connect(tmp_path / "receiver.db") as conn:
        assert conn.execute("SELECT key FROM oncewire_receipts").fetchall() == [
            ("agents/ticket-42/call-1",)
        ]
    with sqlite3.connect(tmp_path / "agent.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM oncewire_agent_steps").fetchone() == (2,)
