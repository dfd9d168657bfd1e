"""The Telegram adapter against the fake Bot API as a real child process on loopback: every
row of the classification table the wire can produce, and what the user sees (ChatView)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from oncewire.gateway.http import Timeouts
from oncewire.gateway.platforms.telegram import (
    BOT_BLOCKED,
    CHAT_NOT_FOUND,
    EDIT_TARGET_NOT_FOUND,
    MESSAGE_TOO_LONG,
    BotUnauthorized,
    TelegramBot,
    TelegramUnavailable,
)
from oncewire.replies.wire import (
    TELEGRAM_LIKE,
    Delivered,
    Gone,
    MaybeDelivered,
    NotDelivered,
    RejectedForGood,
)
from oncewire.storage.replies import SendRequest
from oncewire.testing.fake_platform import ChatView, VisibleMessage
from tests.conftest import wait_for
from tests.gateway.conftest import Answering, PlatformFakeProcess

TOKEN = "123456:fake-SECRET-token"
CHAT = "4242"


class FakeTelegram(PlatformFakeProcess):
    """A running ``python -m oncewire.testing.telegram_api`` and its journal directory."""

    def __init__(self, directory: Path, *faults: dict[str, Any]) -> None:
        self.directory = directory
        args = ["--port", "0", "--journal", str(directory), "--token", TOKEN, "--name", "fk_tg"]
        for fault in faults:
            args += ["--fault", json.dumps(fault)]
        super().__init__("oncewire.testing.telegram_api", args)
        self.chat = CHAT  # the chat the helpers default to (a fresh one per test when shared)

    def inject(self, chat: str | None = None, text: str = "hello", **params: Any) -> dict[str, Any]:
        return self.call("inject", chat_id=int(chat or self.chat), text=text, **params)

    def fault(self, kind: str, **params: Any) -> None:
        """Arm a fault, confined to this test's chat unless ``chat`` says otherwise."""
        if kind != "conn_error":
            params.setdefault("chat", self.chat)
        self.call("fault", kind=kind, **params)

    def to(
        self, chat: str | None = None, *, thread: str = "", reply_to: str | None = None
    ) -> SendRequest:
        return SendRequest("fk_tg", "bot", chat or self.chat, thread, reply_to)

    def view(self) -> ChatView:
        return ChatView([self.directory / "chat.jsonl"])

    def shown(self, chat: str | None = None) -> list[VisibleMessage]:
        return self.view().visible("fk_tg", chat or self.chat)

    def texts(self, chat: str | None = None) -> list[str]:
        return [m.text for m in self.shown(chat)]

    def faults_fired(self) -> list[str]:
        return [f["kind"] for f in self.view().faults if f["chat"] == self.chat]

    def calls(self, chat: str | None = None) -> list[dict[str, Any]]:
        """The calls the fake answered, for ``chat`` (default: this test's) or every call."""
        path = self.directory / "calls.jsonl"
        calls = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        chat = chat or self.chat
        return [c for c in calls if chat == "*" or str(c["params"].get("chat_id")) == chat]


StartFake = Callable[..., FakeTelegram]


@pytest.fixture
def start_fake(tmp_path: Path) -> Iterator[StartFake]:
    """``start_fake(*faults, directory=None)``: a fake Bot API process, killed at teardown."""
    started: list[FakeTelegram] = []

    def start(*faults: dict[str, Any], directory: Path | None = None) -> FakeTelegram:
        fake = FakeTelegram(directory or tmp_path / f"tg{len(started)}", *faults)
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.stop()


@pytest.fixture(scope="module")
def shared_fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeTelegram]:
    """One fake process for a module's tests; each test has its own chat on it."""
    fake = FakeTelegram(tmp_path_factory.mktemp("telegram"))
    yield fake
    fake.stop()


_chats = itertools.count(10_001)


