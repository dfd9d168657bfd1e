"""The Discord reply adapter against the fake Discord as a real child process: what reaches the
chat is read from the fake's journal (ChatView), every fault is armed on the real wire, and the
nonce path is shown end to end through the reply engine: a create whose acknowledgement is lost
is sent again with the same nonce, and the chat shows one unmarked message."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from oncewire import Ledger
from oncewire.gateway.http import Timeouts
from oncewire.gateway.platforms.discord import DISCORD, DiscordBot, nonce_for
from oncewire.replies import ReplyEngine, ReplyState
from oncewire.replies.wire import (
    Delivered,
    Gone,
    MaybeDelivered,
    NotDelivered,
    RejectedForGood,
)
from oncewire.storage.replies import SendRequest
from oncewire.testing.fake_platform import ChatView, VisibleMessage
from tests.gateway.conftest import PlatformFakeProcess

TOKEN = "discord-SECRET-token.abc"
PLATFORM = "fk_dc"
CHAT = "500000000000000001"


class FakeDiscord(PlatformFakeProcess):
    """A running ``python -m oncewire.testing.discord_api`` and its journal directory."""

    def __init__(self, directory: Path, *args: str, heartbeat_ms: int = 400) -> None:
        self.directory = directory
        super().__init__(
            "oncewire.testing.discord_api",
            [
                "--port",
                "0",
                "--journal",
                str(directory),
                "--token",
                TOKEN,
                "--name",
                PLATFORM,
                "--heartbeat-ms",
                str(heartbeat_ms),
                *args,
            ],
        )
        self.api_base = f"{self.base}/api/v10"
        self.chat = CHAT

    def inject(self, text: str = "hello", **params: Any) -> dict[str, Any]:
        params.setdefault("channel_id", self.chat)
        return self.call("inject", text=text, **params)

    def fault(self, kind: str, **params: Any) -> None:
        if kind != "conn_error":
            params.setdefault("chat", self.chat)
        self.call("fault", kind=kind, **params)

    def to(self, *, thread: str = "", reply_to: str | None = None, key: str | None = None) -> Any:
        return SendRequest(PLATFORM, "bot", self.chat, thread, reply_to, idempotency_key=key)

    def shown(self) -> list[VisibleMessage]:
        return ChatView([self.directory / "chat.jsonl"]).visible(PLATFORM, self.chat)

    def texts(self) -> list[str]:
        return [m.text for m in self.shown()]

    def calls(self) -> list[dict[str, Any]]:
        path = self.directory / "calls.jsonl"
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    def faults_fired(self) -> list[str]:
        return [f["kind"] for f in ChatView([self.directory / "chat.jsonl"]).faults]

    def rest(self) -> httpx2.Client:
        """A raw REST client with the bot's token (closed when the fake stops)."""
        client = httpx2.Client(
            base_url=self.api_base, headers={"authorization": f"Bot {TOKEN}"}, timeout=10.0
        )
        return self.adopt(client)  # type: ignore[no-any-return]


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeDiscord]:
    started = FakeDiscord(tmp_path / "discord")
    started.inject(text="the first user message")  # the channel exists from now on
    yield started
    started.stop()


def bot(fake: FakeDiscord, read_seconds: float = 1.0) -> DiscordBot:
    made = DiscordBot(
        TOKEN,
        api_base=fake.api_base,
        timeouts=Timeouts(connect_seconds=2, read_seconds=read_seconds),
    )
    return fake.adopt(made)  # type: ignore[no-any-return]


def test_send_edit_delete_reach_the_chat(fake: FakeDiscord) -> None:
    adapter = bot(fake)
    sent = adapter.send(fake.to(key="k1"), "an answer", marked=False)
    assert isinstance(sent, Delivered)
    assert fake.texts() == ["an answer"]

    assert adapter.edit(fake.to(), sent.message_id, "a longer answer", marked=False) == sent
    assert adapter.edit(fake.to(), sent.message_id, "a longer answer", marked=False) == sent
    assert fake.texts() == ["a longer answer"]
    assert adapter.delete(fake.to(), sent.message_id) == sent
    assert fake.texts() == []
    # Deleted already: Discord answers 10008, which a delete counts as done.
    assert adapter.delete(fake.to(), sent.message_id) == sent
    [create] = [c for c in fake.calls() if c["method"] == "POST" and "/channels/" in c["path"]]
    body = create["body"]
    assert body["enforce_nonce"] is True and body["allowed_mentions"] == {"parse": []}
    assert len(body["nonce"]) <= 25 and body["nonce"] == nonce_for(fake.to(key="k1"), "an answer")


