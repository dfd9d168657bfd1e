"""Misuse tests: ordinary mistakes and hostile input, on every backend.

``store_url`` (tests/conftest.py) is a fresh store location per test (a SQLite file, or a
PostgreSQL schema of its own), on both backends; ``backend`` names the one in use, and ``raw``
reads and writes that database around oncewire, so a test checks what was really stored, not
what the code under test says about itself. Raw SQL uses ``?`` placeholders (translated for
PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from oncewire import Ledger
from oncewire.testing import ManualClock
from tests.contract.conftest import RawDatabase
from tests.support.tables import dialect_of


@pytest.fixture
def backend(store_url: str) -> str:
    return dialect_of(store_url)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ledger(store_url: str, clock: ManualClock) -> Iterator[Ledger]:
    opened = Ledger(store_url, clock=clock)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def raw(ledger: Ledger) -> Iterator[RawDatabase]:
    """A second connection to the ledger's database that goes around oncewire."""
    conn = RawDatabase(ledger.store.url)
    try:
        yield conn
    finally:
        conn.close()
