"""``oncewire gateway status`` on what a real gateway left in its store (SQLite and PostgreSQL),
read through the real command line and checked against the rows themselves."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from oncewire.inbound import InboundState
from oncewire.replies import ReplyState
from tests.conftest import _child_env, wait_for
from tests.gateway.push_rig import TG, PushRig, by_token
from tests.support.tables import rows

pytestmark = pytest.mark.empty_store  # the gateway creates its store

ANSWER = "An answer nobody will see."


def status(db: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oncewire", "gateway", "status", "--db", db, *options],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_reply_given_up_for_good_is_counted_dead_not_as_still_being_delivered(
    tmp_path: Path, store_url: str
) -> None:
    # A message in a chat the Bot API does not know: every send is "chat not found", refused
    # for good, so the reply ends dead. It was counted answered_not_delivered, like a reply
    # still on its way.
    r = PushRig(tmp_path, by_token({"[gone]": ANSWER}), store_url)
    try:
        gateway = r.start()
        assert gateway.port is not None
        update = {
            "update_id": 1,
            "message": {
                "message_id": 5,
                "date": 0,
                "chat": {"id": 777, "type": "private"},
                "from": {"id": 1001, "is_bot": False, "first_name": "User"},
                "text": "[gone] are you there?",
            },
        }
        assert r.post_update(gateway.port, update) == 200

        def dead() -> bool:
            return rows(store_url, "SELECT state FROM oncewire_replies") == [(ReplyState.DEAD,)]

        wait_for(dead, timeout=60, what="the reply given up")
        assert gateway.terminate() == 0
    finally:
        r.stop()
    # The rows: the answer was committed, its delivery given up, the message left answered.
    assert rows(store_url, "SELECT status FROM oncewire_inbound") == [(InboundState.ANSWERED,)]
    (error,) = rows(store_url, "SELECT last_error FROM oncewire_replies")
    assert "chat not found" in error[0]

    ran = status(store_url, "--json")
    assert ran.returncode == 0, ran.stderr
    (session,) = json.loads(ran.stdout)["sessions"]
    assert (session["platform"], session["chat"]) == (TG, "777")
    assert {k: session[k] for k in ("answered_not_delivered", "scheduled", "dead")} == {
        "answered_not_delivered": 0,
        "scheduled": 0,
        "dead": 1,
    }
    shown = status(store_url)
    assert shown.returncode == 0, shown.stderr
    header, line = shown.stdout.splitlines()
    # Columns by where their heading starts (empty cells, like the thread's, are blanks).
    starts = [(m.group(), m.start()) for m in re.finditer(r"\S+", header)]
    ends = [start for _, start in starts[1:]] + [len(line)]
    cells = {name: line[start:end].strip() for (name, start), end in zip(starts, ends, strict=True)}
    assert (cells["ANSWERED_NOT_DELIVERED"], cells["DEAD"]) == ("0", "1")