def test_a_marked_send_shows_the_marker_and_a_reply_references_the_message(
    fake: FakeDiscord,
) -> None:
    user = fake.inject(text="question")
    adapter = bot(fake)

    sent = adapter.send(fake.to(reply_to=user["message_id"]), "again", marked=True)

    assert isinstance(sent, Delivered)
    [shown] = fake.shown()
    assert DISCORD.strip_marker(shown.text) == ("again", True)
    assert shown.reply_to == user["message_id"]


def test_a_reply_in_a_thread_goes_to_the_thread_channel_and_is_journaled_under_its_chat(
    fake: FakeDiscord,
) -> None:
    fake.inject(text="in a thread", thread_id="500000000000000077")
    adapter = bot(fake)

    sent = adapter.send(fake.to(thread="500000000000000077"), "threaded", marked=False)

    assert isinstance(sent, Delivered)
    [shown] = fake.shown()
    assert (shown.chat, shown.thread, shown.text) == (CHAT, "500000000000000077", "threaded")
    posted = [c["path"] for c in fake.calls() if c["method"] == "POST"]
    assert posted == ["/api/v10/channels/500000000000000077/messages"]


def test_a_repeated_nonce_inside_the_window_answers_the_first_message(fake: FakeDiscord) -> None:
    adapter = bot(fake)
    first = adapter.send(fake.to(key="slot-0"), "once", marked=False)
    again = adapter.send(fake.to(key="slot-0"), "once", marked=False)

    assert isinstance(first, Delivered) and again == first
    assert fake.texts() == ["once"]


def test_past_the_nonce_window_a_repeat_is_a_second_message(tmp_path: Path) -> None:
    short = FakeDiscord(tmp_path / "short", "--nonce-window-seconds", "0.5")
    try:
        short.inject(text="hi")
        adapter = bot(short)
        first = adapter.send(short.to(key="slot-0"), "twice", marked=False)
        time.sleep(0.6)  # the fake's nonce window, not a wait for the code under test
        again = adapter.send(short.to(key="slot-0"), "twice", marked=False)
        assert isinstance(first, Delivered) and isinstance(again, Delivered)
        assert first != again
        assert short.texts() == ["twice", "twice"]
    finally:
        short.stop()


@pytest.mark.parametrize(
    ("kind", "outcome"),
    [
        ("rate_limit", NotDelivered),
        ("rejected", RejectedForGood),
        ("timeout", MaybeDelivered),
        ("ack_lost", MaybeDelivered),
    ],
)
def test_faults_on_a_create_classify_as_the_wire_says(
    fake: FakeDiscord, kind: str, outcome: type
) -> None:
    fake.fault(kind, op="send", retry_after=2.5)
    result = bot(fake).send(fake.to(key=kind), "faulted", marked=False)

    assert isinstance(result, outcome), result
    assert fake.faults_fired() == [kind]
    if kind == "rate_limit":
        assert isinstance(result, NotDelivered) and result.retry_after == 2.5
    assert fake.texts() == (["faulted"] if kind == "ack_lost" else [])


def test_a_429_empties_the_route_and_the_next_call_is_not_made(fake: FakeDiscord) -> None:
    fake.fault("rate_limit", op="send", retry_after=30.0)
    adapter = bot(fake)
    adapter.send(fake.to(key="a"), "one", marked=False)
    posts = len(fake.calls())

    result = adapter.send(fake.to(key="b"), "two", marked=False)

    assert isinstance(result, NotDelivered) and result.retry_after is not None
    assert 25.0 < result.retry_after <= 30.0
    assert "not called" in result.reason
    assert len(fake.calls()) == posts  # no call reached the fake
    assert fake.texts() == []


def test_a_bucket_with_nothing_remaining_waits_for_its_reset(tmp_path: Path) -> None:
    limited = FakeDiscord(tmp_path / "limited", "--bucket-limit", "1", "--bucket-seconds", "30")
    try:
        limited.inject(text="hi")
        adapter = bot(limited)
        assert isinstance(adapter.send(limited.to(key="a"), "one", marked=False), Delivered)
        calls = len(limited.calls())
        result = adapter.send(limited.to(key="b"), "two", marked=False)
        assert isinstance(result, NotDelivered) and result.retry_after is not None
        assert "not called" in result.reason and len(limited.calls()) == calls
        assert limited.texts() == ["one"]
    finally:
        limited.stop()


