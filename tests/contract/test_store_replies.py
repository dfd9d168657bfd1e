"""Store contract: inbound admission, reply records and wire operations."""

from __future__ import annotations

import pytest

from oncewire.core.errors import InboundNotFound, InvalidState
from oncewire.storage import Store
from oncewire.storage.replies import (
    InboundState,
    OpKind,
    OpState,
    ReplyOpening,
    ReplyState,
    SendRequest,
)

from .conftest import T0, RawDatabase

REQUEST = SendRequest("tg", "bot1", "chat1", "", reply_to="in-1", format="plain")


def _admit(store: Store, message_id: str = "in-1", now: float = T0) -> int:
    inbound, _ = store.admit_inbound(
        platform="tg",
        bot="bot1",
        chat="chat1",
        thread="",
        platform_message_id=message_id,
        payload_json='{"text":"hi"}',
        digest="d",
        now=now,
    )
    return inbound.id


def _commit(store: Store, inbound_id: int, text: str = "hello") -> int:
    with store.transaction() as tx:
        reply, changed = store.commit_reply_in_tx(
            tx,
            ReplyOpening(inbound_id, REQUEST, 4096, "utf16", 5),
            final_text=text,
            plan_json='[{"body":"hello"}]',
            planned_sends=[(0, text)],
            now=T0,
        )
    assert changed
    return reply.id


def test_admission_is_once_and_counts_redeliveries(store: Store, raw: RawDatabase) -> None:
    first, new = store.admit_inbound(
        platform="tg",
        bot="bot1",
        chat="chat1",
        thread="t",
        platform_message_id="42",
        payload_json="{}",
        digest="d",
        now=T0,
    )
    again, again_new = store.admit_inbound(
        platform="tg",
        bot="bot1",
        chat="chat1",
        thread="t",
        platform_message_id="42",
        payload_json="{}",
        digest="d",
        now=T0 + 1,
    )
    assert new and not again_new
    assert again.id == first.id and again.deliveries == 2
    assert first.status is InboundState.RECEIVED
    assert raw.count("oncewire_inbound") == 1
    # The same message id in another thread is another message.
    other, other_new = store.admit_inbound(
        platform="tg",
        bot="bot1",
        chat="chat1",
        thread="u",
        platform_message_id="42",
        payload_json="{}",
        digest="d",
        now=T0,
    )
    assert other_new and other.id != first.id
    assert store.get_inbound(first.id) == again
    assert [i.id for i in store.list_inbound(statuses=[InboundState.RECEIVED])] == [
        first.id,
        other.id,
    ]


def test_start_and_quarantine(store: Store) -> None:
    inbound_id = _admit(store)
    started = store.start_inbound(inbound_id, now=T0)
    assert started.status is InboundState.ANSWERING and started.attempts == 1
    quarantined = store.quarantine_inbound(inbound_id, reason="crashed 3 times", now=T0)
    assert quarantined.status is InboundState.QUARANTINED
    assert quarantined.last_error == "crashed 3 times"
    with pytest.raises(InboundNotFound):
        store.start_inbound(999, now=T0)


def test_open_then_commit_keeps_one_record(store: Store, raw: RawDatabase) -> None:
    inbound_id = _admit(store)
    opened = store.open_reply(ReplyOpening(inbound_id, REQUEST, 4096, "utf16", 5), now=T0)
    assert opened.state is ReplyState.OPEN and opened.final_text is None
    assert store.get_inbound(inbound_id).status is InboundState.ANSWERING  # type: ignore[union-attr]
    again = store.open_reply(ReplyOpening(inbound_id, REQUEST, 4096, "utf16", 5), now=T0)
    assert again.id == opened.id
    reply_id = _commit(store, inbound_id)
    assert reply_id == opened.id
    reply = store.get_reply(reply_id)
    assert reply is not None and reply.state is ReplyState.COMMITTED
    assert reply.request == REQUEST
    assert store.reply_for_inbound(inbound_id) == reply
    assert store.get_inbound(inbound_id).status is InboundState.ANSWERED  # type: ignore[union-attr]
    ops = store.reply_ops(reply_id)
    assert [(o.kind, o.state, o.slot) for o in ops] == [(OpKind.SEND, OpState.PLANNED, 0)]
    # A second commit changes nothing and says so.
    with store.transaction() as tx:
        same, changed = store.commit_reply_in_tx(
            tx,
            ReplyOpening(inbound_id, REQUEST, 4096, "utf16", 5),
            final_text="other",
            plan_json="[]",
            planned_sends=[(0, "other")],
            now=T0,
        )
    assert not changed and same.final_text == "hello"
    assert raw.count("oncewire_replies") == 1 and raw.count("oncewire_reply_ops") == 1


def test_commit_outside_a_transaction_is_refused(store: Store) -> None:
    inbound_id = _admit(store)
    with pytest.raises(InvalidState):
        store.commit_reply_in_tx(
            None,  # type: ignore[arg-type]
            ReplyOpening(inbound_id, REQUEST, 10, "utf16", 1),
            final_text="x",
            plan_json="[]",
            planned_sends=[],
            now=T0,
        )


