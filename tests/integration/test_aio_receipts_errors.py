"""AsyncReceipts raises what the synchronous Receipts raises when the work's SQL fails.

A driver error inside ``await tx.execute`` (a unique violation, a syntax error, a connection the
server dropped) left ``AsyncReceipts.run_once`` as the driver's own exception (psycopg's, or
sqlite3's), while ``Receipts.run_once`` translates it through the error tree. Now both raise the
same :class:`~oncewire.errors.StorageError` subclass, the driver's error as its cause, and
nothing of the work or its receipt is stored (read around oncewire).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from oncewire.aio import AsyncReceipts, ThreadTransaction
from oncewire.core.errors import StatementError, StorageError, StoreUnreachable
from oncewire.receipts import Receipts
from oncewire.storage import Transaction
from tests.support import tables
from tests.support.pg import migrated_schema, server_url

CHARGES = "CREATE TABLE charges (id INTEGER PRIMARY KEY, cents INTEGER NOT NULL)"
INSERT = "INSERT INTO charges (id, cents) VALUES (:id, :cents)"


def driver_errors(url: str) -> tuple[type[BaseException], ...]:
    if url.startswith("postgresql://"):
        import psycopg

        return (psycopg.Error,)
    return (sqlite3.Error,)


@pytest.fixture
def receiver(store_url: str) -> Iterator[str]:
    with Receipts(store_url) as receipts, receipts.store.transaction() as tx:
        tx.execute(CHARGES)
        tx.execute(INSERT, {"id": 1, "cents": 100})
    yield store_url


# Each failure twice: as the synchronous work, and as the same work awaited.
FAILURES: dict[str, tuple[str, dict[str, Any]]] = {
    "unique_violation": (INSERT, {"id": 1, "cents": 200}),
    "syntax_error": ("INSERT INTO charges (id, cents) VALUES (:id, :cents", {"id": 2, "cents": 1}),
    "unknown_table": ("INSERT INTO no_such_table (id) VALUES (:id)", {"id": 3}),
}


def _sync_error(url: str, sql: str, params: dict[str, Any]) -> BaseException:
    def work(tx: Transaction) -> int:
        tx.execute(INSERT, {"id": 10, "cents": 1000})  # rolled back with the failure
        tx.execute(sql, params)
        return 0

    with Receipts(url) as receipts, pytest.raises(Exception) as caught:
        receipts.run_once("sync", {}, work)
    return caught.value


def _async_error(url: str, work: Callable[[ThreadTransaction], Awaitable[int]]) -> BaseException:
    async def main() -> BaseException:
        async with AsyncReceipts(url) as receipts:
            with pytest.raises(Exception) as caught:
                await receipts.run_once("async", {}, work)
            return caught.value

    return asyncio.run(main())


def _nothing_stored(url: str) -> None:
    assert tables.rows(url, "SELECT id, cents FROM charges") == [(1, 100)]
    assert tables.rows(url, "SELECT key FROM oncewire_receipts") == []


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_a_failed_statement_is_translated_as_the_synchronous_run_once_does(
    receiver: str, failure: str
) -> None:
    sql, params = FAILURES[failure]

    async def work(tx: ThreadTransaction) -> int:
        await tx.execute(INSERT, {"id": 10, "cents": 1000})
        await tx.execute(sql, params)
        return 0

    expected = _sync_error(receiver, sql, params)
    raised = _async_error(receiver, work)
    assert isinstance(expected, StatementError), repr(expected)
    assert type(raised) is type(expected), (raised, expected)
    assert not isinstance(raised, driver_errors(receiver))
    assert isinstance(raised.__cause__, driver_errors(receiver))
    assert not raised.transient
    _nothing_stored(receiver)


def test_work_that_catches_its_own_failure_and_returns_is_still_refused(receiver: str) -> None:
    """On PostgreSQL the failed statement aborted the transaction: returning a result anyway is
    refused as the synchronous commit refuses it; on SQLite only the statement was undone."""
    postgres = receiver.startswith("postgresql://")

    async def work(tx: ThreadTransaction) -> int:
        with pytest.raises(driver_errors(receiver)):  # inside the work: the driver's, as in sync
            await tx.execute(INSERT, {"id": 1, "cents": 200})
        if not postgres:
            await tx.execute(INSERT, {"id": 11, "cents": 1100})
        return 7

    async def main() -> Any:
        async with AsyncReceipts(receiver) as receipts:
            return await receipts.run_once("caught", {}, work)

    if postgres:
        with pytest.raises(StorageError) as caught:
            asyncio.run(main())
        assert not isinstance(caught.value, driver_errors(receiver))
        _nothing_stored(receiver)
    else:
        assert asyncio.run(main()).result == 7
        assert tables.rows(receiver, "SELECT id FROM charges ORDER BY id") == [(1,), (11,)]
        assert tables.rows(receiver, "SELECT key FROM oncewire_receipts") == [("caught",)]


def test_a_connection_dropped_under_the_work_is_store_unreachable() -> None:
    import psycopg

    with migrated_schema(server_url(), "aio_errors") as url:
        with Receipts(url) as receipts, receipts.store.transaction() as tx:
            tx.execute(CHARGES)

        async def work(tx: ThreadTransaction) -> int:
            await tx.execute(INSERT, {"id": 5, "cents": 500})
            pid = (await tx.execute("SELECT pg_backend_pid()")).fetchone()[0]
            with psycopg.connect(server_url(), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await tx.execute(INSERT, {"id": 6, "cents": 600})
            return 0

        raised = _async_error(url, work)
        assert isinstance(raised, StoreUnreachable), repr(raised)
        assert isinstance(raised.__cause__, psycopg.Error)
        assert tables.rows(url, "SELECT id FROM charges") == []
        assert tables.rows(url, "SELECT key FROM oncewire_receipts") == []

        async def after(tx: ThreadTransaction) -> int:  # the pool's next run gets a connection
            await tx.execute(INSERT, {"id": 7, "cents": 700})
            return 7

        async def again() -> int:
            async with AsyncReceipts(url) as receipts:
                return (await receipts.run_once("after", {}, after)).result

        assert asyncio.run(again()) == 7
        assert tables.rows(url, "SELECT id FROM charges") == [(7,)]