@pytest.fixture
def fake(shared_fake: FakeTelegram) -> Iterator[FakeTelegram]:
    """The shared fake, its helpers pointed at a chat of this test's own."""
    shared_fake.chat = str(next(_chats))
    shared_fake.inject()  # the chat exists once its user wrote to the bot
    yield shared_fake
    shared_fake.close_adopted()


def make_bot(fake: FakeTelegram, *, token: str = TOKEN, read_seconds: float = 5.0) -> TelegramBot:
    timeouts = Timeouts(connect_seconds=2.0, read_seconds=read_seconds)
    bot: TelegramBot = fake.adopt(TelegramBot(token, api_base=fake.base, timeouts=timeouts))
    return bot


# -- acknowledged operations ------------------------------------------------------------------
def test_a_send_is_plain_text_replying_to_the_user_and_the_chat_shows_it(
    fake: FakeTelegram,
) -> None:
    user = fake.inject(text="question")
    bot = make_bot(fake)

    outcome = bot.send(
        fake.to(reply_to=str(user["message_id"])), "the answer *as is*", marked=False
    )

    assert isinstance(outcome, Delivered)
    [shown] = fake.shown()
    assert (shown.message_id, shown.text, shown.reply_to) == (
        outcome.message_id,
        "the answer *as is*",
        str(user["message_id"]),
    )
    [sent] = [c for c in fake.calls() if c["method"] == "sendMessage"]
    assert "parse_mode" not in sent["params"]
    assert sent["params"]["reply_parameters"]["allow_sending_without_reply"] is True


def test_a_reply_to_a_message_that_is_gone_is_still_sent(fake: FakeTelegram) -> None:
    outcome = make_bot(fake).send(fake.to(reply_to="999999"), "still here", marked=False)

    assert isinstance(outcome, Delivered)
    assert fake.texts() == ["still here"]


def test_message_ids_increase_in_each_chat(fake: FakeTelegram) -> None:
    other = str(next(_chats))
    fake.inject(chat=other)
    bot = make_bot(fake)

    chats = (fake.chat, other, fake.chat, other)
    ids = [bot.send(fake.to(chat), "x", marked=False) for chat in chats]

    assert all(isinstance(o, Delivered) for o in ids)
    numbers = [int(o.message_id) for o in ids if isinstance(o, Delivered)]
    assert numbers[0] < numbers[2] and numbers[1] < numbers[3]


def test_a_forum_topic_is_the_thread_and_the_general_topic_is_no_thread(
    fake: FakeTelegram,
) -> None:
    bot = make_bot(fake)

    in_topic = bot.send(fake.to(thread="15"), "in topic", marked=False)
    in_general = bot.send(fake.to(thread="1"), "in general", marked=False)

    assert isinstance(in_topic, Delivered) and isinstance(in_general, Delivered)
    threads = {m.text: m.thread for m in fake.shown()}
    assert threads == {"in topic": "15", "in general": ""}


def test_a_marked_send_shows_the_marker_and_chatview_reads_the_copy(fake: FakeTelegram) -> None:
    bot = make_bot(fake)
    bot.send(fake.to(), "<<A1>> first part", marked=False)

    bot.send(fake.to(), "<<A1>> first part and the end <</A1>>", marked=True)

    copies, others = fake.view().copies("fk_tg", fake.chat, "<<A1>>", "<</A1>>", TELEGRAM_LIKE)
    assert others == []
    assert [(c.marked, c.complete) for c in copies] == [(False, False), (True, True)]
    assert fake.texts()[1].startswith(TELEGRAM_LIKE.marker)


def test_an_edit_to_the_text_already_shown_is_delivered(fake: FakeTelegram) -> None:
    bot = make_bot(fake)
    sent = bot.send(fake.to(), "final text", marked=False)
    assert isinstance(sent, Delivered)

    again = bot.edit(fake.to(), sent.message_id, "final text", marked=False)

    assert again == Delivered(sent.message_id)
    assert fake.shown()[0].edits == 0


