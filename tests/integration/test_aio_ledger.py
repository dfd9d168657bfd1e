"""AsyncLedger and AsyncReceipts on a real SQLite file and a real PostgreSQL server.

What was committed is read around oncewire (sqlite3, or a psycopg connection of the test's
own), never from what the async API says about itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from oncewire.aio import AsyncLedger, AsyncReceipts, ThreadTransaction
from oncewire.core.errors import ConfigurationError, InvalidState, PayloadConflict
from oncewire.storage.records import EffectState
from tests.support import tables
from tests.support.pg import migrated_schema, server_url

ORDERS = "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)"
INSERT = "INSERT INTO orders (id, total) VALUES (:id, :total)"


def effect_keys(url: str) -> list[str]:
    return [r[0] for r in tables.rows(url, "SELECT key FROM oncewire_effects ORDER BY key")]


def order_ids(url: str) -> list[int]:
    return [int(r[0]) for r in tables.rows(url, "SELECT id FROM orders ORDER BY id")]


@contextmanager
def write_lock(url: str) -> Iterator[None]:
    """Hold, from outside oncewire, what makes the next write into orders wait: SQLite's write
    lock (BEGIN IMMEDIATE), PostgreSQL's lock on the orders table."""
    conn = tables.connect(url)
    try:
        if tables.dialect_of(url) == "postgresql":
            with conn.transaction():
                conn.execute("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
                yield
        else:
            conn.execute("BEGIN IMMEDIATE")
            yield
            conn.execute("ROLLBACK")
    finally:
        conn.close()


async def _prepare(ledger: AsyncLedger) -> None:
    async with ledger.transaction() as tx:
        await tx.execute(ORDERS)


def test_rows_and_effects_commit_together(store_url: str) -> None:
    async def main() -> None:
        async with AsyncLedger(store_url) as ledger:
            await _prepare(ledger)
            async with ledger.transaction() as tx:
                await tx.execute(INSERT, {"id": 1, "total": 100})
                effect = await tx.accept("order-1/charge", "charge", {"order": 1})
                rows = await tx.execute("SELECT total FROM orders WHERE id = :id", {"id": 1})
                assert rows.fetchall() == [(100,)]
                assert [e.key for e in tx.accepted] == ["order-1/charge"]
                # Not committed yet: a connection of our own sees neither.
                assert order_ids(store_url) == [] and effect_keys(store_url) == []
            assert effect.state is EffectState.PENDING
            assert (await ledger.effects.get("order-1/charge")).payload_json == '{"order":1}'
            assert await ledger.effects.find("missing") is None
            again = await ledger.accept("order-1/charge", "charge", {"order": 1})
            assert again.id == effect.id
            with pytest.raises(PayloadConflict):
                await ledger.accept("order-1/charge", "charge", {"order": 2})
            counts = await ledger.effects.counts()
            assert counts[EffectState.PENDING] == 1
            cancelled = await ledger.effects.cancel("order-1/charge")
            assert cancelled.state is EffectState.CANCELLED
            retried = await ledger.effects.retry("order-1/charge")
            assert retried.state is EffectState.PENDING
            assert [e.key for e in await ledger.effects.list("pending")] == ["order-1/charge"]

    asyncio.run(main())
    assert order_ids(store_url) == [1]
    assert effect_keys(store_url) == ["order-1/charge"]
    state = tables.rows(
        store_url, "SELECT state FROM oncewire_effects WHERE key = ?", ("order-1/charge",)
    )
    assert state == [("pending",)]


def test_an_exception_in_the_block_rolls_back_rows_and_effects(store_url: str) -> None:
    async def main() -> None:
        async with AsyncLedger(store_url) as ledger:
            await _prepare(ledger)
            with pytest.raises(RuntimeError, match="changed my mind"):
                async with ledger.transaction() as tx:
                    await tx.execute(INSERT, {"id": 2, "total": 5})
                    await tx.accept("order-2/charge", "charge", {"order": 2})
                    raise RuntimeError("changed my mind")
            # A refusal inside the block: nothing written, the transaction rolled back.
            with pytest.raises(ConfigurationError):
                async with ledger.transaction() as tx:
                    await tx.execute(INSERT, {"id": 3, "total": 5})
                    await tx.accept("", "charge", {})

    asyncio.run(main())
    assert order_ids(store_url) == []
    assert effect_keys(store_url) == []


def test_a_task_cancelled_inside_a_transaction_leaves_nothing(store_url: str) -> None:
    """Cancelled between statements: rolled back before CancelledError leaves the block, and
    the one worker is free for the next transaction (no transaction left open on it)."""

    async def main() -> None:
        async with AsyncLedger(store_url, max_transactions=1) as ledger:
            await _prepare(ledger)
            inside = asyncio.Event()

            async def order() -> None:
                async with ledger.transaction() as tx:
                    await tx.execute(INSERT, {"id": 7, "total": 70})
                    await tx.accept("order-7/charge", "charge", {"order": 7})
                    inside.set()
                    await asyncio.Event().wait()  # never set: only a cancellation ends it

            task = asyncio.create_task(order())
            await asyncio.wait_for(inside.wait(), 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # Read at once, around oncewire: nothing of it is there.
            assert order_ids(store_url) == [] and effect_keys(store_url) == []
            async with ledger.transaction() as tx:  # the same (only) worker, usable again
                await tx.execute(INSERT, {"id": 8, "total": 80})

    asyncio.run(main())
    assert order_ids(store_url) == [8]
    assert effect_keys(store_url) == []


def test_a_cancellation_during_a_blocked_statement_never_blocks_the_loop(store_url: str) -> None:
    """The transaction's write waits on a lock held outside oncewire. The loop keeps ticking
    meanwhile; the cancellation is delivered once the statement has ended, rolled back."""

    async def main() -> None:
        async with AsyncLedger(store_url) as ledger:
            await _prepare(ledger)
            ticks = 0
            started = asyncio.Event()

            async def order() -> None:
                started.set()
                async with ledger.transaction() as tx:  # SQLite waits here (BEGIN IMMEDIATE)
                    await tx.execute(INSERT, {"id": 9, "total": 90})  # PostgreSQL waits here
                    await tx.accept("order-9/charge", "charge", {"order": 9})

            async def tick() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            ticker = asyncio.create_task(tick())
            release = threading.Event()
            held = threading.Event()

            def hold() -> None:
                with write_lock(store_url):
                    held.set()
                    release.wait(60)

            holder = asyncio.create_task(asyncio.to_thread(hold))
            await asyncio.to_thread(held.wait, 30)
            task = asyncio.create_task(order())
            await started.wait()
            await asyncio.sleep(0.5)
            task.cancel()
            before = ticks
            await asyncio.sleep(0.3)
            assert not task.done(), "the cancellation arrived while the statement still ran"
            assert ticks > before, "the event loop stood still while the statement waited"
            release.set()
            await holder
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
            ticker.cancel()

    asyncio.run(main())
    assert order_ids(store_url) == []
    assert effect_keys(store_url) == []


def test_concurrent_transactions_on_sqlite_each_keep_their_own_thread(tmp_path: Path) -> None:
    """Two transactions at once: every call of each runs on one thread, the two threads (and
    their SQLite connections) differ, and the second waits for the first's commit on its own
    thread while the first goes on."""
    url = str(tmp_path / "app.db")
    seen: dict[str, set[tuple[int, int]]] = {"a": set(), "b": set()}

    def where(tx: Any) -> tuple[int, int]:
        return threading.get_ident(), id(tx.store_transaction.conn)

    async def main() -> None:
        async with AsyncLedger(url) as ledger:
            await _prepare(ledger)
            a_inside, b_started = asyncio.Event(), asyncio.Event()

            async def first() -> None:
                async with ledger.transaction() as tx:
                    seen["a"].add(await tx.call(where))
                    await tx.execute(INSERT, {"id": 1, "total": 1})
                    a_inside.set()
                    await b_started.wait()
                    await asyncio.sleep(0.3)  # b is blocked in BEGIN IMMEDIATE meanwhile
                    seen["a"].add(await tx.call(where))
                    await tx.accept("a", "charge", {})
                    seen["a"].add(await tx.call(where))

            async def second() -> None:
                await a_inside.wait()
                b_started.set()
                async with ledger.transaction() as tx:
                    seen["b"].add(await tx.call(where))
                    await tx.execute(INSERT, {"id": 2, "total": 2})
                    await tx.accept("b", "charge", {})
                    seen["b"].add(await tx.call(where))

            await asyncio.wait_for(asyncio.gather(first(), second()), 60)

    asyncio.run(main())
    assert len(seen["a"]) == 1 and len(seen["b"]) == 1, seen
    (thread_a, conn_a), (thread_b, conn_b) = seen["a"].pop(), seen["b"].pop()
    assert thread_a != thread_b and conn_a != conn_b
    assert order_ids(url) == [1, 2]
    assert effect_keys(url) == ["a", "b"]


def test_a_commit_cancelled_midway_is_over_when_the_cancellation_arrives() -> None:
    """PostgreSQL: a deferred trigger makes the COMMIT take a second. A cancellation during it
    is delivered once the commit has ended, so a read right after tells for good."""
    with migrated_schema(server_url(), "aio") as url:

        async def main() -> None:
            async with AsyncLedger(url) as ledger:
                await _prepare(ledger)
                async with ledger.transaction() as tx:
                    await tx.execute(
                        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
                        "$$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$"
                    )
                    await tx.execute(
                        "CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON orders "
                        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()"
                    )
                exiting = asyncio.Event()

                async def order() -> None:
                    async with ledger.transaction() as tx:
                        await tx.execute(INSERT, {"id": 5, "total": 50})
                        await tx.accept("order-5/charge", "charge", {"order": 5})
                        exiting.set()

                task = asyncio.create_task(order())
                await exiting.wait()
                await asyncio.sleep(0.3)  # inside the COMMIT's second
                started = time.monotonic()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert time.monotonic() - started > 0.2  # held until the commit ended
                found = await ledger.effects.find("order-5/charge")
                assert found is not None  # the commit had started: it went through

        asyncio.run(main())
        assert order_ids(url) == [5]
        assert effect_keys(url) == ["order-5/charge"]


def test_accept_in_an_async_psycopg_connection_commits_and_rolls_back_with_the_caller() -> None:
    import psycopg

    with migrated_schema(server_url(), "aio") as url:

        async def main() -> None:
            async with AsyncLedger(url) as ledger:
                await _prepare(ledger)
                conn = await psycopg.AsyncConnection.connect(url)
                try:
                    async with conn.transaction():
                        await conn.execute("INSERT INTO orders (id, total) VALUES (1, 10)")
                        effect = await ledger.accept_in(conn, "order-1/ship", "ship", {"o": 1})
                        assert effect.state is EffectState.PENDING
                        same = await ledger.accept_in(conn, "order-1/ship", "ship", {"o": 1})
                        assert same.id == effect.id
                        assert effect_keys(url) == []  # the caller has not committed
                    assert effect_keys(url) == ["order-1/ship"]

                    class Undo(Exception):
                        pass

                    with pytest.raises(Undo):
                        async with conn.transaction():
                            await conn.execute("INSERT INTO orders (id, total) VALUES (2, 20)")
                            await ledger.accept_in(conn, "order-2/ship", "ship", {"o": 2})
                            raise Undo
                    # The same refusals as the synchronous accept_in, nothing written.
                    async with conn.transaction():
                        with pytest.raises(PayloadConflict):
                            await ledger.accept_in(conn, "order-1/ship", "ship", {"o": 9})
                    async with conn.transaction():
                        await conn.execute("SELECT 1")
                        with pytest.raises(ConfigurationError):
                            await ledger.accept_in(conn, "x" * 10_000, "ship", {})
                    await conn.commit()
                    with pytest.raises(InvalidState, match="open transaction"):
                        await ledger.accept_in(conn, "idle", "ship", {})
                    sync_conn = psycopg.connect(url)
                    try:
                        sync_conn.execute("SELECT 1")
                        with pytest.raises(InvalidState, match="AsyncConnection"):
                            await ledger.accept_in(sync_conn, "sync", "ship", {})
                    finally:
                        sync_conn.close()
                finally:
                    await conn.close()

        asyncio.run(main())
        assert order_ids(url) == [1]
        assert effect_keys(url) == ["order-1/ship"]


def test_accept_in_on_a_sqlite_ledger_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncLedger(str(tmp_path / "app.db")) as ledger:
            with pytest.raises(InvalidState, match="PostgreSQL"):
                await ledger.accept_in(object(), "k", "ship", {})

    asyncio.run(main())
    assert effect_keys(str(tmp_path / "app.db")) == []


def test_async_receipts_commit_the_work_with_its_receipt(store_url: str) -> None:
    calls: list[str] = []

    async def work(tx: ThreadTransaction) -> int:
        calls.append("work")
        await tx.execute(INSERT, {"id": 11, "total": 110})
        await asyncio.sleep(0)  # the loop runs other things meanwhile
        rows = await tx.execute("SELECT total FROM orders WHERE id = :id", {"id": 11})
        return int(rows.fetchone()[0])

    async def failing(tx: ThreadTransaction) -> int:
        await tx.execute(INSERT, {"id": 12, "total": 120})
        raise RuntimeError("the receiver failed")

    async def main() -> None:
        async with AsyncLedger(store_url) as ledger:
            await _prepare(ledger)  # the receiver's own table, in the same database
        async with AsyncReceipts(store_url) as receipts:
            first = await receipts.run_once("r-11", {"id": 11}, work)
            again = await receipts.run_once("r-11", {"id": 11}, work)
            assert (first.result, first.replayed) == (110, False)
            assert (again.result, again.replayed) == (110, True)
            with pytest.raises(PayloadConflict):
                await receipts.run_once("r-11", {"id": 99}, work)
            with pytest.raises(RuntimeError, match="receiver failed"):
                await receipts.run_once("r-12", {"id": 12}, failing)

            blocked = asyncio.Event()

            async def stuck(tx: ThreadTransaction) -> int:
                await tx.execute(INSERT, {"id": 13, "total": 130})
                blocked.set()
                await asyncio.Event().wait()
                return 0

            task = asyncio.create_task(receipts.run_once("r-13", {"id": 13}, stuck))
            await asyncio.wait_for(blocked.wait(), 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (await receipts.get("r-11")).result_json == "110"

    asyncio.run(main())
    assert calls == ["work"]
    assert order_ids(store_url) == [11]
    assert [r[0] for r in tables.rows(store_url, "SELECT key FROM oncewire_receipts")] == ["r-11"]