def test_an_edit_of_a_message_someone_deleted_is_gone(fake: FakeDiscord) -> None:
    adapter = bot(fake)
    sent = adapter.send(fake.to(key="g"), "soon deleted", marked=False)
    assert isinstance(sent, Delivered)
    fake.fault("gone", op="edit")

    assert isinstance(adapter.edit(fake.to(), sent.message_id, "edit", marked=False), Gone)
    assert isinstance(adapter.edit(fake.to(), sent.message_id, "again", marked=False), Gone)
    assert fake.texts() == []


def test_content_over_2000_is_rejected_for_good(fake: FakeDiscord) -> None:
    result = bot(fake).send(fake.to(key="long"), "x" * 2001, marked=False)

    assert isinstance(result, RejectedForGood) and "50035" in result.reason
    assert fake.texts() == []


def test_an_unknown_channel_is_rejected_for_good(fake: FakeDiscord) -> None:
    request = SendRequest(PLATFORM, "bot", "599999999999999999", idempotency_key="x")

    result = bot(fake).send(request, "nowhere", marked=False)

    assert isinstance(result, RejectedForGood) and "10003" in result.reason


def test_a_listener_blackout_is_never_delivered(fake: FakeDiscord) -> None:
    fake.fault("conn_error", blackout_seconds=2.0)
    adapter = DiscordBot(
        TOKEN,
        api_base=fake.api_base,
        timeouts=Timeouts(connect_seconds=2, read_seconds=1),
    )
    try:
        result: Any = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the blackout starts just after the control answer
            result = adapter.send(fake.to(key="c"), "refused", marked=False)
            if isinstance(result, NotDelivered):
                break
        assert isinstance(result, NotDelivered), result
        assert "never left" in result.reason
    finally:
        adapter.close()


def test_the_token_never_shows(fake: FakeDiscord) -> None:
    adapter = DiscordBot(TOKEN, api_base=fake.api_base)
    try:
        assert TOKEN not in repr(adapter) and TOKEN not in repr(adapter.api)
        bad = DiscordBot("wrong-token", api_base=fake.api_base)
        result = bad.send(fake.to(key="t"), "x", marked=False)
        assert isinstance(result, NotDelivered) and not bad.usable
        assert "wrong-token" not in result.reason + repr(bad) + str(bad.unusable_reason)
        bad.close()
    finally:
        adapter.close()


def test_a_lost_acknowledgement_of_a_create_leaves_one_unmarked_message(
    fake: FakeDiscord, tmp_path: Path
) -> None:
    """The nonce path: the create is applied, its answer lost (the engine sees MaybeDelivered);
    the engine sends the slot again inside the nonce window, unmarked with the same body and
    nonce, and Discord answers the first message. The chat shows one unmarked copy."""
    fake.fault("ack_lost", op="send")
    adapter = bot(fake)
    with Ledger(str(tmp_path / "replies.db")) as ledger:
        engine = ReplyEngine(ledger, {PLATFORM: adapter}, owner="test", backoff_base_seconds=0.1)
        user = fake.inject(text="please answer")
        admitted = ledger.inbound.admit(PLATFORM, "bot", CHAT, user["message_id"], {"t": 1})
        inbound_id = admitted.inbound.id
        reply = engine.open(inbound_id)
        engine.commit(inbound_id, "the whole answer")
        engine.deliver(reply.id)
        deadline = time.monotonic() + 30
        while ledger.replies.get(reply.id).state is not ReplyState.DELIVERED:
            assert time.monotonic() < deadline, "the reply was never delivered"
            engine.run_due()
            time.sleep(0.05)

    assert fake.faults_fired() == ["ack_lost"]
    [shown] = fake.shown()
    assert DISCORD.strip_marker(shown.text) == ("the whole answer", False)
    creates = [c for c in fake.calls() if c["method"] == "POST" and "/channels/" in c["path"]]
    assert len(creates) == 2
    assert creates[0]["body"]["nonce"] == creates[1]["body"]["nonce"]
    assert creates[0]["body"]["content"] == creates[1]["body"]["content"] == "the whole answer"
