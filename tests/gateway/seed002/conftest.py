"""Seed 002's fixtures: ``rig`` is one gateway per module and backend (SQLite, PostgreSQL with a
schema of its own), serving every platform, each cell in a chat of its own, like the seed's
module-scoped ``gw``, with the short platform read timeout
(:data:`~tests.gateway.seed002.harness.SHARED_READ_TIMEOUT_SECONDS`); ``fresh_rig()`` makes a
rig of its own on SQLite for a test that must not share the chats (the seed's ``fresh_gw``: the
audits' own tests), with the gateway's default 10 s read timeout, stopped when the test ends.
The seed's crash cells are the ``gateway`` lab suite's scenarios
(:data:`oncewire.lab.suites.gateway_cells.CELLS`), run by tests/gateway/test_lab_gateway.py.

A module may define ``soak_only(test, params)``: given a test's function name and parameters
(the rig's backend under ``rig``), whether that test runs only in a soak run; tests/conftest.py
marks those ``slow`` at collection and leaves them out of the default run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.gateway.seed002.harness import SHARED_READ_TIMEOUT_SECONDS, Seed002
from tests.support.pg import fresh_schema, server_url

BACKENDS = ("sqlite", "postgresql")


def _store(stack: ExitStack, backend: str, folder: Path) -> str:
    if backend == "sqlite":
        return str(folder / "gateway.db")
    pytest.importorskip("psycopg")
    return stack.enter_context(fresh_schema(server_url(), "seed002"))


@pytest.fixture(scope="module", params=BACKENDS)
def rig(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Seed002]:
    """A running gateway between its fakes, shared by the module's cells on one backend."""
    folder = tmp_path_factory.mktemp(f"seed002-{request.param}")
    with ExitStack() as stack:
        started = Seed002(
            folder,
            _store(stack, request.param, folder),
            read_timeout_seconds=SHARED_READ_TIMEOUT_SECONDS,
        )
        stack.callback(started.close)
        started.start()
        yield started


@pytest.fixture
def fresh_rig(tmp_path: Path) -> Iterator[Callable[..., Seed002]]:
    """``fresh_rig()``: a rig of this test's own on SQLite, its gateway started."""
    with ExitStack() as stack:
        made: list[Seed002] = []

        def make() -> Seed002:
            folder = tmp_path / f"rig-{len(made)}"
            made.append(Seed002(folder, _store(stack, "sqlite", folder)))
            stack.callback(made[-1].close)
            made[-1].start()
            return made[-1]

        yield make
