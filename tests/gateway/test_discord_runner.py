"""``oncewire gateway run`` serving Discord, real processes only: the fake Discord (REST and
Gateway) and the fake model as child processes, the gateway as a child process in a process
group of its own. What the chat shows is read from the fake's journal (ChatView); what was
admitted and answered, from the store, read directly."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.gateway.platforms.discord import DISCORD
from oncewire.inbound import InboundState
from oncewire.replies import ReplyState
from tests.conftest import wait_for
from tests.gateway.conftest import FakeOpenAI
from tests.gateway.test_discord_wire import CHAT, PLATFORM, TOKEN, FakeDiscord
from tests.gateway.test_runner import Gateway

pytestmark = pytest.mark.empty_store  # the gateway creates its store

THREAD = "500000000000000077"


class Rig:
    """The fake Discord, the fake model, a gateway.toml pointing at them and the store."""

    def __init__(self, tmp_path: Path, script: Any, db: str, *, streaming: bool = True) -> None:
        self.tmp_path = tmp_path
        self.db = db
        self.discord = FakeDiscord(tmp_path / "discord")
        self.model = FakeOpenAI(tmp_path / "openai", script)
        self.config = tmp_path / "gateway.toml"
        self.config.write_text(
            f"""
[store]
db = {json.dumps(db)}

[model]
base_url = "{self.model.base_url}"
api_key_env = ""
model = "fake-model"
max_retries = 1
read_timeout = 60

[turns]
max_concurrent = 2

