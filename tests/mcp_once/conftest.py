"""Fixtures for the tests of tools that run once (``oncewire.mcp.once``): ``receiver``, the
receipts of a store on each backend (``store_url`` of tests/conftest.py: a SQLite file in
``tmp_path``, or a PostgreSQL schema of the test's own), and readers that look at its tables
and at side files with plain drivers, not through oncewire.

Every module here needs the ``mcp`` extra; without it they are reported as skipped."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

pytest.importorskip("mcp.server.mcpserver", reason="needs the mcp extra")

from oncewire.lab.fixtures import dialect_of, rows
from oncewire.receipts import Receipts

T = TypeVar("T")

SERVERS = "oncewire.lab.children.mcp_servers"


@pytest.fixture
def receiver(store_url: str) -> Iterator[Receipts]:
    """The receiver's ``Receipts`` on ``store_url``, closed after the test."""
    with Receipts(store_url, retention_seconds=None) as receipts:
        yield receipts


def table(url: str, sql: str) -> list[dict[str, Any]]:
    """Rows of ``sql`` in the store at ``url``, read with sqlite3 or psycopg."""
    return rows(dialect_of(url), url, sql)


def tickets(url: str) -> list[dict[str, Any]]:
    return table(
        url, "SELECT operation_id, payload, redelivery, service_pid FROM tickets ORDER BY id"
    )


def receipts_of(url: str) -> list[dict[str, Any]]:
    return table(
        url,
        "SELECT key, digest, payload AS payload_json, result AS result_json "
        "FROM oncewire_receipts ORDER BY key",
    )


def lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines a side file holds (empty when it was never written)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def run(fn: Callable[[], Awaitable[T]]) -> T:
    """``fn()`` on an event loop of its own (the SDK's client and in-memory server are async)."""
    return anyio.run(fn)


def server_argv(*args: str) -> list[str]:
    return ["-m", SERVERS, *args]


PYTHON = sys.executable
