"""Fixtures for the OncewireSession tests: ``db_url``, a fresh store's URL on each backend (a
SQLite file in ``tmp_path``, or a new PostgreSQL schema dropped after the test).

Every module here needs the ``agents`` extra (openai-agents); without it they are skipped, with
the reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.pg import migrated_schema, server_url

pytest.importorskip("agents", reason="needs the agents extra (openai-agents)")

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "sessions.db")
        return
    with migrated_schema(server_url(), "agents_session") as url:
        yield url