def test_an_edit_changes_what_the_chat_shows(fake: FakeTelegram) -> None:
    bot = make_bot(fake)
    sent = bot.send(fake.to(), "draft", marked=False)
    assert isinstance(sent, Delivered)

    edited = bot.edit(fake.to(), sent.message_id, "final", marked=False)

    assert edited == Delivered(sent.message_id)
    assert fake.texts() == ["final"]


def test_a_delete_of_a_message_already_gone_is_delivered(fake: FakeTelegram) -> None:
    bot = make_bot(fake)
    sent = bot.send(fake.to(), "preview", marked=False)
    assert isinstance(sent, Delivered)

    first = bot.delete(fake.to(), sent.message_id)
    second = bot.delete(fake.to(), sent.message_id)

    assert first == second == Delivered(sent.message_id)
    assert fake.texts() == []


# -- refused for good -------------------------------------------------------------------------
def test_an_edit_of_a_message_someone_deleted_is_gone(fake: FakeTelegram) -> None:
    bot = make_bot(fake)

    outcome = bot.edit(fake.to(), "424242", "text", marked=False)

    assert isinstance(outcome, Gone)
    assert EDIT_TARGET_NOT_FOUND in outcome.reason


def test_a_chat_the_bot_never_met_is_refused_for_good(fake: FakeTelegram) -> None:
    outcome = make_bot(fake).send(fake.to(str(next(_chats))), "hello?", marked=False)

    assert isinstance(outcome, RejectedForGood)
    assert CHAT_NOT_FOUND in outcome.reason


def test_a_user_who_blocked_the_bot_is_refused_for_good(start_fake: StartFake) -> None:
    fake = start_fake({"kind": "rejected", "op": "send"})
    fake.inject()

    outcome = make_bot(fake).send(fake.to(), "anyone there?", marked=False)

    assert isinstance(outcome, RejectedForGood)
    assert BOT_BLOCKED in outcome.reason
    assert fake.texts() == []


def test_a_message_over_the_cap_is_refused_for_good(fake: FakeTelegram) -> None:
    outcome = make_bot(fake).send(fake.to(), "😀" * 2049, marked=False)  # 4098 UTF-16 units

    assert isinstance(outcome, RejectedForGood)
    assert MESSAGE_TOO_LONG in outcome.reason


def test_a_refused_token_makes_the_bot_unusable_and_later_calls_wait(fake: FakeTelegram) -> None:
    bot = make_bot(fake, token="123456:another-token")

    first = bot.send(fake.to(), "one", marked=False)
    later = bot.send(fake.to(), "two", marked=False)

    assert isinstance(first, RejectedForGood) and "401" in first.reason
    assert not bot.usable and bot.unusable_reason is not None
    assert isinstance(later, NotDelivered) and "unusable" in later.reason
    assert [c["method"] for c in fake.calls()].count("sendMessage") == 1  # later: no call
    with pytest.raises(BotUnauthorized):
        bot.get_me()


def test_a_404_for_the_method_makes_the_bot_unusable(fake: FakeTelegram) -> None:
    bot = fake.adopt(TelegramBot(TOKEN, api_base=f"{fake.base}/not-the-api"))

    outcome = bot.send(fake.to(), "hello", marked=False)

    assert isinstance(outcome, RejectedForGood) and "404" in outcome.reason
    assert not bot.usable


# -- never left, may have landed --------------------------------------------------------------
def test_a_rate_limit_is_not_delivered_with_its_retry_after(fake: FakeTelegram) -> None:
    fake.fault("rate_limit", op="send", retry_after=7)

    outcome = make_bot(fake).send(fake.to(), "soon", marked=False)

    assert outcome == NotDelivered(
        "sendMessage: 429 Too Many Requests: retry after 7", retry_after=7.0
    )
    assert fake.texts() == []


