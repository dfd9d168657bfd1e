"""Store contract: what a chat gateway adds to reply records (migration 0006).

A send whose message someone else deleted is ``gone`` with the edit that found out, so the slot
can be acknowledged as sent again; a reply withdrawn before its answer is committed with an
empty text and no chunk, and finishes ``withdrawn``. Checked in the rows, through ``raw``.
"""

from __future__ import annotations

import pytest

from oncewire.core.errors import InvalidState
from oncewire.storage import Store
from oncewire.storage.replies import (
    WITHDRAWAL_PLAN,
    InboundState,
    OpKind,
    OpState,
    ReplyOpening,
    ReplyState,
    SendRequest,
)

from .conftest import T0, RawDatabase
from .test_store_replies import REQUEST, _admit, _commit


def _withdraw(store: Store, inbound_id: int, request: SendRequest = REQUEST) -> tuple[int, bool]:
    with store.transaction() as tx:
        reply, changed = store.withdraw_reply_in_tx(
            tx,
            ReplyOpening(inbound_id, request, 4096, "utf16", 5),
            now=T0 + 1,
        )
    return reply.id, changed


def _op_rows(raw: RawDatabase, reply_id: int) -> list[tuple[object, ...]]:
    return raw.query(
        "SELECT seq, slot, kind, state, message_id FROM oncewire_reply_ops "
        "WHERE reply_id = ? ORDER BY seq",
        (reply_id,),
    )


def test_a_gone_edit_sets_the_send_it_targeted_gone(store: Store, raw: RawDatabase) -> None:
    reply_id = _commit(store, _admit(store))
    send = store.begin_op(
        reply_id, slot=0, kind=OpKind.SEND, body="hello", marked=False, message_id=None, now=T0
    )
    store.end_op(send.id, state=OpState.ACKED, message_id="m1", now=T0)
    edit = store.begin_op(
        reply_id, slot=0, kind=OpKind.EDIT, body="hello!", marked=False, message_id="m1", now=T0
    )
    gone = store.end_op(edit.id, state=OpState.GONE, error="gone: not found", now=T0 + 1)
    assert gone.state is OpState.GONE and gone.message_id == "m1"
    assert _op_rows(raw, reply_id) == [
        (1, 0, "send", "gone", "m1"),
        (2, 0, "edit", "gone", "m1"),
    ]
    # The slot may be acknowledged as sent again: its new message is the one live send.
    again = store.begin_op(
        reply_id, slot=0, kind=OpKind.SEND, body="hello!", marked=False, message_id=None, now=T0
    )
    store.end_op(again.id, state=OpState.ACKED, message_id="m2", now=T0 + 2, deliver=True)
    assert _op_rows(raw, reply_id)[-1] == (3, 0, "send", "acked", "m2")
    with pytest.raises(raw.integrity_errors):  # still one acknowledged live send per slot
        raw.execute(
            "INSERT INTO oncewire_reply_ops (reply_id, seq, slot, kind, body, state, "
            "message_id, created_at, updated_at) "
            "VALUES (?, 9, 0, 'send', 'x', 'acked', 'm3', ?, ?)",
            (reply_id, T0, T0),
        )
    with pytest.raises(raw.integrity_errors):  # the schema knows no other op state
        raw.execute("UPDATE oncewire_reply_ops SET state = 'lost' WHERE reply_id = ?", (reply_id,))


def test_an_open_reply_is_withdrawn_with_no_chunk(store: Store, raw: RawDatabase) -> None:
    inbound_id = _admit(store)
    opened = store.open_reply(ReplyOpening(inbound_id, REQUEST, 4096, "utf16", 5), now=T0)
    reply_id, changed = _withdraw(store, inbound_id)
    assert changed and reply_id == opened.id
    row = raw.query(
        "SELECT state, final_text, plan, not_before FROM oncewire_replies WHERE id = ?",
        (reply_id,),
    )
    assert row == [("committed", "", WITHDRAWAL_PLAN, T0 + 1)]
    reply = store.get_reply(reply_id)
    assert reply is not None and reply.withdrawal and reply.plan == []
    # The inbound's status is the caller's to set: withdrawing leaves it answering.
    assert raw.query("SELECT status FROM oncewire_inbound WHERE id = ?", (inbound_id,)) == [
        ("answering",)
    ]
    assert _withdraw(store, inbound_id) == (reply_id, False)  # again: unchanged
    done = store.finish_reply(reply_id, state=ReplyState.WITHDRAWN, now=T0 + 2)
    assert done.state is ReplyState.WITHDRAWN and done.lease_owner is None
    assert raw.query("SELECT state FROM oncewire_replies WHERE id = ?", (reply_id,)) == [
        ("withdrawn",)
    ]
    assert store.count_replies()[ReplyState.WITHDRAWN] == 1
    assert store.claim_reply(reply_id, owner="a", now=T0, lease_seconds=10) is None  # finished


def test_withdrawing_an_inbound_without_a_reply_creates_one(store: Store, raw: RawDatabase) -> None:
    inbound_id = _admit(store)
    _, changed = _withdraw(store, inbound_id)
    assert changed
    assert raw.query("SELECT inbound_id, state, plan FROM oncewire_replies") == [
        (inbound_id, "committed", WITHDRAWAL_PLAN)
    ]
    assert raw.count("oncewire_reply_ops") == 0
    inbound = store.get_inbound(inbound_id)
    assert inbound is not None and inbound.status is InboundState.RECEIVED


def test_a_committed_answer_is_not_withdrawn(store: Store, raw: RawDatabase) -> None:
    inbound_id = _admit(store)
    reply_id = _commit(store, inbound_id)
    assert _withdraw(store, inbound_id) == (reply_id, False)
    assert raw.query("SELECT state, final_text FROM oncewire_replies") == [("committed", "hello")]


def test_withdrawing_outside_a_transaction_is_refused(store: Store, raw: RawDatabase) -> None:
    inbound_id = _admit(store)
    with store.transaction() as tx:
        pass
    with pytest.raises(InvalidState):
        store.withdraw_reply_in_tx(
            tx,
            ReplyOpening(inbound_id, REQUEST, 4096, "utf16", 5),
            now=T0,
        )
    assert raw.count("oncewire_replies") == 0
