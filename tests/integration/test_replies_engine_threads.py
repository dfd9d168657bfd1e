"""One reply engine used from two threads, as a gateway does: a turn worker delivers its
answer while a scheduler thread calls ``run_due`` on the same engine.

An operation in flight on one thread of the engine is a live call, not a dead process's
leftover: the other thread must leave the reply alone (``busy``) instead of taking it over,
marking the live call ambiguous and sending the answer a second time. Checked in the store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from oncewire.lab.suites.replies_rig import Rig, reply_text
from oncewire.replies import DeliveryPass, OpKind, OpState, ReplyState
from oncewire.testing import ManualClock
from oncewire.testing.fake_platform import Fault


def _wait_for(predicate: Callable[[], bool], what: str) -> None:
    # A bounded wait for another thread to reach a state; no timing is asserted.
    deadline = time.monotonic() + 30.0
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_run_due_leaves_a_reply_another_thread_of_the_engine_is_sending(tmp_path: Path) -> None:
    text = reply_text("A-threads", "an answer whose send is slow")
    faults = [Fault("hold", op="send", hold_seconds=60.0, times=1)]
    with ExitStack() as stack:
        rig = stack.enter_context(Rig(tmp_path / "rig", clock=ManualClock(), faults=faults))
        inbound = rig.admit("fk_tg", "c1", "in-1").inbound
        reply = rig.engine.commit(inbound.id, text)

        worker: list[DeliveryPass] = []
        thread = threading.Thread(
            target=lambda: worker.append(rig.engine.deliver(reply.id)), daemon=True
        )
        thread.start()
        stack.callback(thread.join, 60.0)
        stack.callback(rig.platforms["fk_tg"].release_holds)

        def send_in_flight() -> bool:
            ops = rig.ledger.replies.ops(reply.id)
            return any(op.kind is OpKind.SEND and op.state is OpState.IN_FLIGHT for op in ops)

        _wait_for(send_in_flight, "the worker's send to park")
        scheduler = rig.engine.run_due()

        # The scheduler left the reply to the worker: the live send is still in flight, not
        # marked as a dead process's leftover, and nothing else was sent.
        assert [p.status for p in scheduler if p.reply.id == reply.id] == ["busy"]
        ops = rig.ledger.replies.ops(reply.id)
        assert [(op.kind, op.state) for op in ops] == [(OpKind.SEND, OpState.IN_FLIGHT)]
        assert rig.ledger.replies.get(reply.id).state is ReplyState.COMMITTED

        rig.platforms["fk_tg"].release_holds()
        thread.join(60.0)
        assert [p.status for p in worker] == ["delivered"]
        assert rig.ledger.replies.get(reply.id).state is ReplyState.DELIVERED
        # The parked send was never applied (a hold), so the user sees the answer once: the
        # worker's own resend, marked because the first may have landed.
        visible = rig.view().visible("fk_tg", "c1")
        assert len(visible) == 1


def test_rate_limit_refusals_cost_no_attempt(tmp_path: Path) -> None:
    # Twelve 429s in a row, more than the reply's eight attempts: each says when to come back,
    # so the answer waits its turn and is delivered, never given up as out of attempts.
    faults = [Fault("rate_limit", op="send", times=12, retry_after=1.0)]
    with Rig(tmp_path / "rig", clock=ManualClock(), faults=faults) as rig:
        inbound = rig.admit("fk_tg", "c1", "in-1").inbound
        reply = rig.engine.commit(inbound.id, reply_text("A-429", "a busy chat's answer"))
        assert reply.max_attempts < 12

        assert rig.engine.deliver(reply.id).status == "delivered"
        stored = rig.ledger.replies.get(reply.id)
        assert stored.state is ReplyState.DELIVERED and stored.attempts == 0
        refused = [op for op in rig.ledger.replies.ops(reply.id) if op.state is OpState.REFUSED]
        assert len(refused) == 12
        assert len(rig.view().visible("fk_tg", "c1")) == 1
