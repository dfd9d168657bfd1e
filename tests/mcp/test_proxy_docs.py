"""docs/mcp.md's proxy example runs as shown: its server (``pay.py``) and its client
(``client.py``, which starts ``oncewire mcp proxy`` in front of the server, the ``oncewire``
command found on the ``PATH`` as a user's install puts it there) are cut out of the page and
run in a fresh directory, twice; the client prints what the page says it prints, the server's
side effect happened once, and the store holds what the page says (read with sqlite3). The
page's neighbours link it and name the command."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

from tests.support.docs import code_block

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "mcp.md"


def _block(language: str, first_line: str) -> str:
    return code_block(PAGE, first_line, language)


def test_the_proxy_example_runs_as_shown(tmp_path: Path) -> None:
    (tmp_path / "pay.py").write_text(_block("python", "# pay.py"), encoding="utf-8")
    (tmp_path / "client.py").write_text(_block("python", "# client.py"), encoding="utf-8")
    printed = _block("text", "False charged 500 for A-1\n").splitlines()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONCEWIRE_", "PYTHON"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for _ in range(2):  # the second run: a new proxy and server, answered from calls.db
        ran = subprocess.run(
            [sys.executable, "client.py"],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.splitlines() == printed
        assert (tmp_path / "charges.txt").read_text() == "A-1 500\n"
        with closing(sqlite3.connect(tmp_path / "calls.db")) as db:
            rows = db.execute(
                "SELECT key, kind, state, maybe_sent FROM oncewire_effects ORDER BY id"
            ).fetchall()
        assert rows == [
            ("A-1/charge", "mcp.pay.charge", "done", 0),
            ("A-1/refund", "mcp.pay.refund", "dead", 1),
        ]


def test_the_readme_and_the_cli_page_lead_to_the_proxy() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/mcp.md)" in readme
    assert "(docs/agents.md)" in readme
    cli_page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "oncewire mcp proxy" in cli_page
    assert "(mcp.md#the-durable-proxy-oncewire-mcp-proxy)" in cli_page
    page = PAGE.read_text(encoding="utf-8")
    assert "## The durable proxy: `oncewire mcp proxy`" in page  # the anchor above
    assert "To be filled in" not in page and "Outline" not in page
