"""Fixtures for the MCP proxy tests: ``db_url`` (the suite's ``store_url``: a SQLite file, or
a PostgreSQL schema of the test's own), ``raw`` to read the store's tables directly, and
:func:`proxied`, an official SDK client (``ClientSession`` over ``stdio_client``) talking to
``oncewire mcp proxy`` started as a real
child process, which starts the SDK server in ``upstream_server.py`` as its own child.

``shared``: one such proxy and server pair per module and backend (per test worker), kept
running across the tests that need nothing but a plain proxy; each test gets fresh keys and sees
only the effects and server calls made since it started (tests in a worker run one at a time).
``SQLITE_BY_DEFAULT`` runs a test whose behaviour does not depend on the backend on SQLite in
the default run and on both backends under ``--soak``.

Every module here needs the ``mcp`` extra: without it they are skipped, with the reason."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support import tables
from tests.support.pg import fresh_schema, server_url

pytest.importorskip("mcp", reason="needs the mcp extra")

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["sqlite", "postgresql"]

SQLITE_BY_DEFAULT = pytest.mark.parametrize(
    "store_url", ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)], indirect=True
)
"""For a behaviour of the proxy that does not depend on the store's backend: SQLite in the
default run, both backends under ``--soak``."""


@pytest.fixture
def db_url(store_url: str) -> str:
    """The suite's one store fixture (``store_url``), by the name these tests use."""
    return store_url


class Raw(tables.Connection):
    """The store's database read around oncewire (autocommit; ``?`` placeholders)."""

    def effects(self, after_id: int = 0) -> list[dict[str, Any]]:
        """Every effect (after the one with ``after_id``), oldest first, with its payload and
        result decoded."""
        rows = self.query(
            "SELECT key, kind, state, payload, result, maybe_sent, last_error, attempts "
            "FROM oncewire_effects WHERE id > ? ORDER BY id",
            (after_id,),
        )
        names = (
            "key",
            "kind",
            "state",
            "payload",
            "result",
            "maybe_sent",
            "last_error",
            "attempts",
        )
        found = []
        for row in rows:
            item = dict(zip(names, row, strict=True))
            for name in ("payload", "result"):
                if isinstance(item[name], str):
                    item[name] = json.loads(item[name])
            item["maybe_sent"] = bool(item["maybe_sent"])
            found.append(item)
        return found

    def last_id(self) -> int:
        return int(self.query("SELECT COALESCE(MAX(id), 0) FROM oncewire_effects")[0][0])


@pytest.fixture
def raw(db_url: str) -> Iterator[Raw]:
    from oncewire import Ledger

    Ledger(db_url).close()  # the schema exists before the test reads it
    handle = Raw(db_url)
    try:
        yield handle
    finally:
        handle.close()


@pytest.fixture
def upstream_log(tmp_path: Path) -> Path:
    return tmp_path / "upstream.log"


def calls_logged(path: Path) -> list[dict[str, Any]]:
    """The calls the upstream server really got, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def proxy_argv(db: str, *proxy_args: str) -> list[str]:
    """The proxy's command line: the upstream server a child, unless ``--upstream`` is given."""
    argv = [sys.executable, "-m", "oncewire", "mcp", "proxy", "--db", db, *proxy_args]
    if "--upstream" in proxy_args:
        return argv
    return [*argv, "--", sys.executable, "-m", "tests.mcp.upstream_server"]


def child_env(log: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_CRASH")}
    env["UPSTREAM_LOG"] = str(log)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


@asynccontextmanager
async def proxied(
    db: str,
    log: Path,
    *proxy_args: str,
    logging_callback: Any = None,
    elicitation_callback: Any = None,
    **env: str,
) -> AsyncIterator[ClientSession]:
    """An initialized SDK client session through a proxy child (``env``: its environment's
    additions, e.g. ``ONCEWIRE_CRASH`` or ``UPSTREAM_DEDUP``)."""
    argv = proxy_argv(db, *proxy_args)
    params = StdioServerParameters(
        command=argv[0], args=argv[1:], env=child_env(log, **env), cwd=str(ROOT)
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(
            read,
            write,
            logging_callback=logging_callback,
            elicitation_callback=elicitation_callback,
        ) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def direct(log: Path, **env: str) -> AsyncIterator[ClientSession]:
    """An SDK client session straight to the upstream server (no proxy)."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tests.mcp.upstream_server"],
        env=child_env(log, **env),
        cwd=str(ROOT),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


class SharedProxy:
    """One proxy child (and its server child) on one store, its client session held by an
    event loop in a thread of its own (``portal``), for every test of a module."""

    def __init__(self, url: str, log: Path, portal: Any, session: ClientSession) -> None:
        self.url, self.log, self.portal, self.session = url, log, portal, session
        self.raw = Raw(url)
        self.on_log: Callable[[Any], Awaitable[None]] | None = None

    async def logging_callback(self, params: Any) -> None:
        if self.on_log is not None:
            await self.on_log(params)


class Shared:
    """A test's view of the :class:`SharedProxy`: keys of its own, and only the effects and
    server calls made since the test started."""

    def __init__(self, proxy: SharedProxy) -> None:
        self.proxy = proxy
        self.url, self.log, self.session = proxy.url, proxy.log, proxy.session
        self.prefix = f"{uuid.uuid4().hex[:8]}-"
        self._first_id = proxy.raw.last_id()
        self._first_call = len(calls_logged(proxy.log))

    def key(self, name: str) -> str:
        """A key no other test uses: ``name`` with this test's prefix."""
        return self.prefix + name

    def effects(self) -> list[dict[str, Any]]:
        """The effects recorded since the test started, oldest first (as :meth:`Raw.effects`)."""
        return self.proxy.raw.effects(self._first_id)

    def calls(self) -> list[dict[str, Any]]:
        """The calls the server got since the test started, in order."""
        return calls_logged(self.log)[self._first_call :]

    def run(self, scenario: Callable[[ClientSession], Awaitable[T]]) -> T:
        """``scenario(session)`` on the shared session's event loop."""
        result: T = self.proxy.portal.call(scenario, self.session)
        return result


@pytest.fixture(scope="module", params=BACKENDS)
def shared_proxy(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedProxy]:
    from anyio.from_thread import start_blocking_portal

    from oncewire import Ledger

    folder = tmp_path_factory.mktemp("shared-proxy")
    log = folder / "upstream.log"
    with (
        fresh_schema(server_url(), "mcp")
        if request.param == "postgresql"
        else _sqlite_url(folder) as url,
        start_blocking_portal() as portal,
    ):
        Ledger(url).close()
        holder: list[SharedProxy] = []

        async def on_log(params: Any) -> None:
            await holder[0].logging_callback(params)

        with portal.wrap_async_context_manager(
            proxied(url, log, logging_callback=on_log)
        ) as session:
            holder.append(SharedProxy(url, log, portal, session))
            try:
                yield holder[0]
            finally:
                holder[0].raw.close()


@contextmanager
def _sqlite_url(folder: Path) -> Iterator[str]:
    yield str(folder / "proxy.db")


@pytest.fixture
def shared(shared_proxy: SharedProxy) -> Iterator[Shared]:
    view = Shared(shared_proxy)
    try:
        yield view
    finally:
        shared_proxy.on_log = None
