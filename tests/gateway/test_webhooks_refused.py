"""What the gateway's webhook server answers for a message it does not admit, end to end: a
real ``oncewire gateway run`` (:mod:`tests.gateway.push_rig`) on SQLite and PostgreSQL, POSTed
to as its platforms would, and the store read with the plain driver.

A platform delivers a POST again until it gets a 2xx. A signed message that can never be
admitted (an id with a control character, 100,000 characters long) must be a 400, never the
500 that asks for it again and again; a Telegram update the gateway chose not to admit (from a
bot, an edit, a sender outside allowed_users) is confirmed with a 200 that says it was not
admitted, and why."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire.gateway.platforms.webhook import SIGNATURE_HEADER, sign
from oncewire.gateway.webhooks import TELEGRAM_SECRET_HEADER
from tests.gateway.push_rig import HOOK_SECRET, TG_SECRET, PushRig, by_token
from tests.support import tables

pytestmark = pytest.mark.empty_store  # the gateway creates its store

ALLOWED_USER = 1001


def inbound_rows(db: str) -> list[tuple[Any, ...]]:
    """(platform, chat, platform_message_id) of every admitted message, read directly."""
    sql = "SELECT platform, chat, platform_message_id FROM oncewire_inbound ORDER BY id"
    return tables.rows(db, sql)


@pytest.fixture
def rig(tmp_path: Path, store_url: str) -> Iterator[Callable[..., PushRig]]:
    made: list[PushRig] = []

    def make(script: Any, **options: Any) -> PushRig:
        made.append(PushRig(tmp_path, script, store_url, **options))
        return made[-1]

    yield make
    for one in made:
        one.stop()


def post_signed(r: PushRig, port: int, message: dict[str, Any]) -> tuple[int, Any]:
    body = json.dumps(message).encode()
    answer = r.http.post(
        r.webhook_url(port),
        content=body,
        headers={"content-type": "application/json", SIGNATURE_HEADER: sign(HOOK_SECRET, body)},
    )
    return answer.status_code, answer.json()


NEVER_ADMITTED = [
    ({"message_id": "m\x01", "chat": "c", "text": "x"}, "U+0001"),
    ({"message_id": "m" * 100_000, "chat": "c", "text": "x"}, "100000 characters long"),
    ({"message_id": "m", "chat": "c\x1b[31m", "text": "x"}, "U+001B"),
    ({"message_id": " m", "chat": "c", "text": "x"}, "whitespace"),
    ({"message_id": "m", "chat": "c", "text": "\ud800"}, "lone surrogate"),
]


def test_a_signed_message_that_can_never_be_admitted_is_400_and_nothing_is_stored(
    rig: Callable[..., PushRig], store_url: str
) -> None:
    # It was 500 "admission failed; deliver it again": a platform that retries until it gets a
    # 2xx would have delivered it for ever.
    r = rig(by_token({"[ok]": "Admitted and answered."}))
    gateway = r.start()
    assert gateway.port is not None
    answers = [post_signed(r, gateway.port, message) for message, _ in NEVER_ADMITTED]

    assert [status for status, _ in answers] == [400] * len(NEVER_ADMITTED)
    for (_, body), (_, why) in zip(answers, NEVER_ADMITTED, strict=True):
        assert body["ok"] is False
        assert body["error"].startswith("the message can never be admitted: "), body
        assert why in body["error"], body
        assert "again" not in body["error"]
    assert inbound_rows(store_url) == []

    # The server goes on admitting: a good message after them is the store's only one.
    status, body = post_signed(r, gateway.port, {"message_id": "m", "chat": "c", "text": "[ok]"})
    assert (status, body) == (200, {"ok": True, "admitted": True})
    assert inbound_rows(store_url) == [("fk_ne", "c", "m")]
    assert gateway.terminate() == 0


def update(update_id: int, message_id: int, *, sender: int, bot: bool = False) -> dict[str, Any]:
    return {
        "update_id": update_id,
        "message": {
            "message_id": message_id,
            "date": 0,
            "chat": {"id": 5151, "type": "private"},
            "from": {"id": sender, "is_bot": bot, "first_name": "Someone"},
            "text": "[tg] hello",
        },
    }


def test_a_telegram_update_the_gateway_does_not_admit_is_answered_as_not_admitted(
    rig: Callable[..., PushRig], store_url: str
) -> None:
    # It was answered {"ok": true, "admitted": true} whatever the admission decided.
    r = rig(by_token({"[tg]": "Answered once."}), telegram=f"allowed_users = [{ALLOWED_USER}]")
    gateway = r.start()
    assert gateway.port is not None
    edited = update(3, 30, sender=ALLOWED_USER)
    edited["edited_message"] = edited.pop("message")
    refused = [
        update(1, 10, sender=ALLOWED_USER, bot=True),
        update(2, 20, sender=ALLOWED_USER + 1),
        edited,
    ]
    headers = {TELEGRAM_SECRET_HEADER: TG_SECRET}
    answers = [r.http.post(r.telegram_url(gateway.port), json=u, headers=headers) for u in refused]

    assert [(a.status_code, a.json()) for a in answers] == [
        (200, {"ok": True, "admitted": False, "reason": "from_bot"}),
        (200, {"ok": True, "admitted": False, "reason": "not_allowed"}),
        (200, {"ok": True, "admitted": False, "reason": "edit"}),
    ]
    assert inbound_rows(store_url) == []

    admitted = update(4, 40, sender=ALLOWED_USER)
    first = r.http.post(r.telegram_url(gateway.port), json=admitted, headers=headers)
    again = r.http.post(r.telegram_url(gateway.port), json=admitted, headers=headers)
    assert (first.status_code, first.json()) == (200, {"ok": True, "admitted": True})
    assert (again.status_code, again.json()) == (200, {"ok": True, "admitted": True})
    assert inbound_rows(store_url) == [("fk_tg", "5151", "40")]
    assert gateway.terminate() == 0
