"""A reply's options are checked like an effect's: a bool is not a count; nothing is stored.
The same on every way a reply record is made: opened on its own (``open``), opened in the
caller's transaction (``open_in_tx``), or committed with its text (``commit_in_tx``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.core.errors import ConfigurationError
from oncewire.replies.wire import TELEGRAM_LIKE
from tests.contract.conftest import RawDatabase


def _open(ledger: Ledger, inbound_id: int, bad: Any) -> None:
    ledger.replies.open(inbound_id, TELEGRAM_LIKE, max_attempts=bad)


def _open_in_tx(ledger: Ledger, inbound_id: int, bad: Any) -> None:
    with ledger.transaction() as tx:
        ledger.replies.open_in_tx(tx, inbound_id, TELEGRAM_LIKE, max_attempts=bad)


def _commit_in_tx(ledger: Ledger, inbound_id: int, bad: Any) -> None:
    with ledger.transaction() as tx:
        ledger.replies.commit_in_tx(tx, inbound_id, "hello", TELEGRAM_LIKE, max_attempts=bad)


MAKERS: dict[str, Callable[[Ledger, int, Any], None]] = {
    "open": _open,
    "open_in_tx": _open_in_tx,
    "commit_in_tx": _commit_in_tx,
}


@pytest.mark.parametrize("how", sorted(MAKERS))
@pytest.mark.parametrize("bad", [True, False, 0, -1, 1001, 2.0, "3"])
def test_a_reply_refuses_a_bad_max_attempts_and_stores_nothing(
    ledger: Ledger, raw: RawDatabase, bad: object, how: str
) -> None:
    admission = ledger.inbound.admit("tg", "bot", "chat", "m-1", {"text": "hi"})
    with pytest.raises(ConfigurationError, match="max_attempts"):
        MAKERS[how](ledger, admission.inbound.id, bad)
    assert raw.count("oncewire_replies") == 0
    assert raw.count("oncewire_reply_ops") == 0
