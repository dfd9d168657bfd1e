"""A reply's options are checked like an effect's: a bool is not a count; nothing is stored."""

from __future__ import annotations

import pytest

from oncewire import Ledger
from oncewire.core.errors import ConfigurationError
from oncewire.replies.wire import TELEGRAM_LIKE
from tests.contract.conftest import RawDatabase


@pytest.mark.parametrize("bad", [True, False, 0, -1, 1001, 2.0, "3"])
def test_a_reply_refuses_a_bad_max_attempts_and_stores_nothing(
    ledger: Ledger, raw: RawDatabase, bad: object
) -> None:
    admission = ledger.inbound.admit("tg", "bot", "chat", "m-1", {"text": "hi"})
    with pytest.raises(ConfigurationError, match="max_attempts"), ledger.transaction() as tx:
        ledger.replies.commit_in_tx(
            tx,
            admission.inbound.id,
            "hello",
            TELEGRAM_LIKE,
            max_attempts=bad,  # type: ignore[arg-type]
        )
    assert raw.count("oncewire_replies") == 0
