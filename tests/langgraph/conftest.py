"""LangGraph tests: skipped, with the reason, when the ``langgraph`` extra is not installed.

``db_url`` is a fresh store's URL on each backend: a SQLite file in ``tmp_path``, or a new
PostgreSQL schema (dropped after the test). ``raw`` reads and writes its tables around oncewire.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.pg import fresh_schema, server_url

pytest.importorskip(
    "langgraph.checkpoint.base", reason="the langgraph extra is not installed (oncewire[langgraph])"
)

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "lg.db")
        return
    with fresh_schema(server_url(), "lg") as url:
        yield url


class Raw:
    """The store's database read and written around oncewire (autocommit; ``?`` placeholders)."""

    def __init__(self, url: str) -> None:
        self.pg = url.startswith("postgresql")
        if self.pg:
            import psycopg

            self.conn: Any = psycopg.connect(url, autocommit=True)
        else:
            self.conn = sqlite3.connect(url, isolation_level=None, timeout=10)

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.pg else sql

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.conn.execute(self._sql(sql), tuple(params)).fetchall()]

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(self.conn.execute(self._sql(sql), tuple(params)).rowcount)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def raw(db_url: str) -> Iterator[Raw]:
    from oncewire import Ledger

    Ledger(db_url).close()  # the schema exists before the test reads it
    handle = Raw(db_url)
    try:
        yield handle
    finally:
        handle.close()
