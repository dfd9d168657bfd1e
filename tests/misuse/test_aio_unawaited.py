"""A call of an async transaction that was never awaited cannot commit half of the transaction.

``tx.accept(...)`` without ``await`` makes a coroutine that never runs: the block used to end
normally and commit the caller's rows without the intent, and only Python's ``RuntimeWarning``
said so, later. The transaction now refuses to commit while a call it handed out was never
awaited (or is still running), rolls back and says which. On both backends, reading what was
stored around oncewire.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.aio import AsyncLedger, AsyncReceipts, ThreadTransaction
from oncewire.core.errors import InvalidState
from oncewire.receipts.service import Receipts
from tests.contract.conftest import RawDatabase

INSERT = "INSERT INTO caller_rows (id) VALUES (:id)"


@contextlib.asynccontextmanager
async def _lent(ledger: Ledger) -> AsyncIterator[AsyncLedger]:
    aio = AsyncLedger(ledger)
    try:
        yield aio
    finally:
        await aio.pool.close()  # its workers; the ledger is the fixture's to close


@pytest.fixture
def caller_table(raw: RawDatabase) -> str:
    raw.execute("CREATE TABLE caller_rows (id INTEGER PRIMARY KEY)")
    return "caller_rows"


def test_an_accept_never_awaited_rolls_back_the_callers_rows(
    ledger: Ledger, raw: RawDatabase, caller_table: str
) -> None:
    forgotten: list[Any] = []

    async def main() -> None:
        async with _lent(ledger) as aio:
            with pytest.raises(InvalidState, match=r"tx\.accept\(\.\.\.\) was never awaited"):
                async with aio.transaction() as tx:
                    await tx.execute(INSERT, {"id": 1})
                    forgotten.append(tx.accept("k-1", "send", {"n": 1}))  # no await
            # The transaction is over and the connection is free: the next one commits.
            async with aio.transaction() as tx:
                await tx.execute(INSERT, {"id": 2})
                await tx.accept("k-2", "send", {"n": 2})

    asyncio.run(main())
    assert raw.query("SELECT id FROM caller_rows") == [(2,)]
    assert [row[0] for row in raw.query("SELECT key FROM oncewire_effects")] == ["k-2"]
    # Closed by the transaction: no "never awaited" warning later, and never run outside it.
    assert inspect.getcoroutinestate(forgotten[0]) == inspect.CORO_CLOSED


def test_an_execute_never_awaited_rolls_back_the_intent(
    ledger: Ledger, raw: RawDatabase, caller_table: str
) -> None:
    async def main() -> None:
        async with _lent(ledger) as aio:
            with pytest.raises(InvalidState, match=r"tx\.execute\(\.\.\.\) was never awaited"):
                async with aio.transaction() as tx:
                    await tx.accept("k-1", "send", {"n": 1})
                    tx.execute(INSERT, {"id": 1})  # type: ignore[unused-coroutine]

    asyncio.run(main())
    assert raw.count(caller_table) == 0
    assert raw.count("oncewire_effects") == 0


def test_an_accept_still_running_in_another_task_is_not_committed_half_way(
    ledger: Ledger, raw: RawDatabase, caller_table: str
) -> None:
    async def main() -> None:
        async with _lent(ledger) as aio:
            with pytest.raises(InvalidState, match=r"tx\.accept\(\.\.\.\) was still running"):
                async with aio.transaction() as tx:
                    await tx.execute(INSERT, {"id": 1})
                    task = asyncio.create_task(tx.accept("k-1", "send", {"n": 1}))
                    await asyncio.sleep(0)  # the task starts, and waits for the worker
            await task  # it ran before the rollback, which undid it

    asyncio.run(main())
    assert raw.count(caller_table) == 0
    assert raw.count("oncewire_effects") == 0


def test_a_forgotten_accept_in_a_failing_block_is_closed_with_the_rollback(
    ledger: Ledger, raw: RawDatabase, caller_table: str
) -> None:
    async def main() -> None:
        async with _lent(ledger) as aio:
            with pytest.raises(RuntimeError, match="the caller's own"):
                async with aio.transaction() as tx:
                    await tx.execute(INSERT, {"id": 1})
                    tx.accept("k-1", "send", {"n": 1})  # type: ignore[unused-coroutine]
                    raise RuntimeError("the caller's own error")

    asyncio.run(main())  # warnings are errors: a coroutine left unclosed would fail here
    assert raw.count(caller_table) == 0
    assert raw.count("oncewire_effects") == 0


def test_a_receivers_execute_never_awaited_leaves_no_receipt(
    ledger: Ledger, raw: RawDatabase, caller_table: str
) -> None:
    async def forgetful(tx: ThreadTransaction) -> str:
        tx.execute(INSERT, {"id": 1})  # type: ignore[unused-coroutine]
        return "charged"

    async def honest(tx: ThreadTransaction) -> str:
        await tx.execute(INSERT, {"id": 1})
        return "charged"

    async def main() -> None:
        receipts = AsyncReceipts(Receipts(ledger.store))
        with pytest.raises(InvalidState, match=r"tx\.execute\(\.\.\.\) was never awaited"):
            await receipts.run_once("r-1", {"cents": 5}, forgetful)
        done = await receipts.run_once("r-1", {"cents": 5}, honest)
        assert (done.result, done.replayed) == ("charged", False)
        await receipts.pool.close()

    asyncio.run(main())
    assert raw.query("SELECT id FROM caller_rows") == [(1,)]
    assert raw.query("SELECT key, result FROM oncewire_receipts") == [("r-1", '"charged"')]
