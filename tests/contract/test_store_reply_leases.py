"""Store contract: the reply verbs' leases, fences, planning and listings, checked in the rows."""

from __future__ import annotations

import pytest

from oncewire.core.errors import StaleFence
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

REQUEST = SendRequest("tg", "bot1", "chat1", "", reply_to=None, format="plain")


def _admit(store: Store, message_id: str) -> int:
    inbound, _ = store.admit_inbound(
        platform="tg",
        bot="bot1",
        chat="chat1",
        thread="",
        platform_message_id=message_id,
        payload_json="{}",
        digest="d",
        now=T0,
    )
    return inbound.id


def _commit(store: Store, inbound_id: int, sends: list[tuple[int, str]]) -> int:
    with store.transaction() as tx:
        reply, changed = store.commit_reply_in_tx(
            tx,
            ReplyOpening(inbound_id, REQUEST, 4096, "utf16", 5),
            final_text="".join(body for _, body in sends),
            plan_json="[]",
            planned_sends=sends,
            now=T0,
        )
    assert changed
    return reply.id


def _reply_row(raw: RawDatabase, reply_id: int) -> tuple[str | None, float | None, bool, str]:
    ((owner, expires, marked, state),) = raw.query(
        "SELECT lease_owner, lease_expires_at, marked, state FROM oncewire_replies WHERE id = ?",
        (reply_id,),
    )
    return owner, expires, bool(marked), state


def _ops(raw: RawDatabase, reply_id: int) -> list[tuple[int, int, str, str, bool]]:
    rows = raw.query(
        "SELECT seq, slot, kind, state, marked FROM oncewire_reply_ops WHERE reply_id = ? "
        "ORDER BY seq",
        (reply_id,),
    )
    return [(seq, slot, kind, state, bool(marked)) for seq, slot, kind, state, marked in rows]


def test_an_operation_under_a_lease_keeps_the_lease_and_the_marker(
    store: Store, raw: RawDatabase
) -> None:
    reply_id = _commit(store, _admit(store, "m"), [(0, "a")])
    store.begin_op(
        reply_id,
        slot=0,
        kind=OpKind.SEND,
        body="a",
        marked=True,
        message_id=None,
        now=T0,
        owner="w1",
        lease_seconds=30,
    )
    assert _reply_row(raw, reply_id) == ("w1", T0 + 30, True, "committed")
    # An unmarked operation later does not take the reply's marker back.
    store.begin_op(
        reply_id,
        slot=1,
        kind=OpKind.SEND,
        body="b",
        marked=False,
        message_id=None,
        now=T0 + 1,
        owner="w1",
        lease_seconds=30,
    )
    assert _reply_row(raw, reply_id) == ("w1", T0 + 31, True, "committed")
    assert _ops(raw, reply_id) == [
        (1, 0, "send", "in_flight", True),  # the planned send, put in flight
        (2, 1, "send", "in_flight", False),  # a new operation, next in sequence
    ]


def test_an_operation_is_refused_while_another_live_owner_holds_the_reply(
    store: Store, raw: RawDatabase
) -> None:
    reply_id = _commit(store, _admit(store, "m"), [(0, "a")])
    assert store.claim_reply(reply_id, owner="w1", now=T0, lease_seconds=30) is not None
    with pytest.raises(StaleFence):
        store.begin_op(
            reply_id,
            slot=0,
            kind=OpKind.SEND,
            body="a",
            marked=True,
            message_id=None,
            now=T0 + 1,
            owner="w2",
        )
    # Nothing of the refused operation was written: not the lease, the marker or the op.
    assert _reply_row(raw, reply_id) == ("w1", T0 + 30, False, "committed")
    assert _ops(raw, reply_id) == [(1, 0, "send", "planned", False)]
    # Once the lease expired another owner takes it over.
    store.begin_op(
        reply_id,
        slot=0,
        kind=OpKind.SEND,
        body="a",
        marked=False,
        message_id=None,
        now=T0 + 31,
        owner="w2",
        lease_seconds=30,
    )
    assert _reply_row(raw, reply_id) == ("w2", T0 + 61, False, "committed")


def test_a_finished_reply_takes_no_operation_and_no_claim(store: Store, raw: RawDatabase) -> None:
    reply_id = _commit(store, _admit(store, "m"), [(0, "a")])
    store.finish_reply(reply_id, state=ReplyState.DEAD, now=T0, last_error="gave up")
    with pytest.raises(StaleFence):
        store.begin_op(
            reply_id,
            slot=0,
            kind=OpKind.SEND,
            body="a",
            marked=False,
            message_id=None,
            now=T0,
            owner="w1",
        )
    assert store.claim_reply(reply_id, owner="w1", now=T0, lease_seconds=30) is None
    assert _reply_row(raw, reply_id) == (None, None, False, "dead")
    assert _ops(raw, reply_id) == [(1, 0, "send", "planned", False)]


