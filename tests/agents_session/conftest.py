"""Fixtures for the OncewireSession tests: ``db_url``, a fresh store's URL on each backend
(``store_url`` of tests/conftest.py: a SQLite file in ``tmp_path``, or a PostgreSQL schema of
the test's own).

Every module here needs the ``agents`` extra (openai-agents); without it they are skipped, with
the reason."""

from __future__ import annotations

import pytest

pytest.importorskip("agents", reason="needs the agents extra (openai-agents)")


@pytest.fixture
def db_url(store_url: str) -> str:
    return store_url