[[platforms]]
name = "{PLATFORM}"
kind = "discord"
token_env = "DISCORD_BOT_TOKEN"
api_base = "{self.discord.api_base}"
streaming = {json.dumps(streaming)}
edit_interval_seconds = 0.05
read_timeout_seconds = 2
""",
            encoding="utf-8",
        )
        self.gateways: list[Gateway] = []

    def start(self) -> Gateway:
        gateway = Gateway(
            self.config,
            self.tmp_path / "gateway.log",
            20.0,
            {"DISCORD_BOT_TOKEN": TOKEN},
        )
        self.gateways.append(gateway)
        return gateway

    def ledger(self) -> Ledger:
        return Ledger(self.db, create=False)

    def inbounds(self) -> list[Any]:
        with self.ledger() as ledger:
            return ledger.inbound.list(limit=100)

    def wait_delivered(self, count: int, timeout: float = 60.0) -> None:
        def done() -> bool:
            found = self.inbounds()
            return len(found) >= count and all(
                i.status is InboundState.DELIVERED for i in found[:count]
            )

        wait_for(done, timeout=timeout, what=f"{count} message(s) delivered")

    def connected(self) -> bool:
        sessions = self.discord.call("state")["sessions"]
        return any(s["connected"] for s in sessions)

    def shown(self, thread: str = "") -> list[tuple[str, bool]]:
        return [DISCORD.strip_marker(m.text) for m in self.discord.shown() if m.thread == thread]

    def stop(self) -> None:
        for gateway in self.gateways:
            gateway.kill()
        self.discord.stop()
        self.model.stop()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(script: Any, *, db: str | None = None, streaming: bool = True) -> Rig:
        made.append(Rig(tmp_path, script, db or str(tmp_path / "gateway.db"), streaming=streaming))
        return made[-1]

    yield make
    for one in made:
        one.stop()


def assert_answered_once(rig: Rig, message_id: str, text: str) -> None:
    """The store holds the message once, answered once with ``text`` and delivered."""
    with rig.ledger() as ledger:
        [inbound] = [
            i for i in ledger.inbound.list(limit=100) if i.platform_message_id == message_id
        ]
        assert inbound.status is InboundState.DELIVERED
        assert inbound.bot == "900000000000000001"  # the bot's user id, from READY
        reply = ledger.replies.for_inbound(inbound.id)
        assert reply is not None and reply.state is ReplyState.DELIVERED
        assert reply.final_text == text
        assert ledger.runs.get(f"turn:{inbound.id}").status == "answered"


def test_a_message_over_the_gateway_is_answered_once_with_previews_by_edits(
    rig: Callable[..., Rig], store_url: str
) -> None:
    answer = "Hello from the model, streamed in small pieces over Discord."
    r = rig(
        [{"kind": "text", "text": answer, "chunk_chars": 6, "delay_per_chunk": 0.05}], db=store_url
    )
    gateway = r.start()
    wait_for(r.connected, what="the gateway's Gateway session")

    sent = r.discord.inject(text="hi there")
    r.wait_delivered(1)

    assert r.shown() == [(answer, False)]
    assert_answered_once(r, sent["message_id"], answer)
    [message] = r.discord.shown()
    assert message.edits >= 1  # the preview was edited up to the answer, never sent twice
    assert message.reply_to == sent["message_id"]
    creates = [c for c in r.discord.calls() if c["method"] == "POST" and "/channels/" in c["path"]]
    assert len(creates) == 1 and creates[0]["body"]["enforce_nonce"] is True
    (request,) = r.model.requests()
    assert request["body"]["messages"][-1] == {"role": "user", "content": "hi there"}
    # The bot's own messages came back as MESSAGE_CREATE dispatches and were not admitted.
    assert len(r.inbounds()) == 1
    assert gateway.terminate() == 0


def test_messages_from_bots_are_never_admitted(rig: Callable[..., Rig]) -> None:
    r = rig([{"kind": "text", "text": "The one answer."}])
    r.start()
    wait_for(r.connected, what="the gateway's Gateway session")

    r.discord.inject(text="a message from another bot", bot=True)
    sent = r.discord.inject(text="a person's question")
    r.wait_delivered(1)

    [inbound] = r.inbounds()
    assert inbound.platform_message_id == sent["message_id"]
    assert len(r.model.requests()) == 1
    assert r.shown() == [("The one answer.", False)]


def test_a_message_in_a_thread_is_answered_in_that_thread(rig: Callable[..., Rig]) -> None:
    r = rig([{"kind": "text", "text": "Answered in the thread."}])
    r.start()
    wait_for(r.connected, what="the gateway's Gateway session")

    sent = r.discord.inject(text="a question in a thread", thread_id=THREAD)
    r.wait_delivered(1)

    [inbound] = r.inbounds()
    assert (inbound.chat, inbound.thread) == (CHAT, THREAD)
    assert r.shown(THREAD) == [("Answered in the thread.", False)] and r.shown() == []
    assert_answered_once(r, sent["message_id"], "Answered in the thread.")


def test_a_lost_acknowledgement_of_the_first_create_leaves_one_unmarked_reply(
    rig: Callable[..., Rig],
) -> None:
    """Seed 002's ack_lost x fk_dc: the stream's first create is the whole reply; it is applied
    and its answer lost. The resend carries the same nonce: one unmarked copy."""
    answer = "A short answer in one piece."
    r = rig([{"kind": "text", "text": answer}])
    r.start()
    wait_for(r.connected, what="the gateway's Gateway session")
    r.discord.fault("ack_lost", op="send")

    sent = r.discord.inject(text="answer me")
    r.wait_delivered(1)

    assert r.discord.faults_fired() == ["ack_lost"]
    assert r.shown() == [(answer, False)]
    assert_answered_once(r, sent["message_id"], answer)
    creates = [c for c in r.discord.calls() if c["method"] == "POST" and "/channels/" in c["path"]]
    assert len(creates) >= 2 and len({c["body"]["nonce"] for c in creates}) == 1


@pytest.mark.parametrize("how", ["op7", "close", "zombie", "invalid_session_resumable"])
def test_a_resume_replays_a_dispatch_and_it_is_admitted_once(
    rig: Callable[..., Rig], how: str
) -> None:
    r = rig([{"kind": "text", "text": "First."}, {"kind": "text", "text": "Second."}])
    r.start()
    wait_for(r.connected, what="the gateway's Gateway session")
    first = r.discord.inject(text="one")
    r.wait_delivered(1)

    assert r.discord.call("reconnect", how=how)["connections"] == 1

    def resumed() -> bool:
        [session] = r.discord.call("state")["sessions"]
        return bool(session["resumes"] >= 1 and session["connected"])

    wait_for(resumed, timeout=30, what="the session to be resumed")
    second = r.discord.inject(text="two")
    r.wait_delivered(2)

    state = r.discord.call("state")
    assert state["identifies"] == 1  # resumed, never identified again
    assert [i.platform_message_id for i in r.inbounds()] == [
        first["message_id"],
        second["message_id"],
    ]
    assert all(i.deliveries == 1 for i in r.inbounds())
    assert r.shown() == [("First.", False), ("Second.", False)]


def test_a_dispatch_replayed_by_a_resume_is_a_redelivery_not_a_second_turn(
    rig: Callable[..., Rig],
) -> None:
    """R2 on Discord: after the message is answered, a Resume replays its dispatch (the fake
    rewinds the session): admission counts a re-delivery, and nothing is asked or sent again."""
    r = rig([{"kind": "text", "text": "Only once."}])
    r.start()
    wait_for(r.connected, what="the gateway's Gateway session")
    sent = r.discord.inject(text="replay me")
    r.wait_delivered(1)

    assert r.discord.call("reconnect", how="op7", rewind=5)["connections"] == 1

    def redelivered() -> bool:
        [inbound] = r.inbounds()
        return bool(inbound.deliveries == 2)

    wait_for(redelivered, timeout=30, what="the replayed dispatch to reach admission")
    [inbound] = r.inbounds()
    assert inbound.platform_message_id == sent["message_id"]
    assert inbound.status is InboundState.DELIVERED
    assert len(r.model.requests()) == 1
    assert r.shown() == [("Only once.", False)]


def test_a_fresh_identify_backfills_a_message_sent_while_the_gateway_was_down(
    rig: Callable[..., Rig], store_url: str
) -> None:
    r = rig(
        [{"kind": "text", "text": "Before."}, {"kind": "text", "text": "While down."}], db=store_url
    )
    first = r.start()
    wait_for(r.connected, what="the gateway's Gateway session")
    r.discord.inject(text="before the outage")
    r.wait_delivered(1)
    first.kill()
    wait_for(lambda: not r.connected(), what="the session to lose its connection")

    missed = r.discord.inject(text="sent while nobody listened")
    assert r.discord.call("expire_sessions")["expired"] >= 1  # Discord will not replay it
    r.start()
    r.wait_delivered(2)

    state = r.discord.call("state")
    assert state["identifies"] == 2
    history = [
        c for c in r.discord.calls() if c["method"] == "GET" and c["path"].endswith("/messages")
    ]
    assert history and all("after=" in c["query"] for c in history)
    assert_answered_once(r, missed["message_id"], "While down.")
    assert r.shown() == [("Before.", False), ("While down.", False)]
