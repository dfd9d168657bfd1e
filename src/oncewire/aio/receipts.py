"""AsyncReceipts: ``await receipts.run_once(key, payload, work)`` with ``async def work(tx)``.

Invariant: the receiver's work and its receipt commit together or not at all, exactly as with
:meth:`oncewire.Receipts.run_once`, which is what runs: on one worker thread, the synchronous
``run_once`` opens the transaction and reserves the key; when the work is due, that thread
hands the transaction to the caller's task and keeps serving it (each ``await tx.execute`` of
the work runs there, in the same transaction) until the work answers; then it stores the
result with the receipt and commits. A replay never calls the work.

Work that raises, or is cancelled, rolls back everything (the receipt too): the key is new
work again. The work's exception goes into the synchronous transaction's exit, as it would in
a ``with`` block: a driver error (a unique violation, a syntax error, a dropped connection) is
translated there, and ``run_once`` raises the same :class:`~oncewire.errors.StorageError` as the
synchronous ``run_once`` would, the driver's error as its cause; any other exception is raised
as it is. A cancellation during the commit is delivered once the commit has ended; whether it
committed is then read for good with ``await receipts.get(key)`` (a receipt with a result is
there exactly when the work committed).
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures as cf
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from oncewire.aio.ledger import DEFAULT_MAX_TRANSACTIONS, ThreadTransaction
from oncewire.aio.threads import WorkerPool, finish
from oncewire.core.errors import InvalidState, StorageError
from oncewire.receipts import ReceiptResult, Receipts
from oncewire.storage.driver import Transaction
from oncewire.storage.records import Receipt

__all__ = ["AsyncReceipts"]

T = TypeVar("T")


class _WorkFailed(Exception):
    """The caller's work was cancelled (or never ran): the receipt's transaction rolls back."""


class AsyncReceipts:
    """The receiver's store of receipts for asyncio callers: ``AsyncReceipts("payments.db")``.

    ``url_or_receipts`` is what :class:`~oncewire.Receipts` takes, or a ``Receipts`` already
    open; ``receipts_options`` go to ``Receipts``. ``max_transactions`` bounds the receipts
    being worked on at once (each holds a worker thread and its connection).
    """

    def __init__(
        self,
        url_or_receipts: str | Receipts,
        *,
        max_transactions: int = DEFAULT_MAX_TRANSACTIONS,
        **receipts_options: Any,
    ) -> None:
        self._target = url_or_receipts
        self._options = receipts_options
        self._sync = url_or_receipts if isinstance(url_or_receipts, Receipts) else None
        self.pool = WorkerPool(max_transactions, "oncewire-aio-receipts")

    @property
    def sync(self) -> Receipts:
        if self._sync is None:
            raise InvalidState("open the AsyncReceipts first (async with, or await open())")
        return self._sync

    async def open(self) -> AsyncReceipts:
        if self._sync is None:
            target = self._target
            assert isinstance(target, str)
            self._sync = await asyncio.to_thread(Receipts, target, **self._options)
        return self

    async def aclose(self) -> None:
        await self.pool.close()
        if self._sync is not None:
            await asyncio.to_thread(self._sync.close)

    async def __aenter__(self) -> AsyncReceipts:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def run_once(
        self,
        key: str,
        payload: Any,
        work: Callable[[ThreadTransaction], Awaitable[T]],
    ) -> ReceiptResult[T]:
        """Run ``await work(tx)`` once for ``key`` and ``payload``; replay its result after.

        ``tx`` is the receipt's transaction (``await tx.execute(...)``); the work's result
        must be JSON-serialisable. The same refusals as :meth:`oncewire.Receipts.run_once`.
        """
        receipts = self.sync
        worker = await self.pool.acquire()
        loop = asyncio.get_running_loop()
        due: asyncio.Future[Transaction] = loop.create_future()
        answer: cf.Future[Any] = cf.Future()  # the work's result, for the worker

        def answered(value: Any = None, failed: BaseException | None = None) -> None:
            if answer.done():
                pass
            elif failed is not None:
                # The work's own exception ends the transaction, as in a with block (a driver
                # error is translated there); a cancellation is a plain rollback.
                answer.set_exception(failed if isinstance(failed, Exception) else _WorkFailed())
            else:
                answer.set_result(value)
            worker.wake()

        def on_thread(tx: Transaction) -> Any:
            loop.call_soon_threadsafe(_hand, due, tx)
            worker.serve_until(answer)
            return answer.result()

        job = worker.submit(lambda: receipts.run_once(key, payload, on_thread))
        try:
            ran: asyncio.Future[Any] = asyncio.wrap_future(job)
            ran.add_done_callback(_retrieved)  # its outcome is read through finish() below
            waiting: list[asyncio.Future[Any]] = [ran, due]
            try:
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            except BaseException as exc:
                answered(failed=exc)  # the work will not run: roll back if it was due
                raise
            if due.done():
                tx = ThreadTransaction()
                tx._attach(worker, due.result())
                try:
                    value = await work(tx)
                except BaseException as exc:
                    tx._unfinished()  # closed: the rollback undoes what they would have done
                    answered(failed=exc)
                    raise
                unfinished = tx._unfinished()
                if unfinished is not None:  # the receipt would commit without that statement
                    answered(failed=unfinished)
                    raise unfinished
                answered(value)
            return await finish(job)
        except BaseException as exc:
            ended = await _ended(job)
            if isinstance(ended, StorageError) and ended.__cause__ is exc:
                raise ended from exc  # the driver error, translated as the synchronous one is
            raise
        finally:
            due.cancel()
            self.pool.release(worker)

    async def get(self, key: str) -> Receipt:
        return await asyncio.to_thread(self.sync.get, key)

    async def list(self, *, limit: int = 100, after_key: str = "") -> builtins.list[Receipt]:
        return await asyncio.to_thread(self.sync.list, limit=limit, after_key=after_key)

    async def purge(self, *, now: float | None = None) -> int:
        """Delete receipts whose retention window has ended (an operator's decision)."""
        receipts = self.sync
        worker = await self.pool.acquire()
        try:
            return await finish(worker.submit(lambda: receipts.purge(now=now)))
        finally:
            self.pool.release(worker)


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _hand(due: asyncio.Future[Transaction], tx: Transaction) -> None:
    if not due.done():
        due.set_result(tx)


async def _ended(job: cf.Future[Any]) -> Exception | None:
    """Wait for the receipt's call to end (it rolls back after a failure) before the worker is
    lent again; what it raised, for the caller to tell the work's error translated from
    another (a failed rollback after the work's error is not the one reported)."""
    try:
        await finish(job)
    except Exception as exc:
        return exc
    return None