def test_only_a_dead_owners_lease_is_taken_over_early(store: Store, raw: RawDatabase) -> None:
    reply_id = _commit(store, _admit(store, "m"), [(0, "a")])
    assert store.claim_reply(reply_id, owner="w1", now=T0, lease_seconds=30) is not None
    assert (
        store.claim_reply(reply_id, owner="w2", now=T0 + 1, lease_seconds=30, dead_owners=["w3"])
        is None
    )
    assert _reply_row(raw, reply_id)[0] == "w1"
    taken = store.claim_reply(
        reply_id, owner="w2", now=T0 + 1, lease_seconds=30, dead_owners=["w3", "w1"]
    )
    assert taken is not None and taken.lease_owner == "w2"
    assert _reply_row(raw, reply_id)[:2] == ("w2", T0 + 31)


def test_a_stale_sequence_refuses_the_operation_and_its_settlement(
    store: Store, raw: RawDatabase
) -> None:
    reply_id = _commit(store, _admit(store, "m"), [(0, "a")])
    send = store.begin_op(
        reply_id, slot=0, kind=OpKind.SEND, body="a", marked=False, message_id=None, now=T0
    )
    with pytest.raises(StaleFence):
        store.begin_op(
            reply_id,
            slot=0,
            kind=OpKind.EDIT,
            body="a!",
            marked=False,
            message_id="m1",
            now=T0,
            settle=(send.id, "m1"),
            expect_seq=0,  # read before the send began
        )
    rows = raw.query(
        "SELECT state, message_id FROM oncewire_reply_ops WHERE reply_id = ?", (reply_id,)
    )
    assert rows == [("in_flight", None)]  # the settlement rolled back with the refusal
    edit = store.begin_op(
        reply_id,
        slot=0,
        kind=OpKind.EDIT,
        body="a!",
        marked=False,
        message_id="m1",
        now=T0,
        settle=(send.id, "m1"),
        expect_seq=1,
    )
    assert edit.seq == 2
    assert [(op.state, op.message_id) for op in store.reply_ops(reply_id)] == [
        (OpState.ACKED, "m1"),
        (OpState.IN_FLIGHT, "m1"),
    ]


def test_commit_plans_only_the_slots_a_preview_did_not_send(store: Store, raw: RawDatabase) -> None:
    inbound_id = _admit(store, "m")
    opened = store.open_reply(ReplyOpening(inbound_id, REQUEST, 4096, "utf16", 5), now=T0)
    preview = store.begin_op(
        opened.id, slot=0, kind=OpKind.SEND, body="pre", marked=False, message_id=None, now=T0
    )
    store.end_op(preview.id, state=OpState.ACKED, message_id="p0", now=T0)
    assert _commit(store, inbound_id, [(0, "a"), (1, "b"), (2, "c")]) == opened.id
    assert _ops(raw, opened.id) == [
        (1, 0, "send", "acked", False),
        (2, 1, "send", "planned", False),
        (3, 2, "send", "planned", False),
    ]
    assert raw.query("SELECT status FROM oncewire_inbound WHERE id = ?", (inbound_id,)) == [
        ("answered",)
    ]


def test_listings_filter_and_order(store: Store) -> None:
    ids = [_admit(store, f"m{n}") for n in range(4)]
    store.start_inbound(ids[1], now=T0)
    store.quarantine_inbound(ids[2], reason="bad", now=T0)
    assert [i.id for i in store.list_inbound()] == ids
    assert [
        i.id for i in store.list_inbound(statuses=[InboundState.RECEIVED, InboundState.QUARANTINED])
    ] == [ids[0], ids[2], ids[3]]
    assert [i.id for i in store.list_inbound(after_id=ids[0], limit=2)] == ids[1:3]

    opened = store.open_reply(ReplyOpening(ids[0], REQUEST, 4096, "utf16", 5), now=T0)
    first = _commit(store, ids[1], [(0, "a")])
    second = _commit(store, ids[3], [(0, "b")])
    assert [r.id for r in store.list_replies(states=[ReplyState.OPEN])] == [opened.id]
    assert [r.id for r in store.list_replies(states=[ReplyState.COMMITTED])] == [first, second]
    # Due replies come soonest first, then by id; replies due later are left out.
    assert store.claim_reply(first, owner="w", now=T0, lease_seconds=10)
    store.release_reply(first, owner="w", now=T0, not_before=T0 + 20)
    assert store.claim_reply(opened.id, owner="w", now=T0, lease_seconds=10)
    store.release_reply(opened.id, owner="w", now=T0, not_before=T0 + 10)
    assert [r.id for r in store.list_replies(due_before=T0 + 20)] == [second, opened.id, first]
    assert [r.id for r in store.list_replies(due_before=T0 + 15)] == [second, opened.id]
    assert [
        r.id for r in store.list_replies(states=[ReplyState.COMMITTED], due_before=T0 + 20)
    ] == [second, first]
    assert [r.id for r in store.list_replies(due_before=T0 + 20, after_id=second)] == []
    assert [r.id for r in store.list_replies(due_before=T0 + 20, limit=1)] == [second]
    counts = store.count_replies()
    assert counts[ReplyState.OPEN] == 1 and counts[ReplyState.COMMITTED] == 2
