"""Store contract: an inbound message answered by another one's reply (migration 0006), and
the start of a turn written in the caller's transaction.

``superseded`` (interrupted by a newer message) is reached from ``received`` or
``answering``, ``merged`` (steered into a running turn) from ``received`` only; both name the
inbound message whose reply answers them in ``answered_by``, and the schema holds the link to
those two statuses. Checked in the rows, through ``raw``.
"""

from __future__ import annotations

import pytest

from oncewire.core.errors import InboundNotFound, InvalidState
from oncewire.storage import Store
from oncewire.storage.replies import InboundState, ReplyOpening

from .conftest import T0, RawDatabase
from .test_store_replies import REQUEST, _admit, _commit


def _link(
    store: Store, inbound_id: int, status: InboundState, by: int
) -> tuple[InboundState, int | None, bool]:
    with store.transaction() as tx:
        inbound, changed = store.link_inbound_in_tx(
            tx, inbound_id, status=status, answered_by=by, now=T0 + 1
        )
    return inbound.status, inbound.answered_by, changed


def _row(raw: RawDatabase, inbound_id: int) -> tuple[object, ...]:
    rows = raw.query(
        "SELECT status, answered_by, updated_at FROM oncewire_inbound WHERE id = ?", (inbound_id,)
    )
    assert len(rows) == 1
    return rows[0]


@pytest.mark.parametrize("start", [False, True])
def test_a_message_is_superseded_from_received_or_answering(
    store: Store, raw: RawDatabase, start: bool
) -> None:
    old, new = _admit(store, "in-1"), _admit(store, "in-2")
    if start:
        store.start_inbound(old, now=T0)
    assert _link(store, old, InboundState.SUPERSEDED, new) == (InboundState.SUPERSEDED, new, True)
    assert _row(raw, old) == ("superseded", new, T0 + 1)
    assert _link(store, old, InboundState.SUPERSEDED, new)[2] is False  # again: unchanged
    with pytest.raises(InvalidState, match="superseded by"):  # another link
        _link(store, old, InboundState.SUPERSEDED, _admit(store, "in-3"))
    with pytest.raises(InvalidState):
        _link(store, old, InboundState.MERGED, new)
    assert _row(raw, old) == ("superseded", new, T0 + 1)
    assert [i.id for i in store.list_inbound(statuses=[InboundState.SUPERSEDED])] == [old]


def test_a_message_is_merged_only_before_its_own_turn(store: Store, raw: RawDatabase) -> None:
    running, steer, late = _admit(store, "in-1"), _admit(store, "in-2"), _admit(store, "in-3")
    assert _link(store, steer, InboundState.MERGED, running) == (InboundState.MERGED, running, True)
    assert _row(raw, steer) == ("merged", running, T0 + 1)
    assert _link(store, steer, InboundState.MERGED, running)[2] is False
    store.start_inbound(late, now=T0)
    with pytest.raises(InvalidState, match="answering"):
        _link(store, late, InboundState.MERGED, running)
    assert _row(raw, late)[:2] == ("answering", None)


def test_an_answered_or_set_aside_message_is_not_relinked(store: Store, raw: RawDatabase) -> None:
    answered, by = _admit(store, "in-1"), _admit(store, "in-2")
    _commit(store, answered)  # its answer is committed: it is delivered, not superseded
    quarantined = _admit(store, "in-3")
    store.quarantine_inbound(quarantined, reason="kept failing", now=T0)
    for inbound_id, status in ((answered, "answered"), (quarantined, "quarantined")):
        for target in (InboundState.SUPERSEDED, InboundState.MERGED):
            with pytest.raises(InvalidState, match=status):
                _link(store, inbound_id, target, by)
        assert _row(raw, inbound_id)[:2] == (status, None)


def test_bad_links_are_refused_and_write_nothing(store: Store, raw: RawDatabase) -> None:
    inbound_id = _admit(store)
    with pytest.raises(InvalidState, match="itself"):
        _link(store, inbound_id, InboundState.SUPERSEDED, inbound_id)
    with pytest.raises(InboundNotFound):
        _link(store, inbound_id, InboundState.SUPERSEDED, 999)
    with pytest.raises(InboundNotFound):
        _link(store, 999, InboundState.SUPERSEDED, inbound_id)
    with pytest.raises(InvalidState):
        _link(store, inbound_id, InboundState.DELIVERED, _admit(store, "in-2"))
    assert _row(raw, inbound_id)[:2] == ("received", None)


def test_the_schema_ties_the_link_to_its_statuses(store: Store, raw: RawDatabase) -> None:
    inbound_id, other = _admit(store, "in-1"), _admit(store, "in-2")
    with pytest.raises(raw.integrity_errors):  # superseded without the message answering it
        raw.execute("UPDATE oncewire_inbound SET status = 'superseded' WHERE id = ?", (inbound_id,))
    with pytest.raises(raw.integrity_errors):  # a link on a message that is not superseded
        raw.execute("UPDATE oncewire_inbound SET answered_by = ? WHERE id = ?", (other, inbound_id))
    assert _row(raw, inbound_id)[:2] == ("received", None)


@pytest.mark.parametrize("commit", [True, False])
def test_a_turn_starts_in_one_transaction(store: Store, raw: RawDatabase, commit: bool) -> None:
    inbound_id = _admit(store)

    class Abandon(Exception):
        pass

    with pytest.raises(Abandon) if not commit else _nothing(), store.transaction() as tx:
        started = store.start_inbound_in_tx(tx, inbound_id, now=T0 + 1)
        reply = store.open_reply_in_tx(
            tx,
            ReplyOpening(inbound_id, REQUEST, 4096, "utf16", 5),
            now=T0 + 1,
        )
        assert started.attempts == 1 and reply.inbound_id == inbound_id
        if not commit:
            raise Abandon
    if commit:
        assert raw.query("SELECT status, attempts FROM oncewire_inbound") == [("answering", 1)]
        assert raw.query("SELECT inbound_id, state FROM oncewire_replies") == [(inbound_id, "open")]
    else:
        assert raw.query("SELECT status, attempts FROM oncewire_inbound") == [("received", 0)]
        assert raw.count("oncewire_replies") == 0


def test_the_in_tx_verbs_need_an_open_transaction(store: Store, raw: RawDatabase) -> None:
    inbound_id = _admit(store)
    with store.transaction() as tx:
        pass
    with pytest.raises(InvalidState):
        store.start_inbound_in_tx(tx, inbound_id, now=T0)
    with pytest.raises(InvalidState):
        store.quarantine_inbound_in_tx(tx, inbound_id, reason="x", now=T0)
    with pytest.raises(InvalidState):
        store.open_reply_in_tx(
            tx,
            ReplyOpening(inbound_id, REQUEST, 4096, "utf16", 5),
            now=T0,
        )
    assert _row(raw, inbound_id)[:2] == ("received", None)
    assert raw.count("oncewire_replies") == 0


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
