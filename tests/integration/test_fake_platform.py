"""The journaled fake platform itself: what it journals, how faults fire, what the oracle sees."""

from __future__ import annotations

from pathlib import Path

import pytest

from oncewire.core.errors import ConfigurationError
from oncewire.replies import (
    DISCORD_LIKE,
    NON_EDITABLE,
    TELEGRAM_LIKE,
    Delivered,
    MaybeDelivered,
    NotDelivered,
    RejectedForGood,
    SendRequest,
)
from oncewire.testing.fake_platform import ChatView, FakePlatform, Fault

REQ = SendRequest("fk", "bot", "c1", "t1", reply_to="in-1")


def test_the_journal_survives_a_new_instance(tmp_path: Path) -> None:
    journal = tmp_path / "fk.jsonl"
    first = FakePlatform(journal, TELEGRAM_LIKE, name="fk")
    sent = first.send(REQ, "hello", marked=False)
    assert sent == Delivered("1")
    first.close()  # as good as a SIGKILL: every accepted operation is already fsynced
    second = FakePlatform(journal, TELEGRAM_LIKE, name="fk")
    assert second.send(REQ, "again", marked=False) == Delivered("2")
    assert second.edit(REQ, "1", "hello, edited", marked=False) == Delivered("1")
    assert second.delete(REQ, "2") == Delivered("2")
    assert second.delete(REQ, "2") == Delivered("2")  # a repeated delete is a no-op
    second.close()
    shown = ChatView([journal]).visible("fk", "c1")
    assert [(m.message_id, m.text, m.edits, m.thread, m.reply_to) for m in shown] == [
        ("1", "hello, edited", 1, "t1", "in-1")
    ]


def test_faults_fire_a_bounded_number_of_times_across_instances(tmp_path: Path) -> None:
    journal = tmp_path / "fk.jsonl"
    faults = [Fault("rate_limit", contains="x", retry_after=2.5, times=2)]
    first = FakePlatform(journal, DISCORD_LIKE, name="fk", faults=faults)
    assert first.send(REQ, "x", marked=False) == NotDelivered(
        "429 too many requests", retry_after=2.5
    )
    first.close()
    second = FakePlatform(journal, DISCORD_LIKE, name="fk", faults=faults)
    assert isinstance(second.send(REQ, "x", marked=False), NotDelivered)
    assert isinstance(second.send(REQ, "x", marked=False), Delivered)
    second.close()
    assert len(ChatView([journal]).faults) == 2


@pytest.mark.parametrize(
    ("kind", "outcome", "visible"),
    [
        ("timeout", MaybeDelivered, 0),
        ("ack_lost", MaybeDelivered, 1),
        ("conn_error", NotDelivered, 0),
        ("rejected", RejectedForGood, 0),
        ("hold", MaybeDelivered, 0),
        ("hold_after", MaybeDelivered, 1),
    ],
)
def test_each_fault_kind(tmp_path: Path, kind: str, outcome: type, visible: int) -> None:
    journal = tmp_path / "fk.jsonl"
    fake = FakePlatform(
        journal, TELEGRAM_LIKE, name="fk", faults=[Fault(kind, op="send", hold_seconds=0)]
    )
    assert isinstance(fake.send(REQ, "text", marked=False), outcome)
    fake.close()
    assert len(ChatView([journal]).visible("fk", "c1")) == visible


def test_what_a_platform_refuses(tmp_path: Path) -> None:
    tg = FakePlatform(tmp_path / "tg.jsonl", TELEGRAM_LIKE, name="tg")
    assert isinstance(tg.send(REQ, "😀" * 2049, marked=False), RejectedForGood)  # 4098 units
    assert isinstance(tg.send(REQ, "😀" * 2048, marked=False), Delivered)
    assert isinstance(tg.edit(REQ, "99", "x", marked=False), RejectedForGood)
    other_chat = SendRequest("fk", "bot", "c2")
    assert isinstance(tg.edit(other_chat, "1", "x", marked=False), RejectedForGood)
    tg.close()
    ne = FakePlatform(tmp_path / "ne.jsonl", NON_EDITABLE, name="ne")
    assert ne.send(REQ, "x", marked=False) == Delivered("1")
    assert isinstance(ne.edit(REQ, "1", "y", marked=False), RejectedForGood)
    assert isinstance(ne.delete(REQ, "1"), RejectedForGood)
    ne.close()
    with pytest.raises(ConfigurationError):
        Fault("explode")


def test_the_oracle_finds_copies_and_strays(tmp_path: Path) -> None:
    journal = tmp_path / "fk.jsonl"
    fake = FakePlatform(journal, DISCORD_LIKE, name="fk")
    for body, marked in [
        ("<<A>> part one ", False),
        ("part two <</A>>", False),  # a complete copy in two chunks
        ("<<A>> part one ", True),  # a marked copy, cut short
        ("part two <</A>>", True),  # ... and its marked tail
        ("unrelated", False),
        ("<<A>> lonely", False),  # an unmarked partial
    ]:
        fake.send(REQ, body, marked=marked)
    fake.close()
    with journal.open("a") as handle:
        handle.write('{"event": "send", "torn')  # a torn last line is ignored
    copies, others = ChatView([journal]).copies("fk", "c1", "<<A>>", "<</A>>", DISCORD_LIKE)
    assert [(c.text, c.complete, c.marked) for c in copies] == [
        ("<<A>> part one part two <</A>>", True, False),
        ("<<A>> part one part two <</A>>", True, True),
        ("<<A>> lonely", False, False),
    ]
    assert [m.text for m in others] == ["unrelated"]


def test_a_copy_is_read_with_marked_resends_superseding_ghosts() -> None:
    from oncewire.testing.fake_platform import Copy

    # chunk two landed cut short (a preview whose acknowledgement was lost), then was re-sent
    copy = Copy(
        texts=["<<A>> one ", "two (wh", "two (whole) ", "three <</A>>"],
        piece_marks=[False, False, True, False],
        complete=True,
    )
    assert copy.text_as_read == "<<A>> one two (whole) three <</A>>"
    # a chunk landed whole and was re-sent whole
    again = Copy(
        texts=["<<A>> one ", "two ", "two ", "<</A>>"], piece_marks=[False, False, True, False]
    )
    assert again.text_as_read == "<<A>> one two <</A>>"
    assert again.text == "<<A>> one two two <</A>>"
