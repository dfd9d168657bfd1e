"""``oncewire inbound`` and ``oncewire replies`` read what the ledger recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oncewire.cli import main
from oncewire.lab.suites.replies_rig import Rig, footer, reply_text
from oncewire.testing import ManualClock
from oncewire.testing.fake_platform import Fault


@pytest.fixture
def db(tmp_path: Path) -> str:
    faults = [Fault("ack_lost", contains=footer("A-cli"))]
    with Rig(tmp_path / "rig", clock=ManualClock(), faults=faults) as rig:
        admission = rig.admit("fk_tg", "chat-1", "in-1")
        rig.answer(admission.inbound.id, reply_text("A-cli", "listed."))
    return str(tmp_path / "rig" / "app.db")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


def test_inbound_list_and_show(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    rows = json.loads(run(capsys, "inbound", "list", "--db", db, "--json"))
    assert [(r["chat"], r["status"]) for r in rows] == [("chat-1", "delivered")]
    shown = json.loads(run(capsys, "inbound", "show", "--db", db, str(rows[0]["id"]), "--json"))
    assert shown["reply"] == 1
    assert "delivered" in run(capsys, "inbound", "list", "--db", db, "--status", "delivered")


def test_replies_list_show_and_counts(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    rows = json.loads(run(capsys, "replies", "list", "--db", db, "--json"))
    assert rows[0]["state"] == "delivered" and rows[0]["marked"] is True
    shown = json.loads(run(capsys, "replies", "show", "--db", db, "1", "--json"))
    assert [(o["kind"], o["state"], o["marked"]) for o in shown["ops"]] == [
        ("send", "ambiguous", False),
        ("send", "acked", True),
    ]
    assert "ambiguous" in run(capsys, "replies", "show", "--db", db, "1")
    assert json.loads(run(capsys, "replies", "counts", "--db", db, "--json"))["delivered"] == 1


def test_a_missing_reply_is_one_error_line(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replies", "show", "--db", db, "99"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "error: no reply 99 [reply_not_found]"
