"""Withdrawn replies: an answer interrupted before its commit takes its previews back.

The withdrawal is written on the record (a commit with no chunk) before any operation, so the
normal convergence deletes every preview message (or edits it to a one-line note where the
platform cannot delete), a crash part-way is finished by recovery, and the record ends
``withdrawn``. Checked on screen (the fake's journal) and in the store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from oncewire.errors import InvalidState, ReplyConflict
from oncewire.inbound import InboundState
from oncewire.lab.suites.replies_rig import LONG_BODY, Rig, reply_text
from oncewire.replies import (
    DEFAULT_STOPPED_NOTE,
    OpKind,
    OpState,
    PlatformProfile,
    ReplyEngine,
    ReplyState,
    SendRequest,
    WireOutcome,
)
from oncewire.testing import ManualClock
from oncewire.testing.fake_platform import FakePlatform, Fault

EDIT_ONLY = PlatformProfile(
    "fk_eo", cap=4096, unit="codepoints", can_edit=True, can_delete=False, threads=False
)


class Interrupted(Exception):
    """The model stream was cut off by a newer message."""


def _cut_off(text: str, after: int) -> Iterator[str]:
    for n in range(0, len(text), 400):
        if n >= after:
            raise Interrupted
        yield text[n : n + 400]


def _preview_then_stop(engine: ReplyEngine, inbound_id: int, text: str, after: int) -> None:
    with pytest.raises(Interrupted):
        engine.stream(inbound_id, _cut_off(text, after))


@pytest.mark.parametrize("platform", ["fk_tg", "fk_dc"])
def test_a_withdrawn_reply_deletes_every_preview(tmp_path: Path, platform: str) -> None:
    with Rig(tmp_path / "rig", clock=ManualClock()) as rig:
        inbound = rig.admit(platform, "c1", "in-1").inbound
        text = reply_text("A-w", LONG_BODY)
        _preview_then_stop(rig.engine, inbound.id, text, after=4400)  # over one cap
        previews = len(rig.view().visible(platform, "c1"))
        assert previews >= 2
        done = rig.engine.withdraw(inbound.id)
        assert done.status == "withdrawn" and done.reply.state is ReplyState.WITHDRAWN
        assert rig.view().visible(platform, "c1") == []
        ops = rig.ledger.replies.ops(done.reply.id)
        deletes = [(op.slot, op.state) for op in ops if op.kind is OpKind.DELETE]
        assert deletes == [(slot, OpState.ACKED) for slot in range(previews)]
        # The inbound's status is the caller's (superseded, say); the record refuses an answer.
        assert rig.ledger.inbound.get(inbound.id).status is InboundState.ANSWERING
        with pytest.raises(ReplyConflict):
            rig.answer(inbound.id, text)
        assert rig.transcript(inbound.id) == []  # the caller's rows rolled back with it
        assert rig.engine.withdraw(inbound.id).status == "withdrawn"  # again: nothing to do


def test_where_messages_cannot_be_deleted_each_preview_says_it_stopped(tmp_path: Path) -> None:
    clock = ManualClock()
    with Rig(tmp_path / "rig", clock=clock) as rig:
        fake = FakePlatform(rig.folder / "fk_eo.jsonl", EDIT_ONLY, name="fk_eo")
        engine = ReplyEngine(rig.ledger, {"fk_eo": fake}, edit_interval_seconds=0.0)
        try:
            inbound = rig.ledger.inbound.admit("fk_eo", "bot", "c1", "in-1", {}).inbound
            _preview_then_stop(engine, inbound.id, "x" * 6000, after=4400)
            done = engine.withdraw(inbound.id)
            assert done.status == "withdrawn"
            shown = [m.text for m in rig.view().visible("fk_eo", "c1")]
            assert shown == [DEFAULT_STOPPED_NOTE, DEFAULT_STOPPED_NOTE]
        finally:
            fake.close()


def test_a_reply_with_no_preview_is_withdrawn_without_a_call(tmp_path: Path) -> None:
    with Rig(tmp_path / "rig", clock=ManualClock()) as rig:
        inbound = rig.admit("fk_ne", "c1", "in-1").inbound
        done = rig.engine.withdraw(inbound.id)
        assert done.status == "withdrawn"
        assert rig.ledger.replies.ops(done.reply.id) == []
        assert rig.platforms["fk_ne"].calls == []


def test_a_committed_answer_is_delivered_not_withdrawn(tmp_path: Path) -> None:
    faults = [Fault("rate_limit", retry_after=600.0)]  # the answer waits, undelivered
    with Rig(tmp_path / "rig", clock=ManualClock(), faults=faults) as rig:
        inbound = rig.admit("fk_tg", "c1", "in-1").inbound
        assert rig.answer(inbound.id, reply_text("A-c", "kept")).status == "scheduled"
        with pytest.raises(InvalidState, match="committed answer is delivered"):
            rig.engine.withdraw(inbound.id)
        reply = rig.ledger.replies.for_inbound(inbound.id)
        assert reply is not None and reply.state is ReplyState.COMMITTED
        assert reply.final_text == reply_text("A-c", "kept")


def test_a_withdrawal_cut_short_is_finished_by_recovery(tmp_path: Path) -> None:
    folder = tmp_path / "rig"
    text = reply_text("A-r", LONG_BODY)
    # The first delete times out (it may have landed); the engine gives the reply back with a
    # long backoff, as a process that died mid-withdrawal would leave it.
    faults = [Fault("timeout", op="delete")]
    with Rig(folder, clock=ManualClock(), faults=faults, inline_wait_max_seconds=0.0) as rig:
        inbound = rig.admit("fk_tg", "c1", "in-1").inbound
        _preview_then_stop(rig.engine, inbound.id, text, after=4400)
        assert rig.engine.withdraw(inbound.id).status == "scheduled"
        assert len(rig.view().visible("fk_tg", "c1")) == 2
    with Rig(folder, clock=ManualClock(start=1_800_010_000.0)) as again:
        report = again.engine.recover()
        reply = again.ledger.replies.for_inbound(inbound.id)
        assert reply is not None and report.withdrawn == [reply.id]
        assert reply.state is ReplyState.WITHDRAWN
        assert again.view().visible("fk_tg", "c1") == []


class ProcessDied(BaseException):
    """The process running the engine died in the middle of a platform call."""


class DiesDuringDelete:
    """The fake, behind an adapter whose process dies once the platform performed a delete:
    the operation stays in flight on the record, as a SIGKILL leaves it."""

    def __init__(self, fake: FakePlatform) -> None:
        self.fake = fake

    @property
    def profile(self) -> PlatformProfile:
        return self.fake.profile

    def send(self, request: SendRequest, body: str, *, marked: bool) -> WireOutcome:
        return self.fake.send(request, body, marked=marked)

    def edit(
        self, request: SendRequest, message_id: str, body: str, *, marked: bool
    ) -> WireOutcome:
        return self.fake.edit(request, message_id, body, marked=marked)

    def delete(self, request: SendRequest, message_id: str) -> WireOutcome:
        self.fake.delete(request, message_id)
        raise ProcessDied


def test_a_process_that_dies_mid_withdrawal_is_finished_by_the_next(tmp_path: Path) -> None:
    clock = ManualClock()
    with Rig(tmp_path / "rig", clock=clock) as rig:
        dying = ReplyEngine(
            rig.ledger,
            {"fk_tg": DiesDuringDelete(rig.platforms["fk_tg"])},
            owner="first-life",
            edit_interval_seconds=0.0,
        )
        inbound = rig.admit("fk_tg", "c1", "in-1").inbound
        _preview_then_stop(dying, inbound.id, reply_text("A-d", LONG_BODY), after=4400)
        with pytest.raises(ProcessDied):
            dying.withdraw(inbound.id)
        reply = rig.ledger.replies.for_inbound(inbound.id)
        assert reply is not None and reply.withdrawal and reply.state is ReplyState.COMMITTED
        ops = rig.ledger.replies.ops(reply.id)
        assert [(op.kind, op.state) for op in ops][-1] == (OpKind.DELETE, OpState.IN_FLIGHT)
        assert len(rig.view().visible("fk_tg", "c1")) == 1  # the first delete did land

        clock.advance(dying.lease_seconds + 1)  # the dead engine's lease runs out
        report = rig.engine.recover()
        assert report.released == [reply.id] and report.withdrawn == [reply.id]
        assert rig.ledger.replies.get(reply.id).state is ReplyState.WITHDRAWN
        assert rig.view().visible("fk_tg", "c1") == []
        deletes = [
            (op.slot, op.state)
            for op in rig.ledger.replies.ops(reply.id)
            if op.kind is OpKind.DELETE
        ]
        # The call in flight at the death may have landed (it did): ambiguous, then replayed.
        assert deletes == [(0, OpState.AMBIGUOUS), (0, OpState.ACKED), (1, OpState.ACKED)]
