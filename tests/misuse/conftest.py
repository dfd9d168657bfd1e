"""Misuse tests: ordinary mistakes and hostile input, on every backend.

``store_url`` is a fresh store location per test (a SQLite file, or a PostgreSQL schema of its
own), parametrized over both backends; ``raw`` reads and writes that database around oncewire,
so a test checks what was really stored, not what the code under test says about itself.
Raw SQL uses ``?`` placeholders (translated for PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from oncewire import Ledger
from oncewire.testing import ManualClock
from tests.contract.conftest import PostgresRaw, RawDatabase, SQLiteRaw
from tests.support.pg import fresh_schema, migrated_schema, server_url

BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A SQLite file not yet created, or a PostgreSQL schema: one already migrated (from the
    pool), or, for a test marked ``empty_store``, one holding nothing at all."""
    if backend == "sqlite":
        yield str(tmp_path / "app.db")
        return
    schema = fresh_schema if request.node.get_closest_marker("empty_store") else migrated_schema
    with ExitStack() as stack:
        yield stack.enter_context(schema(server_url(), "misuse"))


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
def raw(ledger: Ledger, backend: str) -> Iterator[RawDatabase]:
    """A second connection to the ledger's database that goes around oncewire."""
    conn: RawDatabase = (
        SQLiteRaw(ledger.store.path)  # type: ignore[attr-defined]
        if backend == "sqlite"
        else PostgresRaw(ledger.store.url)
    )
    try:
        yield conn
    finally:
        conn.close()
