"""docs/mcp.md's example runs as shown, twice, in a process of its own in a fresh directory,
and the store it names holds what the page says (read with sqlite3)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.docs import code_block

pytest.importorskip("mcp.server.mcpserver", reason="needs the mcp extra")

ROOT = Path(__file__).resolve().parents[2]
FIRST = "import anyio\nfrom mcp import Client\n"


def _example() -> str:
    return code_block("docs/mcp.md", FIRST)


def test_the_documented_example_runs_as_shown(tmp_path: Path, peek: Any) -> None:
    printed = [
        "{'io.oncewire/deduplicates': {'version': 1}}",
        "{'ticket': 1} {'ticket': 1}",
        "True payload conflict",
    ]
    for _ in range(2):  # the second run replays the first run's ticket
        ran = subprocess.run(
            [sys.executable, "-c", _example()],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.splitlines() == printed
        assert peek(tmp_path / "helpdesk.db", "SELECT id, title FROM tickets") == [
            (1, "printer on fire")
        ]
        assert peek(tmp_path / "helpdesk.db", "SELECT key FROM oncewire_receipts") == [
            ("customer-42/printer",)
        ]


def test_the_readme_links_the_page() -> None:
    assert "(docs/mcp.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
