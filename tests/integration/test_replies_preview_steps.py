"""The reply engine's steps used one by one (open, preview, commit, deliver), as a gateway
does: a previewer thread owns the preview operations while the turn worker commits the answer.

A preview parked on a slow platform holds no database lock, so the commit of the answer goes
through meanwhile; the parked operation's outcome is recorded whenever the platform answers,
and the delivery then brings the chat to exactly one copy. Checked in the store (both
backends) and on screen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from oncewire.inbound import InboundState
from oncewire.lab.suites.replies_rig import Rig, footer, header, reply_text
from oncewire.replies import OpKind, OpState, PreviewPass, ReplyState
from oncewire.testing import ManualClock
from oncewire.testing.fake_platform import Fault


def _wait_for(predicate: Callable[[], bool], what: str) -> None:
    # A bounded wait for another thread to reach a state; no timing is asserted.
    deadline = time.monotonic() + 30.0
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_parked_preview_never_blocks_the_commit(tmp_path: Path, store_url: str) -> None:
    aid = "A-park"
    text = reply_text(aid, "the whole answer, committed while a preview is parked")
    # The second preview (an edit) parks on the platform until released.
    faults = [Fault("hold", op="edit", contains=header(aid), hold_seconds=60.0)]
    with ExitStack() as stack:
        rig = stack.enter_context(
            Rig(tmp_path / "rig", clock=ManualClock(), faults=faults, db=store_url)
        )
        inbound = rig.admit("fk_tg", "c1", "in-1").inbound
        reply = rig.engine.open(inbound.id)
        assert reply.state is ReplyState.OPEN and reply.lease_owner in (None, rig.engine.owner)
        assert rig.engine.preview(reply, text[:20]) == PreviewPass(True)

        parked: list[PreviewPass] = []
        previewer = threading.Thread(
            target=lambda: parked.append(rig.engine.preview(reply.id, text[:40])), daemon=True
        )
        previewer.start()
        stack.callback(previewer.join, 60.0)
        stack.callback(rig.platforms["fk_tg"].release_holds)

        def edit_in_flight() -> bool:
            ops = rig.ledger.replies.ops(reply.id)
            return any(op.kind is OpKind.EDIT and op.state is OpState.IN_FLIGHT for op in ops)

        _wait_for(edit_in_flight, "the preview edit to park")
        committed = rig.engine.commit(
            inbound.id, text, on_commit=lambda tx, final: rig._persist(tx, inbound.id, final)
        )
        # The answer is durable while the preview is still parked on the platform.
        assert committed.state is ReplyState.COMMITTED and committed.final_text == text
        assert rig.ledger.replies.get(reply.id).state is ReplyState.COMMITTED
        assert rig.ledger.inbound.get(inbound.id).status is InboundState.ANSWERED
        assert rig.transcript(inbound.id) == [text]
        ops = rig.ledger.replies.ops(reply.id)
        assert [(op.kind, op.state) for op in ops] == [
            (OpKind.SEND, OpState.ACKED),
            (OpKind.EDIT, OpState.IN_FLIGHT),
        ]
        assert previewer.is_alive()

        rig.platforms["fk_tg"].release_holds()
        previewer.join(60.0)
        assert parked == [PreviewPass(False)]  # a timeout: the delivery repairs it
        edit = rig.ledger.replies.ops(reply.id)[1]
        assert edit.state is OpState.AMBIGUOUS
        # After the commit, a late preview does nothing: the delivery owns the screen.
        assert rig.engine.preview(reply, text[:50]) == PreviewPass(False)
        assert len(rig.ledger.replies.ops(reply.id)) == 2

        done = rig.engine.deliver(reply.id)
        assert done.status == "delivered"
        failures = rig.check("fk_tg", "c1", aid, inbound.id, "exact")
        assert not failures, "\n".join(failures)
        assert footer(aid) in rig.view().visible("fk_tg", "c1")[0].text


def test_open_returns_a_committed_record_as_it_is(tmp_path: Path) -> None:
    with Rig(tmp_path / "rig", clock=ManualClock()) as rig:
        inbound = rig.admit("fk_tg", "c1", "in-1").inbound
        rig.engine.commit(inbound.id, reply_text("A", "done"))
        reply = rig.engine.open(inbound.id)
        assert reply.state is ReplyState.COMMITTED
        assert rig.engine.preview(reply, "anything") == PreviewPass(False)
        assert rig.platforms["fk_tg"].calls == []  # nothing sent before deliver
        assert rig.engine.deliver(reply.id).status == "delivered"


def test_a_platform_that_cannot_edit_gets_no_preview(tmp_path: Path) -> None:
    with Rig(tmp_path / "rig", clock=ManualClock()) as rig:
        inbound = rig.admit("fk_ne", "c1", "in-1").inbound
        reply = rig.engine.open(inbound.id)
        assert rig.engine.preview(reply, "partial") == PreviewPass(False)
        assert rig.platforms["fk_ne"].calls == [] and rig.ledger.replies.ops(reply.id) == []