def test_ops_move_planned_in_flight_acked(store: Store, raw: RawDatabase) -> None:
    reply_id = _commit(store, _admit(store))
    op = store.begin_op(
        reply_id, slot=0, kind=OpKind.SEND, body="hello", marked=False, message_id=None, now=T0
    )
    assert op.state is OpState.IN_FLIGHT and op.seq == 1  # the planned op, not a new one
    done = store.end_op(op.id, state=OpState.ACKED, message_id="m1", now=T0, deliver=True)
    assert done.state is OpState.ACKED and done.message_id == "m1"
    reply = store.get_reply(reply_id)
    assert reply is not None and reply.state is ReplyState.DELIVERED
    assert store.get_inbound(reply.inbound_id).status is InboundState.DELIVERED  # type: ignore[union-attr]
    with pytest.raises(InvalidState):
        store.end_op(op.id, state=OpState.ACKED, message_id="m1", now=T0)
    # The schema refuses a second acknowledged send of the same slot.
    with pytest.raises(raw.integrity_errors):
        raw.execute(
            "INSERT INTO oncewire_reply_ops (reply_id, seq, slot, kind, body, state, "
            "message_id, created_at, updated_at) "
            "VALUES (?, 9, 0, 'send', 'x', 'acked', 'm2', ?, ?)",
            (reply_id, T0, T0),
        )


def test_failed_attempts_count_and_leases(store: Store) -> None:
    reply_id = _commit(store, _admit(store))
    op = store.begin_op(
        reply_id, slot=0, kind=OpKind.SEND, body="hello", marked=False, message_id=None, now=T0
    )
    store.end_op(op.id, state=OpState.AMBIGUOUS, error="timeout", now=T0, count_attempt=True)
    reply = store.get_reply(reply_id)
    # The attempt counts; the marker is decided by the next send, not by the failure.
    assert reply is not None and reply.attempts == 1 and not reply.marked
    assert store.claim_reply(reply_id, owner="a", now=T0, lease_seconds=10) is not None
    assert store.claim_reply(reply_id, owner="b", now=T0, lease_seconds=10) is None
    claimed = store.get_reply(reply_id)
    assert claimed is not None and claimed.lease_owner == "a"
    assert store.claim_reply(reply_id, owner="b", now=T0, lease_seconds=10, dead_owners=["a"])
    store.release_reply(reply_id, owner="b", now=T0, not_before=T0 + 60, last_error="429")
    reply = store.get_reply(reply_id)
    assert reply is not None and reply.lease_owner is None and reply.not_before == T0 + 60
    assert store.list_replies(states=[ReplyState.COMMITTED], due_before=T0) == []
    assert [r.id for r in store.list_replies(due_before=T0 + 60)] == [reply_id]
    finished = store.finish_reply(reply_id, state=ReplyState.DEAD, now=T0, last_error="gave up")
    assert finished.state is ReplyState.DEAD and finished.last_error == "gave up"
    assert store.count_replies()[ReplyState.DEAD] == 1
    with pytest.raises(InvalidState):
        store.finish_reply(reply_id, state=ReplyState.OPEN, now=T0)


def test_an_edit_ack_can_ride_on_the_next_write(store: Store) -> None:
    reply_id = _commit(store, _admit(store))
    send = store.begin_op(
        reply_id, slot=0, kind=OpKind.SEND, body="hello", marked=False, message_id=None, now=T0
    )
    store.end_op(send.id, state=OpState.ACKED, message_id="m1", now=T0)
    edit = store.begin_op(
        reply_id, slot=0, kind=OpKind.EDIT, body="hello!", marked=False, message_id="m1", now=T0
    )
    again = store.begin_op(
        reply_id,
        slot=0,
        kind=OpKind.EDIT,
        body="hello!!",
        marked=False,
        message_id="m1",
        now=T0,
        settle=(edit.id, "m1"),
    )
    assert [op.state for op in store.reply_ops(reply_id)] == [
        OpState.ACKED,
        OpState.ACKED,
        OpState.IN_FLIGHT,
    ]
    store.finish_reply(reply_id, state=ReplyState.DELIVERED, now=T0, settle=(again.id, "m1"))
    assert all(op.state is OpState.ACKED for op in store.reply_ops(reply_id))


def test_a_quarantined_message_stays_quarantined_when_its_reply_is_delivered(
    store: Store, raw: RawDatabase
) -> None:
    """Its reply is the note that it was set aside: delivering it does not make the message
    ``delivered`` (nor does committing it make it ``answered``)."""
    inbound_id = _admit(store)
    store.start_inbound(inbound_id, now=T0)
    store.quarantine_inbound(inbound_id, reason="answering started 3 times", now=T0)
    reply_id = _commit(store, inbound_id, "set aside")
    assert raw.query("SELECT status FROM oncewire_inbound") == [("quarantined",)]
    store.finish_reply(reply_id, state=ReplyState.DELIVERED, now=T0 + 1)
    assert raw.query("SELECT status, last_error FROM oncewire_inbound") == [
        ("quarantined", "answering started 3 times")
    ]
    assert raw.query("SELECT state FROM oncewire_replies") == [("delivered",)]
