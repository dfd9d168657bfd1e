"""``oncewire gateway demo`` as a newcomer runs it: a child process, no token, and what it kept
with ``--keep`` read back here (the fake's chat journal and the store)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from click.testing import CliRunner

from oncewire.cli.gateway_demo import ANSWER, demo
from oncewire.lab import gateway_rig
from oncewire.testing.fake_platform import ChatView
from tests.conftest import _child_env

pytestmark = pytest.mark.crash


def _demo(*options: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oncewire", "gateway", "demo", *options],
        cwd=cwd,
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=100,
    )


def test_the_demo_answers_once_through_a_sigkill_and_keeps_its_evidence(tmp_path: Path) -> None:
    keep = tmp_path / "demo"
    ran = _demo("--keep", str(keep))

    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    assert any(line.startswith("verdict: answered once, no duplicate") for line in lines)
    assert "   the gateway exited with -9" in lines  # a real SIGKILL, not a drain
    # The user saw the preview before the kill and the complete answer after the restart.
    assert ran.stdout.index("SIGKILL") < ran.stdout.index("starts again")
    # What the user sees, from the journal the demo kept: one message, unmarked, complete.
    shown = ChatView([keep / "telegram" / "chat.jsonl"]).visible("fk_tg")
    assert [m.text for m in shown] == [ANSWER]
    assert shown[0].edits >= 1  # the preview message was edited into the answer
    with closing(sqlite3.connect(keep / "gateway.db")) as db:
        inbound = db.execute("SELECT status, attempts FROM oncewire_inbound").fetchall()
        replies = db.execute("SELECT state, final_text, marked FROM oncewire_replies").fetchall()
    assert inbound == [("delivered", 2)]
    assert replies == [("delivered", ANSWER, 0)]
    assert (keep / "gateway.toml").exists() and (keep / "gateway-1.log").exists()


def test_the_demo_keeps_its_evidence_in_a_relative_folder_as_documented(tmp_path: Path) -> None:
    # `--keep ./demo` wrote "demo/gateway.db" into demo/gateway.toml, which resolves its paths
    # against its own folder: demo/demo/gateway.db, which cannot be opened, and the demo failed
    # with "the gateway did not start: ''".
    ran = _demo("--keep", "./demo", cwd=tmp_path)

    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert any(line.startswith("verdict: answered once") for line in ran.stdout.splitlines())
    keep = tmp_path / "demo"
    assert sorted(p.name for p in keep.iterdir() if p.suffix == ".db") == ["gateway.db"]
    assert not (keep / "demo").exists()
    with closing(sqlite3.connect(keep / "gateway.db")) as db:
        assert db.execute("SELECT status FROM oncewire_inbound").fetchall() == [("delivered",)]
    # What the demo's help says to run next, from the same folder, finds the same store.
    status = subprocess.run(
        [sys.executable, "-m", "oncewire", "gateway", "status", "--db", "./demo/gateway.db"],
        cwd=tmp_path,
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    assert status.stdout.strip() == "nothing pending: every message is answered and delivered"


def test_a_gateway_that_exits_before_it_is_ready_is_said_with_its_code_and_error(
    tmp_path: Path,
) -> None:
    # A store that cannot be opened (its path is a folder): the gateway prints its error and
    # exits before "ready"; the rig's error says so instead of "did not start: ''".
    folder = tmp_path / "rig"
    (tmp_path / "a-folder.db").mkdir()
    rig = gateway_rig.GatewayRig(folder, str(tmp_path / "a-folder.db"), [])
    with rig, pytest.raises(gateway_rig.RigError) as caught:
        rig.start()
    message = str(caught.value)
    first = message.splitlines()[0]
    assert first.startswith("the gateway exited with code ")
    assert "before it was ready" in first
    assert "a-folder.db" in message and "store_unusable" in message
    assert "''" not in message


def test_the_demo_refuses_a_directory_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("mine", encoding="utf-8")
    ran = _demo("--keep", str(tmp_path))

    assert ran.returncode == 2
    assert "is not empty" in ran.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["something"]


def test_without_the_gateway_extra_the_demo_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(gateway_rig, "GATEWAY_EXTRA", ("httpx2", "not_an_installed_module"))
    ran = CliRunner().invoke(demo, ["--keep", str(tmp_path / "demo")])

    assert ran.exit_code == 1
    assert (
        "needs the 'gateway' extra: pip install 'oncewire[gateway]' (not_an_installed_module "
        "not installed)" in ran.output
    )
    assert not (tmp_path / "demo").exists()  # nothing was started