def test_a_blackout_is_not_delivered_and_the_port_comes_back(fake: FakeTelegram) -> None:
    bot = make_bot(fake)
    assert isinstance(bot.send(fake.to(), "before", marked=False), Delivered)  # a pooled connection
    fake.fault("conn_error", blackout_seconds=2.0)
    wait_for(lambda: _refused(fake), what="the listener to black out")

    try:
        during = bot.send(fake.to(), "during", marked=False)
    finally:  # the fake is shared: the next test needs it back
        wait_for(lambda: _answers(fake), what="the listener to come back")
    after = bot.send(fake.to(), "after", marked=False)

    assert isinstance(during, NotDelivered) and "never left" in during.reason
    assert during.retry_after is None
    assert isinstance(after, Delivered)
    assert fake.texts() == ["before", "after"]


def _refused(fake: FakeTelegram) -> bool:
    try:
        httpx2.get(f"{fake.base}/control/state", timeout=1.0)
    except httpx2.ConnectError:
        return True
    except httpx2.TransportError:
        return False  # accepted just before the listener closed, then reset: not refused yet
    return False


def _answers(fake: FakeTelegram) -> bool:
    try:
        return httpx2.get(f"{fake.base}/control/state", timeout=1.0).status_code == 200
    except httpx2.TransportError:
        return False


@pytest.mark.parametrize(
    ("kind", "lands"),
    [("timeout", False), ("ack_lost", True), ("hold", False), ("hold_after", True)],
)
def test_a_send_without_an_answer_may_have_landed(
    fake: FakeTelegram, kind: str, lands: bool
) -> None:
    fake.fault(kind, op="send", contains="<</A1>>", hold_seconds=30)
    bot = make_bot(fake, read_seconds=0.5)

    outcome = bot.send(fake.to(), "<<A1>> answer <</A1>>", marked=False)

    assert isinstance(outcome, MaybeDelivered)
    assert "ReadTimeout" in outcome.reason
    assert fake.texts() == (["<<A1>> answer <</A1>>"] if lands else [])
    assert fake.faults_fired() == [kind]
    fake.call("release")


def test_an_edit_whose_answer_was_lost_is_delivered_when_replayed(fake: FakeTelegram) -> None:
    # Long enough that only the lost answer times out, not a send on a busy machine.
    bot = make_bot(fake, read_seconds=2.0)
    sent = bot.send(fake.to(), "<<A1>> partial", marked=False)
    assert isinstance(sent, Delivered)
    fake.fault("ack_lost", op="edit")

    lost = bot.edit(fake.to(), sent.message_id, "<<A1>> whole <</A1>>", marked=False)
    replayed = bot.edit(fake.to(), sent.message_id, "<<A1>> whole <</A1>>", marked=False)

    assert isinstance(lost, MaybeDelivered)
    assert replayed == Delivered(sent.message_id)  # "message is not modified"
    copies, _ = fake.view().copies("fk_tg", fake.chat, "<<A1>>", "<</A1>>", TELEGRAM_LIKE)
    assert [(c.text, c.marked) for c in copies] == [("<<A1>> whole <</A1>>", False)]


# -- 5xx, from a server that answers one status to everything -----------------------------------
@pytest.mark.parametrize(
    "body",
    [
        b'{"ok":false,"error_code":500,"description":"Internal Server Error"}',
        b"<html><body><h1>502 Bad Gateway</h1></body></html>",
    ],
)
def test_a_server_error_on_a_send_may_have_landed(answering: Answering, body: bytes) -> None:
    status = 500 if body.startswith(b"{") else 502
    bot = TelegramBot(TOKEN, api_base=answering(status, body))
    try:
        outcome = bot.send(SendRequest("fk_tg", "bot", CHAT), "hello", marked=False)

        assert isinstance(outcome, MaybeDelivered) and str(status) in outcome.reason
        assert bot.usable
        with pytest.raises(TelegramUnavailable):
            bot.get_me()
    finally:
        bot.close()


# -- getMe --------------------------------------------------------------------------------------
def test_get_me_names_the_bot(fake: FakeTelegram) -> None:
    me = make_bot(fake).get_me()

    assert me.is_bot and me.username == "oncewire_fake_bot" and me.id > 0
