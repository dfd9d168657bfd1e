"""The examples of docs/agents.md run as shown, in a child process in a fresh folder, and twice:
the second run answers from the record (nothing asked of the model, no second ticket). The MCP
example runs through a real ``oncewire mcp proxy`` and docs/mcp.md's server. The example with a
real model needs a key, so it is not run: it is checked to be the scripted one with its model
swapped."""

from __future__ import annotations

import ast
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


def _statements(code: str) -> dict[str, str]:
    """The example's top-level statements by what they bind or do, as AST dumps."""
    found: dict[str, str] = {}
    for node in ast.parse(code).body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = ast.dump(node)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = ast.dump(node.value)
        else:
            found.setdefault("other", "")
            found["other"] += ast.dump(node)
    return found


def test_the_real_model_example_is_the_scripted_one_with_its_model_swapped() -> None:
    scripted = _statements(_example())
    real = _statements(_block("agents.md", "# The same clerk with a real model"))
    # The tool, the receiver, the ledger and the durable run are the scripted example's.
    for name in ("open_ticket", "receipts", "ledger", "result"):
        assert real[name] == scripted[name], name
    assert "model" not in real  # no script
    agent = ast.parse(_block("agents.md", "# The same clerk with a real model"))
    [call] = [
        node.value
        for node in agent.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "agent"
    ]
    assert isinstance(call, ast.Call)
    keywords = {k.arg: k.value for k in call.keywords}
    assert isinstance(keywords["model"], ast.Constant) and keywords["model"].value == "gpt-5-mini"
    scripted_agent = ast.parse(_example())
    [scripted_call] = [
        node.value
        for node in scripted_agent.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "agent"
    ]
    assert isinstance(scripted_call, ast.Call)
    others = {k.arg: ast.dump(k.value) for k in scripted_call.keywords if k.arg != "model"}
    assert {k: ast.dump(v) for k, v in keywords.items() if k != "model"} == others


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
