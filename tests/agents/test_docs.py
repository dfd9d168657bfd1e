"""The examples of docs/agents.md run as shown, in a child process in a fresh folder, and twice:
the second run answers from the record (nothing asked of the model, no second ticket). The MCP
example runs through a real ``oncewire mcp proxy`` and docs/mcp.md's server."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs import code_block, code_blocks


def _example() -> str:
    return code_blocks("docs/agents.md")[0]


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


def _block(page: str, first: str) -> str:
    return code_block(f"docs/{page}", first)


def test_the_documented_mcp_example_runs_as_shown_through_the_proxy(tmp_path: Path) -> None:
    pytest.importorskip("mcp.server.mcpserver", reason="needs the mcp extra")
    # helpdesk.py is docs/mcp.md's server, "ending with server.run("stdio") instead of the
    # client part", as both pages say.
    server = _block("mcp.md", "import anyio\nfrom mcp import Client\n")
    server = server[: server.index("\n\nasync def main(")] + '\n\nserver.run("stdio")\n'
    (tmp_path / "helpdesk.py").write_text(server, encoding="utf-8")
    clerk = _block("agents.md", "# clerk.py, beside helpdesk.py")
    env = dict(os.environ)  # `oncewire` and `python` are this interpreter's
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    for _ in range(2):  # the second run is answered from the record
        done = subprocess.run(
            [sys.executable, "-c", clerk],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "Ticket opened."
    key = "agents/ticket-42/call-1"
    for db, kind in (("agent.db", "agents.tool"), ("mcp.db", "mcp.helpdesk.create_ticket")):
        with sqlite3.connect(tmp_path / db) as conn:
            assert conn.execute("SELECT key, kind, state FROM oncewire_effects").fetchall() == [
                (key if db == "agent.db" else f"mcp/{key}", kind, "done")
            ]
    with sqlite3.connect(tmp_path / "helpdesk.db") as conn:
        assert conn.execute("SELECT id, title FROM tickets").fetchall() == [(1, "printer on fire")]
        assert conn.execute("SELECT key FROM oncewire_receipts").fetchall() == [(f"mcp/{key}",)]
