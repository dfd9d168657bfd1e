"""The Telegram adapter's classification table without sockets: recorded Bot API answers, each
transport exception (through ``httpx2.MockTransport``), and the token kept out of every text."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx2
import pytest

from oncewire.gateway.platforms.telegram import (
    BOT_BLOCKED,
    CHAT_NOT_FOUND,
    DELETE_TARGET_NOT_FOUND,
    EDIT_TARGET_NOT_FOUND,
    MESSAGE_TOO_LONG,
    NOT_MODIFIED,
    POLL_CONFLICT,
    Answer,
    BotUnauthorized,
    PollConflict,
    TelegramBot,
    TelegramUnavailable,
    classify,
)
from oncewire.gateway.platforms.telegram_updates import UpdatePoller
from oncewire.replies.wire import (
    Delivered,
    Gone,
    MaybeDelivered,
    NotDelivered,
    RejectedForGood,
    WireOutcome,
)
from oncewire.storage.replies import SendRequest

TOKEN = "987654:AAH-very-SECRET_token"
REQUEST = SendRequest("telegram", "bot", "4242", "", None)

# Answers as the Bot API gives them (descriptions as recorded from api.telegram.org).
RECORDED = {
    "not_modified": (
        400,
        {
            "ok": False,
            "error_code": 400,
            "description": "Bad Request: message is not modified: specified new message content "
            "and reply markup are exactly the same as a current content and reply markup of the "
            "message",
        },
    ),
    "edit_not_found": (
        400,
        {"ok": False, "error_code": 400, "description": "Bad Request: message to edit not found"},
    ),
    "delete_not_found": (
        400,
        {
            "ok": False,
            "error_code": 400,
            "description": "Bad Request: message to delete not found",
        },
    ),
    "chat_not_found": (
        400,
        {"ok": False, "error_code": 400, "description": "Bad Request: chat not found"},
    ),
    "blocked": (
        403,
        {"ok": False, "error_code": 403, "description": "Forbidden: bot was blocked by the user"},
    ),
    "kicked": (
        403,
        {
            "ok": False,
            "error_code": 403,
            "description": "Forbidden: bot was kicked from the supergroup chat",
        },
    ),
    "too_long": (
        400,
        {"ok": False, "error_code": 400, "description": "Bad Request: message is too long"},
    ),
    "entities": (
        400,
        {
            "ok": False,
            "error_code": 400,
            "description": "Bad Request: can't parse entities: Can't find end of the entity "
            "starting at byte offset 12",
        },
    ),
    "migrated": (
        400,
        {
            "ok": False,
            "error_code": 400,
            "description": "Bad Request: group chat was upgraded to a supergroup chat",
            "parameters": {"migrate_to_chat_id": -1001234567890},
        },
    ),
    "rate_limited": (
        429,
        {
            "ok": False,
            "error_code": 429,
            "description": "Too Many Requests: retry after 35",
            "parameters": {"retry_after": 35},
        },
    ),
    "unauthorized": (401, {"ok": False, "error_code": 401, "description": "Unauthorized"}),
    "not_found": (404, {"ok": False, "error_code": 404, "description": "Not Found"}),
    "server_error": (
        500,
        {"ok": False, "error_code": 500, "description": "Internal Server Error"},
    ),
    "conflict": (
        409,
        {
            "ok": False,
            "error_code": 409,
            "description": "Conflict: terminated by other getUpdates request; make sure that "
            "only one bot instance is running",
        },
    ),
    "sent": (
        200,
        {
            "ok": True,
            "result": {
                "message_id": 311,
                "date": 1764500000,
                "chat": {"id": 4242, "type": "private"},
                "text": "hi",
            },
        },
    ),
}


def recorded(name: str) -> Answer:
    status, body = RECORDED[name]
    return Answer(status=status, body=body)


@pytest.mark.parametrize(
    ("constant", "name"),
    [
        (NOT_MODIFIED, "not_modified"),
        (EDIT_TARGET_NOT_FOUND, "edit_not_found"),
        (DELETE_TARGET_NOT_FOUND, "delete_not_found"),
        (CHAT_NOT_FOUND, "chat_not_found"),
        (BOT_BLOCKED, "blocked"),
        (MESSAGE_TOO_LONG, "too_long"),
        (POLL_CONFLICT, "conflict"),
    ],
)
def test_each_description_prefix_matches_its_recorded_answer(constant: str, name: str) -> None:
    assert recorded(name).description.startswith(constant)


@pytest.mark.parametrize(
    ("method", "name", "expected"),
    [
        ("sendMessage", "sent", Delivered("311")),
        ("editMessageText", "not_modified", Delivered("9")),
        ("deleteMessage", "delete_not_found", Delivered("9")),
        ("sendMessage", "rate_limited", NotDelivered),
        ("editMessageText", "rate_limited", NotDelivered),
        ("sendMessage", "server_error", MaybeDelivered),
        ("editMessageText", "server_error", MaybeDelivered),
        ("editMessageText", "edit_not_found", Gone),
        ("sendMessage", "chat_not_found", RejectedForGood),
        ("sendMessage", "blocked", RejectedForGood),
        ("sendMessage", "kicked", RejectedForGood),
        ("sendMessage", "too_long", RejectedForGood),
        ("sendMessage", "migrated", RejectedForGood),
        ("editMessageText", "entities", RejectedForGood),
        ("sendMessage", "unauthorized", RejectedForGood),
        ("sendMessage", "not_found", RejectedForGood),
        # Only an edit is "not modified", only a delete finds its target already gone.
        ("sendMessage", "not_modified", RejectedForGood),
        ("editMessageText", "delete_not_found", RejectedForGood),
    ],
)
def test_each_recorded_answer_classifies_as_the_table_says(
    method: str, name: str, expected: WireOutcome | type
) -> None:
    target = None if method == "sendMessage" else "9"

    outcome = classify(method, recorded(name), message_id=target)

    if isinstance(expected, type):
        assert type(outcome) is expected
    else:
        assert outcome == expected


def test_a_rate_limit_carries_its_retry_after_and_a_missing_one_waits_a_second() -> None:
    without = Answer(status=429, body={"ok": False, "error_code": 429, "description": "Too Many"})

    assert classify("sendMessage", recorded("rate_limited")) == NotDelivered(
        "sendMessage: 429 Too Many Requests: retry after 35", retry_after=35.0
    )
    assert isinstance(outcome := classify("sendMessage", without), NotDelivered)
    assert outcome.retry_after == 1.0


def test_a_migrated_group_names_its_new_chat() -> None:
    outcome = classify("sendMessage", recorded("migrated"))

    assert outcome == RejectedForGood("sendMessage: 400 the chat moved to -1001234567890")


@pytest.mark.parametrize(
    ("status", "body"),
    [(200, {"ok": True, "result": True}), (200, None), (502, None)],
)
def test_a_send_answer_without_a_message_id_may_have_landed(
    status: int, body: dict[str, Any] | None
) -> None:
    assert isinstance(classify("sendMessage", Answer(status=status, body=body)), MaybeDelivered)


# -- transport exceptions ---------------------------------------------------------------------
def raising(exc_type: type[Exception]) -> Callable[[httpx2.Request], httpx2.Response]:
    def handler(request: httpx2.Request) -> httpx2.Response:
        raise exc_type("simulated", request=request)  # type: ignore[call-arg]

    return handler


@pytest.mark.parametrize(
    ("exc_type", "expected"),
    [
        (httpx2.ConnectError, NotDelivered),
        (httpx2.ConnectTimeout, NotDelivered),
        (httpx2.PoolTimeout, NotDelivered),
        (httpx2.ReadTimeout, MaybeDelivered),
        (httpx2.ReadError, MaybeDelivered),
        (httpx2.WriteTimeout, MaybeDelivered),
        (httpx2.WriteError, MaybeDelivered),
        (httpx2.RemoteProtocolError, MaybeDelivered),
    ],
)
@pytest.mark.parametrize("operation", ["send", "edit", "delete"])
def test_each_transport_failure_classifies_by_whether_the_request_left(
    exc_type: type[Exception], expected: type, operation: str
) -> None:
    bot = TelegramBot(TOKEN, transport=httpx2.MockTransport(raising(exc_type)))
    try:
        if operation == "send":
            outcome = bot.send(REQUEST, "hi", marked=False)
        elif operation == "edit":
            outcome = bot.edit(REQUEST, "5", "hi", marked=False)
        else:
            outcome = bot.delete(REQUEST, "5")
    finally:
        bot.close()

    assert type(outcome) is expected
    assert exc_type.__name__ in outcome.reason  # type: ignore[union-attr]
    assert outcome.retry_after is None if isinstance(outcome, NotDelivered) else True
    assert bot.usable


# -- the token --------------------------------------------------------------------------------
def test_the_token_is_on_the_wire_and_nowhere_else(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(str(request.url))
        if request.url.path.endswith("/sendMessage"):
            raise httpx2.ReadTimeout(f"timed out reading {request.url}", request=request)
        if request.url.path.endswith("/editMessageText"):
            echo = {"ok": False, "error_code": 400, "description": f"Bad Request: {request.url}"}
            return httpx2.Response(400, json=echo)
        return httpx2.Response(401, json=RECORDED["unauthorized"][1])

    caplog.set_level(logging.DEBUG)
    bot = TelegramBot(TOKEN, transport=httpx2.MockTransport(handler))
    poller = UpdatePoller(TOKEN, transport=httpx2.MockTransport(handler))
    texts = [repr(bot), repr(poller)]
    try:
        texts.append(bot.send(REQUEST, "hi", marked=False).reason)  # type: ignore[union-attr]
        texts.append(bot.edit(REQUEST, "5", "hi", marked=False).reason)  # type: ignore[union-attr]
        for call in (bot.get_me, poller.poll):
            with pytest.raises(BotUnauthorized) as raised:
                call()  # type: ignore[operator]
            texts += [str(raised.value), repr(raised.value), json.dumps(raised.value.as_dict())]
        texts.append(str(bot.unusable_reason))
    finally:
        bot.close()
        poller.close()
    texts += [record.getMessage() for record in caplog.records]
    texts += [str(record.__dict__) for record in caplog.records]

    assert len(seen) == 4 and all(f"/bot{TOKEN}/" in url for url in seen)
    assert "<token>" in texts[3]  # the echoed URL, redacted
    assert "401" in str(bot.unusable_reason)  # getMe's refusal marks the bot unusable too
    assert any("HTTP Request" in text for text in texts)  # the client's own log line is here
    assert [text for text in texts if TOKEN in text or "SECRET" in text] == []


def test_a_token_with_a_slash_or_a_space_is_refused_without_repeating_it() -> None:
    for token in ("", "123:abc/def", "123 abc"):
        with pytest.raises(ValueError) as raised:
            TelegramBot(token)
        assert token == "" or token not in str(raised.value)


# -- non-reply calls raise typed errors ---------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("conflict", PollConflict),
        ("unauthorized", BotUnauthorized),
        ("not_found", BotUnauthorized),
        ("rate_limited", TelegramUnavailable),
        ("server_error", TelegramUnavailable),
    ],
)
def test_a_failed_poll_raises_its_typed_error(name: str, error: type[Exception]) -> None:
    status, body = RECORDED[name]
    transport = httpx2.MockTransport(lambda request: httpx2.Response(status, json=body))
    poller = UpdatePoller(TOKEN, transport=transport)
    try:
        with pytest.raises(error) as raised:
            poller.poll()
    finally:
        poller.close()

    if name == "rate_limited":
        assert isinstance(raised.value, TelegramUnavailable)
        assert raised.value.retry_after == 35.0


def test_a_poll_that_cannot_connect_is_unavailable() -> None:
    poller = UpdatePoller(TOKEN, transport=httpx2.MockTransport(raising(httpx2.ConnectError)))
    try:
        with pytest.raises(TelegramUnavailable, match="ConnectError"):
            poller.poll()
    finally:
        poller.close()
