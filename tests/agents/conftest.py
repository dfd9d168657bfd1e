"""Fixtures for the OpenAI Agents SDK tests: ``db`` is a fresh caller store on each backend,
``store_url`` of tests/conftest.py (a SQLite file in ``tmp_path``, or a PostgreSQL schema of the
test's own).

Every module here needs the ``agents`` extra; without it they are skipped, with the reason."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator

import pytest

pytest.importorskip("agents", reason="needs the agents extra")


@pytest.fixture
def db(store_url: str) -> str:
    return store_url


@pytest.fixture(autouse=True)
def close_the_sdks_loop() -> Iterator[None]:
    """``Runner.run_sync`` leaves its thread's default event loop open on purpose (the SDK
    reuses it); closed after each test, so that the loop is not reported unclosed at random."""
    yield
    policy = asyncio.get_event_loop_policy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = policy.get_event_loop()
        except RuntimeError:
            return
    if not loop.is_running() and not loop.is_closed():
        loop.close()
    policy.set_event_loop(None)
