"""Fixtures shared by every test layer: real SQLite files in tmp_path, a store location on
each backend, a manual clock, and helpers for reading a database around oncewire and for starting
real child processes.

``store_url`` is where a test's store lives, once on each backend: a SQLite file not yet created
(``db_path``), or a PostgreSQL schema of the test's own, already migrated (from the pool of
:mod:`tests.support.pg`), or empty for a test marked ``empty_store``. Its tables are read and
written around oncewire with :mod:`tests.support.tables` (``?`` placeholders on both).

Soak runs: a test marked ``slow`` is left out of the default run (``make test``) and runs with
``--soak`` or ``ONCEWIRE_SOAK=1`` (``make soak``), or when ``-m`` names the marker. A module
that keeps some of its parameters for the soak run defines ``soak_only(test, params)``. A long check
marked ``slow`` keeps a bounded version in the default run that exercises the same code path
and invariant; the marker's description in pyproject.toml says so."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger, Receipts
from oncewire.testing import ManualClock
from tests.support.pg import fresh_schema, migrated_schema, server_url

Rows = list[tuple[Any, ...]]

SOAK_ENV = "ONCEWIRE_SOAK"

BACKENDS = ("sqlite", "postgresql")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        default=False,
        help="also run the tests marked slow (long soak runs; the default run keeps a bounded "
        f"version of each). {SOAK_ENV}=1 does the same.",
    )


def soak_requested(config: pytest.Config) -> bool:
    """``--soak``, ``ONCEWIRE_SOAK=1``, or a ``-m`` expression that names ``slow``."""
    if config.getoption("--soak") or os.environ.get(SOAK_ENV, "") not in ("", "0"):
        return True
    return "slow" in (config.getoption("markexpr") or "")


@pytest.hookimpl(trylast=True)  # after any conftest that marks items slow at collection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test its module's ``soak_only(test, params)`` names (given the test's
    function name and parameters, whether it runs only in a soak run), then leave the tests
    marked ``slow`` out unless a soak run was asked for; pytest reports them as deselected, so
    a default run says how many it did not run."""
    for item in items:
        soak_only: Callable[[str, dict[str, Any]], bool] | None = getattr(
            getattr(item, "module", None), "soak_only", None
        )
        callspec = getattr(item, "callspec", None)
        name = getattr(item, "originalname", item.name)
        if soak_only is not None and callspec is not None and soak_only(name, callspec.params):
            item.add_marker(pytest.mark.slow)
    if soak_requested(config):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]
        config.hook.pytest_deselected(items=slow)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Where the caller's database (and its outbox) lives; not created yet."""
    return tmp_path / "app.db"


@pytest.fixture(params=BACKENDS, ids=BACKENDS)
def store_url(request: pytest.FixtureRequest, db_path: Path) -> Iterator[str]:
    """A store location on each backend, nothing stored in it yet: ``db_path`` on SQLite; on
    PostgreSQL a schema of this test's own (skipped without a server), named after the test's
    module, holding oncewire's current schema, or nothing at all for a test marked
    ``empty_store`` (one about creating or migrating a store)."""
    if request.param == "sqlite":
        yield str(db_path)
        return
    module = request.node.module.__name__.rpartition(".")[2].removeprefix("test_")
    empty = request.node.get_closest_marker("empty_store") is not None
    schema = fresh_schema if empty else migrated_schema
    with schema(server_url(), module[:24].lower()) as url:
        yield url


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ledger(db_path: Path, clock: ManualClock) -> Iterator[Ledger]:
    opened = Ledger(str(db_path), clock=clock)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def receipts(tmp_path: Path, clock: ManualClock) -> Iterator[Receipts]:
    opened = Receipts(str(tmp_path / "receiver.db"), clock=clock, retention_seconds=3600.0)
    try:
        yield opened
    finally:
        opened.close()


def _peek(path: Path | str, sql: str, params: Sequence[Any] = ()) -> Rows:
    conn = sqlite3.connect(str(path), timeout=10)
    try:
        return [tuple(row) for row in conn.execute(sql, params).fetchall()]
    finally:
        conn.close()


@pytest.fixture
def peek() -> Callable[..., Rows]:
    """``peek(path, sql, params)``: rows read by a separate sqlite3 connection, not oncewire's."""
    return _peek


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@pytest.fixture
def child_env() -> Callable[..., dict[str, str]]:
    """The environment for a child process: ours, without any ONCEWIRE_* setting, plus extras."""
    return _child_env


def _python_child(
    code: str, *args: str, env: dict[str, str] | None = None, **popen: Any
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=_child_env() if env is None else env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


@pytest.fixture
def python_child() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start ``python -c CODE ARGS...``; any child still running at teardown is killed."""
    started: list[subprocess.Popen[str]] = []

    def start(code: str, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
        child = _python_child(code, *args, **kwargs)
        started.append(child)
        return child

    yield start
    for child in started:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=10)


def wait_for(predicate: Callable[[], bool], *, timeout: float = 20.0, what: str = "") -> None:
    """Poll ``predicate`` until it holds; fail the test (not hang it) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


@pytest.fixture
def wait() -> Callable[..., None]:
    return wait_for
