"""The gateway's transactions over the inbound and replies ledgers, on a real SQLite file.

T2, a turn's start: the inbound's start (or its quarantine) and the reply record commit
together or not at all. Ti, an interrupt: the older message is superseded by the newer one
and its reply withdrawn in one transaction; the engine then takes the previews back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from oncewire.errors import InvalidState
from oncewire.inbound import InboundState
from oncewire.lab.suites.replies_rig import Rig, reply_text
from oncewire.replies import TELEGRAM_LIKE, ReplyState
from oncewire.testing import ManualClock


class Abandon(Exception):
    """The caller's transaction fails after the verbs wrote."""


def test_a_turn_start_commits_with_its_reply_record(tmp_path: Path) -> None:
    with Rig(tmp_path / "rig", clock=ManualClock()) as rig:
        inbound = rig.admit("fk_tg", "c1", "in-1").inbound
        with pytest.raises(Abandon), rig.ledger.store.transaction() as tx:
            assert rig.ledger.inbound.start_in_tx(tx, inbound.id) is not None
            rig.ledger.replies.open_in_tx(tx, inbound.id, TELEGRAM_LIKE)
            raise Abandon
        again = rig.ledger.inbound.get(inbound.id)
        assert (again.status, again.attempts) == (InboundState.RECEIVED, 0)
        assert rig.ledger.replies.for_inbound(inbound.id) is None
        with rig.ledger.store.transaction() as tx:
            started = rig.ledger.inbound.start_in_tx(tx, inbound.id)
            reply = rig.ledger.replies.open_in_tx(tx, inbound.id, TELEGRAM_LIKE)
        assert started is not None and started.attempts == 1
        assert reply.state is ReplyState.OPEN and reply.request.reply_to == "in-1"
        assert rig.ledger.inbound.get(inbound.id).status is InboundState.ANSWERING


def test_a_start_past_max_starts_quarantines_in_the_callers_transaction(tmp_path: Path) -> None:
    with Rig(tmp_path / "rig", clock=ManualClock()) as rig:
        inbound = rig.admit("fk_tg", "c1", "in-1").inbound
        for _ in range(2):
            assert rig.ledger.inbound.start(inbound.id, max_starts=2) is not None
        with rig.ledger.store.transaction() as tx:
            assert rig.ledger.inbound.start_in_tx(tx, inbound.id, max_starts=2) is None
        quarantined = rig.ledger.inbound.get(inbound.id)
        assert quarantined.status is InboundState.QUARANTINED and quarantined.attempts == 3


def test_an_interrupt_supersedes_and_withdraws_in_one_transaction(tmp_path: Path) -> None:
    with Rig(tmp_path / "rig", clock=ManualClock()) as rig:
        old = rig.admit("fk_tg", "c1", "in-1").inbound
        new = rig.admit("fk_tg", "c1", "in-2").inbound

        def cut_off() -> Iterator[str]:
            yield reply_text("A", "partial")
            raise Abandon  # the model stream, cut off by the newer message

        with pytest.raises(Abandon):
            rig.engine.stream(old.id, cut_off())
        reply = rig.ledger.replies.for_inbound(old.id)
        assert reply is not None and len(rig.view().visible("fk_tg", "c1")) == 1
        with pytest.raises(Abandon), rig.ledger.store.transaction() as tx:
            rig.ledger.inbound.supersede_in_tx(tx, old.id, by=new.id)
            rig.ledger.replies.withdraw_in_tx(tx, old.id, TELEGRAM_LIKE)
            raise Abandon
        assert rig.ledger.inbound.get(old.id).status is InboundState.ANSWERING
        assert rig.ledger.replies.get(reply.id).state is ReplyState.OPEN
        with rig.ledger.store.transaction() as tx:
            rig.ledger.inbound.supersede_in_tx(tx, old.id, by=new.id)
            withdrawn = rig.ledger.replies.withdraw_in_tx(tx, old.id, TELEGRAM_LIKE)
        assert rig.engine.deliver(withdrawn.id).status == "withdrawn"
        assert rig.view().visible("fk_tg", "c1") == []
        superseded = rig.ledger.inbound.get(old.id)
        assert (superseded.status, superseded.answered_by) == (InboundState.SUPERSEDED, new.id)
        assert superseded.as_dict()["answered_by"] == new.id
        assert [i.id for i in rig.ledger.inbound.unanswered()] == [new.id]


def test_a_steered_message_is_merged_and_no_longer_waits(tmp_path: Path) -> None:
    with Rig(tmp_path / "rig", clock=ManualClock()) as rig:
        running = rig.admit("fk_tg", "c1", "in-1").inbound
        steer = rig.admit("fk_tg", "c1", "in-2").inbound
        rig.ledger.inbound.start(running.id)
        merged = rig.ledger.inbound.merge(steer.id, into=running.id)
        assert (merged.status, merged.answered_by) == (InboundState.MERGED, running.id)
        assert [i.id for i in rig.ledger.inbound.unanswered()] == [running.id]
        with pytest.raises(InvalidState):  # its own turn started: it cannot be merged
            rig.ledger.inbound.merge(running.id, into=steer.id)
        with pytest.raises(InvalidState):  # a merged message is answered by the running turn
            rig.ledger.inbound.supersede(steer.id, by=running.id)
