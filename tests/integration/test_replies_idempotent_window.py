"""A platform that drops a repeated idempotency key (a Discord nonce, a webhook honouring
``Idempotency-Key``): inside ``PlatformProfile.idempotent_send_window_seconds`` a send that may
have landed is repeated unmarked, with the same body and key, and the chat shows it once.
Outside the window (or on a platform without one) the repeat is marked, as before."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from oncewire import Ledger
from oncewire.errors import ConfigurationError
from oncewire.replies import (
    OpKind,
    OpState,
    PlatformProfile,
    ReplyEngine,
    SendRequest,
    idempotency_key,
)
from oncewire.testing import ManualClock
from oncewire.testing.fake_platform import ChatView, FakePlatform, Fault


def _profile(window: float, *, editable: bool = False) -> PlatformProfile:
    return PlatformProfile(
        "fk_key",
        cap=4096,
        unit="codepoints",
        can_edit=editable,
        can_delete=editable,
        threads=False,
        idempotent_send_window_seconds=window,
    )


class Recording(FakePlatform):
    """The fake, remembering the idempotency key of every send it was handed."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.keys: list[str | None] = []

    def send(self, request: SendRequest, body: str, *, marked: bool):  # type: ignore[no-untyped-def]
        self.keys.append(request.idempotency_key)
        return super().send(request, body, marked=marked)


@contextmanager
def _engine(
    tmp_path: Path,
    window: float,
    *,
    honour_keys: bool,
    faults: list[Fault],
    editable: bool = False,
) -> Iterator[tuple[Ledger, ReplyEngine, Recording, ManualClock]]:
    clock = ManualClock()
    ledger = Ledger(str(tmp_path / "app.db"), clock=clock)
    fake = Recording(
        tmp_path / "fk_key.jsonl",
        _profile(window, editable=editable),
        name="fk_key",
        faults=faults,
        honour_keys=honour_keys,
    )
    try:
        yield (
            ledger,
            ReplyEngine(ledger, {"fk_key": fake}, inline_wait_max_seconds=1e6),
            fake,
            clock,
        )
    finally:
        fake.close()
        ledger.close()


def _shown(tmp_path: Path) -> list[str]:
    return [m.text for m in ChatView([tmp_path / "fk_key.jsonl"]).visible("fk_key", "c1")]


def test_inside_the_window_a_lost_ack_is_repeated_unmarked_and_shows_once(tmp_path: Path) -> None:
    faults = [Fault("ack_lost", op="send")]  # accepted and journaled; the answer is lost
    with _engine(tmp_path, math.inf, honour_keys=True, faults=faults) as (ledger, engine, fake, _):
        inbound = ledger.inbound.admit("fk_key", "bot", "c1", "in-1", {}).inbound
        done = engine.answer(inbound.id, "the answer")
        assert done.status == "delivered" and not done.reply.marked
        sends = [op for op in ledger.replies.ops(done.reply.id) if op.kind is OpKind.SEND]
        assert [(op.state, op.marked, op.body) for op in sends] == [
            (OpState.AMBIGUOUS, False, "the answer"),
            (OpState.ACKED, False, "the answer"),
        ]
        assert len(fake.keys) == 2 and fake.keys[0] == fake.keys[1] is not None
        assert _shown(tmp_path) == ["the answer"]  # the platform dropped the repeat


def test_a_repeated_preview_send_is_then_edited_to_the_answer(tmp_path: Path) -> None:
    """Seed 002's F14 on a platform that drops a repeated key (Discord): the first preview's
    send times out unapplied; the final delivery repeats that send with its own body and key
    (the platform may hold it), and must then edit the message to the committed answer: the
    repeat is not the last step, even when it is the only one planned."""
    faults = [Fault("timeout", op="send")]  # read, never applied, no answer
    with _engine(tmp_path, math.inf, honour_keys=True, faults=faults, editable=True) as (
        ledger,
        engine,
        fake,
        _,
    ):
        inbound = ledger.inbound.admit("fk_key", "bot", "c1", "in-1", {}).inbound
        reply = engine.open(inbound.id)
        assert not engine.preview(reply, "the start").previewing
        engine.commit(inbound.id, "the start of the whole answer")
        done = engine.deliver(reply.id)
        assert done.status == "delivered", done
        assert _shown(tmp_path) == ["the start of the whole answer"]
        ops = [(op.kind, op.state, op.body) for op in ledger.replies.ops(reply.id)]
        assert ops == [
            (OpKind.SEND, OpState.AMBIGUOUS, "the start"),
            (OpKind.SEND, OpState.ACKED, "the start"),
            (OpKind.EDIT, OpState.ACKED, "the start of the whole answer"),
        ]
        assert len(fake.keys) == 2 and fake.keys[0] == fake.keys[1] is not None


@pytest.mark.parametrize("window", [0.0, 60.0])
def test_without_a_window_or_past_it_the_repeat_is_marked(tmp_path: Path, window: float) -> None:
    faults = [Fault("ack_lost", op="send")]
    # The platform keeps no key, or no longer keeps this one: a repeat is a second message.
    with _engine(tmp_path, window, honour_keys=False, faults=faults) as (
        ledger,
        engine,
        fake,
        clock,
    ):
        inbound = ledger.inbound.admit("fk_key", "bot", "c1", "in-1", {}).inbound
        with ledger.store.transaction() as tx:
            ledger.replies.commit_in_tx(tx, inbound.id, "the answer", fake.profile)
        reply = ledger.replies.for_inbound(inbound.id)
        assert reply is not None
        # The first attempt's answer is lost; the repeat comes after 120 seconds.
        engine.inline_wait_max_seconds = 0.0
        first = engine.deliver(reply.id)
        assert first.status == "scheduled"
        clock.advance(120.0)
        done = engine.deliver(reply.id, ignore_schedule=True)
        assert done.status == "delivered" and done.reply.marked
        sends = [op for op in ledger.replies.ops(reply.id) if op.kind is OpKind.SEND]
        assert [(op.state, op.marked) for op in sends] == [
            (OpState.AMBIGUOUS, False),
            (OpState.ACKED, True),
        ]
        marked = fake.profile.render("the answer", True)
        assert _shown(tmp_path) == ["the answer", marked]


def test_the_key_names_the_chat_the_message_answered_and_the_slot() -> None:
    request = SendRequest("tg", "bot", "c1", "", reply_to="m1")
    key = idempotency_key(request, "m1", 0)
    assert key == idempotency_key(SendRequest("tg", "bot", "c1"), "m1", 0)
    others = {
        idempotency_key(request, "m1", 1),
        idempotency_key(request, "m2", 0),
        idempotency_key(SendRequest("tg", "bot", "c2"), "m1", 0),
        idempotency_key(request, "m1", 0, generation=1),
    }
    assert key not in others and len(others) == 4


@pytest.mark.parametrize("window", [-1.0, math.nan, True, "60"])
def test_a_bad_window_is_refused(window: object) -> None:
    with pytest.raises(ConfigurationError, match="idempotent_send_window_seconds"):
        _profile(window)  # type: ignore[arg-type]
