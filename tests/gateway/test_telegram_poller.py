"""The long poller against the fake Bot API process: an update is confirmed only after the
caller says its admission committed, so a restarted poller (or fake) gets it again."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from oncewire.gateway.platforms.telegram import BotUnauthorized, PollConflict
from oncewire.gateway.platforms.telegram_updates import TelegramInbound, UpdatePoller
from tests.conftest import wait_for
from tests.gateway.test_telegram_wire import CHAT, TOKEN, FakeTelegram, StartFake, start_fake

__all__ = ["start_fake"]  # the fixture, shared with the wire tests


@pytest.fixture
def fake(start_fake: StartFake) -> FakeTelegram:
    return start_fake()


def make_poller(fake: FakeTelegram, *, timeout: int = 0, token: str = TOKEN) -> UpdatePoller:
    poller: UpdatePoller = fake.adopt(
        UpdatePoller(token, api_base=fake.base, poll_timeout_seconds=timeout)
    )
    return poller


def offsets_sent(fake: FakeTelegram) -> list[int | None]:
    return [c["params"].get("offset") for c in fake.calls("*") if c["method"] == "getUpdates"]


def test_a_message_is_parsed_with_its_key_sender_and_topic(fake: FakeTelegram) -> None:
    sender = {"id": 55, "is_bot": False, "first_name": "Ann", "username": "ann"}
    fake.inject(
        text="in a topic", thread_id=12, chat_type="supergroup", message_id=7, **{"from": sender}
    )

    [message] = make_poller(fake).poll()

    assert message == TelegramInbound(
        update_id=message.update_id,
        chat_id=CHAT,
        chat_type="supergroup",
        message_id="7",
        thread_id="12",
        sender_id="55",
        sender_is_bot=False,
        sender_username="ann",
        text="in a topic",
        edited=False,
        date=message.date,
    )


def test_an_edit_arrives_as_an_edited_message_with_the_same_key(fake: FakeTelegram) -> None:
    first = fake.inject(text="typo")
    fake.inject(text="fixed", message_id=first["message_id"], edited=True)

    original, edit = make_poller(fake).poll()

    assert (original.edited, edit.edited) == (False, True)
    assert (original.message_id, edit.message_id) == (edit.message_id, str(first["message_id"]))
    assert edit.text == "fixed"


def test_only_confirmed_updates_move_the_offset(fake: FakeTelegram) -> None:
    for text in ("one", "two", "three"):
        fake.inject(text=text)
    poller = make_poller(fake)
    one, two, _three = poller.poll()

    poller.confirm(two.update_id)  # out of order: "one" is not admitted yet
    offset_before_one = poller.offset
    poller.confirm(one.update_id)
    again = poller.poll()

    assert offset_before_one is None
    assert poller.offset == two.update_id + 1
    assert [m.text for m in again] == ["three"]  # re-served: never confirmed
    assert offsets_sent(fake) == [None, two.update_id + 1]


def test_unconfirmed_updates_are_served_again_to_a_restarted_poller(
    fake: FakeTelegram,
) -> None:
    fake.inject(text="admitted")
    fake.inject(text="lost in the crash")
    first = make_poller(fake)
    admitted, _lost = first.poll()
    first.confirm(admitted.update_id)
    first.poll()  # sends the offset: Telegram forgets "admitted"
    first.close()

    second = make_poller(fake)
    served = second.poll()

    assert [m.text for m in served] == ["lost in the crash"]


def test_a_restarted_fake_keeps_updates_and_the_confirmed_offset(
    start_fake: StartFake, tmp_path: Path
) -> None:
    fake = start_fake(directory=tmp_path / "tg")
    for text in ("a", "b"):
        fake.inject(text=text)
    poller = make_poller(fake)
    a, _b = poller.poll()
    poller.confirm(a.update_id)
    poller.poll()
    fake.stop()

    restarted = start_fake(directory=tmp_path / "tg")
    served = make_poller(restarted).poll()

    assert [m.text for m in served] == ["b"]


def test_confirming_an_update_never_served_is_refused(fake: FakeTelegram) -> None:
    poller = make_poller(fake)

    with pytest.raises(ValueError, match="not served"):
        poller.confirm(12345)


def test_a_second_poller_ends_the_first_ones_poll_with_a_conflict(fake: FakeTelegram) -> None:
    first = make_poller(fake, timeout=30)
    errors: list[BaseException] = []

    def poll_first() -> None:
        try:
            first.poll()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=poll_first)
    thread.start()
    wait_for(lambda: fake.call("state")["polls_waiting"] == 1, what="the first poll to wait")
    second = make_poller(fake)
    second.poll()
    thread.join(timeout=10)
    fake.inject(text="for the second")

    assert not thread.is_alive()
    assert [type(e) for e in errors] == [PollConflict]
    assert [m.text for m in second.poll()] == ["for the second"]


def test_stop_ends_a_blocked_long_poll(fake: FakeTelegram) -> None:
    poller = make_poller(fake, timeout=30)
    results: list[list[TelegramInbound]] = []
    thread = threading.Thread(target=lambda: results.append(poller.poll()))
    thread.start()
    wait_for(lambda: fake.call("state")["polls_waiting"] == 1, what="the poll to wait")

    poller.stop()
    thread.join(timeout=10)

    assert not thread.is_alive()
    assert results == [[]]
    assert poller.poll() == []  # stopped for good


def test_a_long_poll_returns_when_a_message_arrives(fake: FakeTelegram) -> None:
    poller = make_poller(fake, timeout=30)
    results: list[list[TelegramInbound]] = []
    thread = threading.Thread(target=lambda: results.append(poller.poll()))
    thread.start()
    wait_for(lambda: fake.call("state")["polls_waiting"] == 1, what="the poll to wait")

    fake.inject(text="wake up")
    thread.join(timeout=10)

    assert not thread.is_alive()
    assert [[m.text for m in r] for r in results] == [["wake up"]]


def test_updates_outside_allowed_updates_are_not_served(fake: FakeTelegram) -> None:
    first = fake.inject(text="original")
    fake.inject(text="edited", message_id=first["message_id"], edited=True)
    poller = fake.adopt(
        UpdatePoller(TOKEN, api_base=fake.base, poll_timeout_seconds=0, allowed_updates=["message"])
    )

    served = poller.poll()

    assert [(m.text, m.edited) for m in served] == [("original", False)]


def test_a_refused_token_is_a_typed_error(fake: FakeTelegram) -> None:
    with pytest.raises(BotUnauthorized):
        make_poller(fake, token="1:wrong").poll()
