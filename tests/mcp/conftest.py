"""Fixtures for the MCP proxy tests: ``db_url`` (a SQLite file, or a fresh PostgreSQL schema),
``raw`` to read the store's tables directly, and :func:`proxied`, an official SDK client
(``ClientSession`` over ``stdio_client``) talking to ``oncewire mcp proxy`` started as a real
child process, which starts the SDK server in ``upstream_server.py`` as its own child.

Every module here needs the ``mcp`` extra: without it they are skipped, with the reason."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.pg import fresh_schema, server_url

pytest.importorskip("mcp", reason="needs the mcp extra")

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "proxy.db")
        return
    with fresh_schema(server_url(), "mcp") as url:
        yield url


class Raw:
    """The store's database read around oncewire (autocommit; ``?`` placeholders)."""

    def __init__(self, url: str) -> None:
        self.pg = url.startswith("postgresql")
        if self.pg:
            import psycopg

            self.conn: Any = psycopg.connect(url, autocommit=True)
        else:
            self.conn = sqlite3.connect(url, isolation_level=None, timeout=10)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        sql = sql.replace("?", "%s") if self.pg else sql
        return [tuple(r) for r in self.conn.execute(sql, tuple(params)).fetchall()]

    def effects(self) -> list[dict[str, Any]]:
        """Every effect, oldest first, with its payload and result decoded."""
        rows = self.query(
            "SELECT key, kind, state, payload, result, maybe_sent, last_error, attempts "
            "FROM oncewire_effects ORDER BY id"
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
    db: str, log: Path, *proxy_args: str, logging_callback: Any = None, **env: str
) -> AsyncIterator[ClientSession]:
    """An initialized SDK client session through a proxy child (``env``: its environment's
    additions, e.g. ``ONCEWIRE_CRASH`` or ``UPSTREAM_DEDUP``)."""
    argv = proxy_argv(db, *proxy_args)
    params = StdioServerParameters(
        command=argv[0], args=argv[1:], env=child_env(log, **env), cwd=str(ROOT)
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, logging_callback=logging_callback) as session,
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
