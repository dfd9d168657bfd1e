"""The fake Bot API's own contract, spoken to in raw HTTP: Telegram's error shapes, form
bodies, a restart on the same journal, and refusals of bad control input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.conftest import _child_env
from tests.gateway.test_telegram_wire import (
    CHAT,
    TOKEN,
    FakeTelegram,
    StartFake,
    fake,
    shared_fake,
    start_fake,
)

__all__ = ["fake", "shared_fake", "start_fake"]  # the fixtures, shared with the wire tests

FAKE = [sys.executable, "-m", "oncewire.testing.telegram_api"]


def api(fake: FakeTelegram, method: str, **params: Any) -> tuple[int, dict[str, Any]]:
    answer = fake.control.post(f"/bot{TOKEN}/{method}", json=params)
    body: dict[str, Any] = answer.json()
    return answer.status_code, body


def test_a_reply_to_an_unknown_message_needs_allow_sending_without_reply(
    fake: FakeTelegram,
) -> None:
    status, body = api(
        fake, "sendMessage", chat_id=int(fake.chat), text="hi", reply_parameters={"message_id": 999}
    )

    assert (status, body) == (
        400,
        {
            "ok": False,
            "error_code": 400,
            "description": "Bad Request: message to be replied not found",
        },
    )
    assert fake.texts() == []


def test_a_reply_to_the_users_message_carries_it(fake: FakeTelegram) -> None:
    user = fake.inject(text="question")

    status, body = api(
        fake,
        "sendMessage",
        chat_id=int(fake.chat),
        text="answer",
        reply_parameters={"message_id": user["message_id"]},
    )

    assert status == 200 and body["ok"] is True
    message = body["result"]
    assert message["reply_to_message"]["message_id"] == user["message_id"]
    assert message["chat"] == {"id": int(fake.chat), "type": "private"}
    assert message["from"]["is_bot"] is True and message["text"] == "answer"


def test_the_general_topic_cannot_be_named(fake: FakeTelegram) -> None:
    status, body = api(fake, "sendMessage", chat_id=int(fake.chat), text="hi", message_thread_id=1)

    assert status == 400 and body["description"] == "Bad Request: message thread not found"


def test_a_form_body_and_a_method_name_in_any_case_are_understood(fake: FakeTelegram) -> None:
    answer = fake.control.post(
        f"/bot{TOKEN}/SENDMESSAGE", data={"chat_id": fake.chat, "text": "from a form"}
    )

    assert answer.status_code == 200 and answer.json()["result"]["text"] == "from a form"
    assert fake.texts() == ["from a form"]


@pytest.mark.parametrize(
    ("path", "status", "description"),
    [
        (f"/bot{TOKEN}/sendSticker", 404, "Not Found"),
        ("/bot1:other/getMe", 401, "Unauthorized"),
        ("/elsewhere", 404, "Not Found"),
    ],
)
def test_unknown_methods_and_tokens_answer_as_telegram_does(
    fake: FakeTelegram, path: str, status: int, description: str
) -> None:
    answer = fake.control.post(path, json={})

    assert answer.status_code == status
    assert answer.json() == {"ok": False, "error_code": status, "description": description}


def test_a_chat_action_needs_a_known_chat_and_an_action(fake: FakeTelegram) -> None:
    assert api(fake, "sendChatAction", chat_id=int(fake.chat), action="typing") == (
        200,
        {"ok": True, "result": True},
    )
    assert api(fake, "sendChatAction", chat_id=1, action="typing")[0] == 400
    assert api(fake, "sendChatAction", chat_id=int(fake.chat))[0] == 400


def test_a_restarted_fake_numbers_on_from_its_journal_and_still_shows_the_chat(
    start_fake: StartFake, tmp_path: Path
) -> None:
    first = start_fake(directory=tmp_path / "tg")
    first.inject()
    _, sent = api(first, "sendMessage", chat_id=int(CHAT), text="before")
    first.stop()

    second = start_fake(directory=tmp_path / "tg")
    _, edited = api(
        second,
        "editMessageText",
        chat_id=int(CHAT),
        message_id=sent["result"]["message_id"],
        text="edited after the restart",
    )
    _, again = api(second, "sendMessage", chat_id=int(CHAT), text="after")

    assert edited["ok"] is True
    assert again["result"]["message_id"] > sent["result"]["message_id"]
    assert second.texts() == ["edited after the restart", "after"]


def test_a_fault_with_an_unknown_key_is_refused_naming_it(fake: FakeTelegram) -> None:
    answer = fake.control.post("/control/fault", json={"kind": "timeout", "target": "footer"})

    assert answer.status_code == 400 and "target" in answer.json()["error"]


def test_an_unknown_fault_kind_is_refused(fake: FakeTelegram) -> None:
    answer = fake.control.post("/control/fault", json={"kind": "explode"})

    assert answer.status_code == 400 and "explode" in answer.json()["error"]


def test_a_fault_fires_as_often_as_armed_and_is_journaled(fake: FakeTelegram) -> None:
    fake.fault("rate_limit", op="send", times=2, name="twice")

    statuses = [api(fake, "sendMessage", chat_id=int(fake.chat), text="x")[0] for _ in range(3)]

    fired = [f for f in fake.call("state")["faults_fired"] if f[0] == "twice"]
    assert statuses == [429, 429, 200]
    assert fired == [["twice", "rate_limit", "send"]] * 2


def test_a_blackout_cannot_be_armed_at_start(tmp_path: Path) -> None:
    spec = json.dumps({"kind": "conn_error"})
    done = subprocess.run(
        [*FAKE, "--journal", str(tmp_path), "--token", TOKEN, "--fault", spec],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert done.returncode == 2 and "blackout" in done.stderr


def test_an_injected_edit_needs_a_message_it_edits(fake: FakeTelegram) -> None:
    answer = fake.control.post(
        "/control/inject", json={"chat_id": 1, "text": "x", "message_id": 5, "edited": True}
    )

    assert answer.status_code == 400 and "no user message 5" in answer.json()["error"]


def test_the_control_routes_answer_unknown_actions(fake: FakeTelegram) -> None:
    answer = httpx2.post(f"{fake.base}/control/reconnect", json={})

    assert answer.status_code == 404
