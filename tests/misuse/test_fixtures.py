"""The misuse fixtures reach a real store on each backend."""

from __future__ import annotations

from oncewire import Ledger
from tests.contract.conftest import RawDatabase


def test_raw_sees_what_the_ledger_committed(ledger: Ledger, raw: RawDatabase) -> None:
    ledger.accept("k-1", "kind", {"a": 1})
    assert raw.effect_row("k-1")["state"] == "pending"
    assert raw.count("oncewire_effects") == 1
