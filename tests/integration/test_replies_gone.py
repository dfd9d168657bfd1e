"""A message someone else deleted: an edit or delete answered ``Gone`` makes the engine send that
chunk again as a new message, unmarked, and write the new message id on the slot. Checked on
screen (the fake's journal) and in the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from oncewire.lab.suites.replies_rig import LONG_BODY, Rig, footer, header, reply_text
from oncewire.replies import (
    TELEGRAM_LIKE,
    Gone,
    MaybeDelivered,
    OpKind,
    OpState,
    SendRequest,
)
from oncewire.replies.wire import vet_outcome
from oncewire.testing import ManualClock
from oncewire.testing.fake_platform import FakePlatform, Fault

REQ = SendRequest(platform="fk_tg", bot="bot", chat="c1")


@pytest.mark.parametrize("platform", ["fk_tg", "fk_dc"])
@pytest.mark.parametrize(("body", "mode"), [("short answer", "many"), (LONG_BODY, "many")])
def test_a_preview_deleted_by_someone_else_is_sent_again_once(
    tmp_path: Path, platform: str, body: str, mode: str
) -> None:
    aid = "A-gone"
    faults = [Fault("gone", op="edit", contains=header(aid))]
    with Rig(tmp_path / "rig", clock=ManualClock(), faults=faults) as rig:
        inbound = rig.admit(platform, "c1", "in-1").inbound
        done = rig.answer(inbound.id, reply_text(aid, body), mode)
        assert done.status == "delivered"
        failures = rig.check(platform, "c1", aid, inbound.id, "exact")
        assert not failures, "\n".join(failures)
        ops = rig.ledger.replies.ops(done.reply.id)
        # The edit that found the message gone, and the send that had made it, are 'gone';
        # the slot's new message is the one acknowledged send.
        gone = [(op.kind, op.slot) for op in ops if op.state is OpState.GONE]
        assert gone == [(OpKind.SEND, 0), (OpKind.EDIT, 0)]
        sends = [op for op in ops if op.kind is OpKind.SEND and op.slot == 0]
        assert [op.state for op in sends] == [OpState.GONE, OpState.ACKED]
        assert not any(op.marked for op in sends)  # the lost message never showed twice
        lost, new = sends[0].message_id, sends[1].message_id
        edit = next(op for op in ops if op.kind is OpKind.EDIT and op.state is OpState.GONE)
        assert edit.message_id == lost and new is not None and new != lost
        deleted = [e for e in rig.view().operations if e["event"] == "delete"]
        assert [(e["message_id"], e.get("by")) for e in deleted] == [(lost, "someone else")]


def test_gone_on_the_final_edit_sends_the_chunk_again(tmp_path: Path) -> None:
    aid = "A-final"
    # One preview (the first delta; the cadence allows no second), then the final delivery edits
    # it to the whole text: that edit, the only one with the footer, finds the message gone.
    faults = [Fault("gone", op="edit", contains=footer(aid))]
    rig = Rig(tmp_path / "rig", clock=ManualClock(), faults=faults, edit_interval_seconds=1e6)
    with rig:
        inbound = rig.admit("fk_tg", "c1", "in-1").inbound
        done = rig.answer(inbound.id, reply_text(aid, "the final answer " * 5), "many")
        assert done.status == "delivered"
        failures = rig.check("fk_tg", "c1", aid, inbound.id, "exact")
        assert not failures, "\n".join(failures)
        ops = rig.ledger.replies.ops(done.reply.id)
        steps = [(op.kind, op.state) for op in ops]
        assert steps == [
            (OpKind.SEND, OpState.GONE),  # the preview, deleted by someone else
            (OpKind.EDIT, OpState.GONE),
            (OpKind.SEND, OpState.ACKED),  # the whole text, unmarked
        ]
        assert not ops[-1].marked and not done.reply.marked


def test_the_fake_answers_gone_for_an_edit_of_a_deleted_message(tmp_path: Path) -> None:
    tg = FakePlatform(tmp_path / "tg.jsonl", TELEGRAM_LIKE, name="fk_tg")
    try:
        sent = tg.send(REQ, "hello", marked=False)
        assert tg.delete(REQ, "1").__class__.__name__ == "Delivered"
        assert sent.__class__.__name__ == "Delivered"
        assert isinstance(tg.edit(REQ, "1", "hello again", marked=False), Gone)
    finally:
        tg.close()


def test_a_gone_fault_never_matches_a_send(tmp_path: Path) -> None:
    tg = FakePlatform(tmp_path / "tg.jsonl", TELEGRAM_LIKE, name="fk_tg", faults=[Fault("gone")])
    try:
        assert tg.send(REQ, "hello", marked=False).__class__.__name__ == "Delivered"
        assert isinstance(tg.edit(REQ, "1", "edited", marked=False), Gone)
        assert tg.edit(REQ, "1", "edited", marked=False).__class__.__name__ == "Gone"
    finally:
        tg.close()


def test_gone_from_a_send_is_a_programming_error(caplog: pytest.LogCaptureFixture) -> None:
    answer = vet_outcome(Gone(), "send", reply_id=7)
    assert isinstance(answer, MaybeDelivered)
    assert "Gone from a send" in answer.reason
    assert vet_outcome(Gone("x"), "edit", reply_id=7) == Gone("x")
    assert vet_outcome(Gone("x"), "delete", reply_id=7) == Gone("x")
