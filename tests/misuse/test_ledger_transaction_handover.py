"""The Ledger's transaction is one transaction for every ledger's ``_in_tx`` verbs.

``with ledger.transaction() as tx`` is what a caller opens; passing that ``tx`` to
``ledger.inbound.start_in_tx``, ``ledger.replies.open_in_tx`` or ``ledger.runs.turn.start_in_tx``
must write in it (before, only the store's own transaction was accepted, and the Ledger's was
refused as "not one of its transactions"). What committed is read around oncewire.
"""

from __future__ import annotations

import pytest

from oncewire import InvalidState, Ledger
from oncewire.replies import TELEGRAM_LIKE
from oncewire.runs.turn import TurnSession
from tests.contract.conftest import RawDatabase

SESSION = TurnSession("telegram", "bot", "chat-1")


class Boom(Exception):
    pass


def _admit(ledger: Ledger, message_id: str) -> int:
    return ledger.inbound.admit("telegram", "bot", "chat-1", message_id, {"text": "hi"}).inbound.id


def _turn_rows(raw: RawDatabase, inbound_id: int) -> tuple[object, ...]:
    (inbound,) = raw.query(
        "SELECT status, attempts FROM oncewire_inbound WHERE id = ?", (inbound_id,)
    )
    replies = raw.query("SELECT id FROM oncewire_replies WHERE inbound_id = ?", (inbound_id,))
    runs = raw.query("SELECT status FROM oncewire_runs WHERE run_id = ?", (f"turn:{inbound_id}",))
    return tuple(inbound), len(replies), [tuple(r) for r in runs]


def test_a_turn_starts_with_the_ledgers_transaction_and_commits_as_one(
    ledger: Ledger, raw: RawDatabase
) -> None:
    inbound_id = _admit(ledger, "m-1")

    with ledger.transaction() as tx:
        assert ledger.inbound.start_in_tx(tx, inbound_id) is not None
        ledger.replies.open_in_tx(tx, inbound_id, TELEGRAM_LIKE)
        ledger.runs.turn.start_in_tx(tx, inbound_id, SESSION, owner="worker")
        tx.accept(f"turn/{inbound_id}/note", "note", {"inbound": inbound_id})

    assert _turn_rows(raw, inbound_id) == (("answering", 1), 1, [("running",)])
    assert raw.effect_row(f"turn/{inbound_id}/note")["state"] == "pending"


def test_an_exception_in_the_ledgers_transaction_rolls_every_ledger_back(
    ledger: Ledger, raw: RawDatabase
) -> None:
    inbound_id = _admit(ledger, "m-2")

    with pytest.raises(Boom), ledger.transaction() as tx:
        ledger.inbound.start_in_tx(tx, inbound_id)
        ledger.replies.open_in_tx(tx, inbound_id, TELEGRAM_LIKE)
        ledger.runs.turn.start_in_tx(tx, inbound_id, SESSION, owner="worker")
        raise Boom

    assert _turn_rows(raw, inbound_id) == (("received", 0), 0, [])


def test_the_ledgers_transaction_outside_its_block_is_refused_and_writes_nothing(
    ledger: Ledger, raw: RawDatabase
) -> None:
    inbound_id = _admit(ledger, "m-3")
    with ledger.transaction() as tx:
        pass

    with pytest.raises(InvalidState):
        ledger.inbound.start_in_tx(tx, inbound_id)
    assert _turn_rows(raw, inbound_id) == (("received", 0), 0, [])
