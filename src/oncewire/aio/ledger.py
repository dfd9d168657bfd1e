"""AsyncLedger: the Ledger for asyncio callers, its transactions on threads of their own.

Invariant: every statement of one transaction runs on one dedicated thread, and a transaction
left by its ``async with`` block, however it was left (normal exit, an exception, a
cancellation), is over: committed, or rolled back. Nothing of it is left open or half
committed, and the event loop never waits on the database.

``async with ledger.transaction() as tx`` borrows a worker thread from the ledger's pool
(at most ``max_transactions``) for the whole block: its ``BEGIN``, each ``await tx.execute``
and ``await tx.accept``, and its ``COMMIT`` or ``ROLLBACK`` all run there, on that thread's
connection, through the synchronous :class:`~oncewire.ledger.LedgerTransaction` (the same
validation, limits, conflicts, statements and crash points). Reads outside a transaction run
with :func:`asyncio.to_thread`.

Cancellation (see :func:`oncewire.aio.threads.finish`): a call already running on the worker
(a statement, the commit) is let finish, then the cancellation is delivered. Inside the block
that means the transaction is rolled back before ``CancelledError`` leaves it. A cancellation
that arrives during the commit is delivered once the commit has ended: the transaction may or
may not have committed, and since the commit is over by then, reading tells which for good:
``await ledger.effects.find(key)`` for a key it accepted (or one of its own rows) finds it
exactly when the transaction committed.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures as cf
import inspect
from collections.abc import Callable, Coroutine, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

from oncewire.aio.threads import LoopBridge, Worker, WorkerPool, finish
from oncewire.core.errors import InvalidState
from oncewire.effects.outbox import DEFAULT_MAX_ATTEMPTS
from oncewire.ledger import Ledger, LedgerTransaction
from oncewire.storage.driver import Transaction
from oncewire.storage.records import AttemptRecord, Effect, EffectState

__all__ = [
    "DEFAULT_MAX_TRANSACTIONS",
    "AsyncEffects",
    "AsyncLedger",
    "AsyncTransaction",
    "Rows",
    "ThreadTransaction",
]

T = TypeVar("T")

DEFAULT_MAX_TRANSACTIONS = 8


class Rows:
    """A statement's answer, read on the transaction's thread: its rows (an empty list for a
    statement that returns none), ``rowcount`` and, on SQLite, ``lastrowid``. A cursor is not
    handed out: it belongs to the transaction's thread."""

    __slots__ = ("lastrowid", "rowcount", "rows")

    def __init__(self, rows: list[Any], rowcount: int, lastrowid: int | None) -> None:
        self.rows, self.rowcount, self.lastrowid = rows, rowcount, lastrowid

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def _answer(cursor: Any) -> Rows:
    rows = list(cursor.fetchall()) if cursor.description is not None else []
    return Rows(rows, int(cursor.rowcount), getattr(cursor, "lastrowid", None))


class ThreadTransaction:
    """An open transaction whose statements run on one thread of their own, awaited.

    ``await tx.execute(sql, params)`` takes what the synchronous transaction takes (``:name``
    placeholders with a dict run on both backends) and returns its :class:`Rows`. ``await
    tx.call(fn, *args)`` runs ``fn(sync_tx, *args)`` on the transaction's thread, for the
    ledgers' ``_in_tx`` verbs (``ledger.sync.inbound.start_in_tx`` and the like).

    Each of these calls hands out a coroutine, and the transaction keeps it: one the caller
    forgot to ``await`` never ran, and the transaction refuses to commit without it
    (:meth:`_unfinished`).
    """

    def __init__(self) -> None:
        self._worker: Worker | None = None
        self._sync: Transaction | None = None
        self._calls: list[tuple[str, Coroutine[Any, Any, Any]]] = []  # (method, coroutine)
        self._prune_at = 32

    def _handed(self, method: str, call: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        """``call``, kept until the transaction ends (the ones that ended are let go)."""
        calls = self._calls
        if len(calls) >= self._prune_at:
            calls[:] = [kept for kept in calls if not _ended(kept[1])]
            self._prune_at = max(32, 2 * len(calls))
        calls.append((method, call))
        return call

    def _unfinished(self) -> InvalidState | None:
        """At the end of the transaction: the refusal of a call handed out that never ran (it is
        closed: awaiting it later raises, it never runs outside the transaction) or that is
        still running; None when every one ended."""
        refusal: InvalidState | None = None
        for method, call in self._calls:
            state = inspect.getcoroutinestate(call)
            if state == inspect.CORO_CLOSED:
                continue
            if state == inspect.CORO_CREATED:
                call.close()
                what = "was never awaited"
            else:
                what = "was still running when the transaction's block ended"
            if refusal is None:
                refusal = InvalidState(
                    f"tx.{method}(...) {what}: the transaction is rolled back, and nothing of it "
                    "was committed (await every call of a transaction inside its block)",
                    method=method,
                )
        self._calls = []
        return refusal

    def _attach(self, worker: Worker, sync: Transaction) -> None:
        self._worker, self._sync = worker, sync

    def _on_thread(self, fn: Callable[[Transaction], T]) -> cf.Future[T]:
        worker, sync = self._worker, self._sync
        if worker is None or sync is None:
            raise InvalidState("use the transaction inside its async with block")
        return worker.submit(lambda: fn(sync))

    def execute(
        self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
    ) -> Coroutine[Any, Any, Rows]:
        """Run the caller's own SQL in this transaction, on its thread (awaited)."""
        return self._handed("execute", self._execute(sql, params))

    async def _execute(self, sql: str, params: Sequence[Any] | dict[str, Any]) -> Rows:
        return await finish(self._on_thread(lambda tx: _answer(tx.execute(sql, params))))

    def call(self, fn: Callable[..., T], *args: Any) -> Coroutine[Any, Any, T]:
        """``fn(tx, *args)`` on this transaction's thread, with the synchronous transaction
        (awaited)."""
        return self._handed("call", self._call(fn, *args))

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await finish(self._on_thread(lambda tx: fn(tx, *args)))


def _ended(call: Coroutine[Any, Any, Any]) -> bool:
    return inspect.getcoroutinestate(call) == inspect.CORO_CLOSED


class _Rollback(Exception):
    """Stands in, on the transaction's thread, for a cancellation or another BaseException
    that ended the block: the transaction rolls back as for any exception."""


class AsyncTransaction(ThreadTransaction):
    """``async with ledger.transaction() as tx``: the caller's rows and the intents they
    accept, in one transaction on one thread; committed on normal exit, rolled back on an
    exception or a cancellation (the module docstring says what a cancelled commit means)."""

    def __init__(self, ledger: AsyncLedger) -> None:
        super().__init__()
        self._ledger = ledger
        self._entered = False
        self._scope: LedgerTransaction | None = None

    @property
    def accepted(self) -> list[Effect]:
        """The effects this transaction created (not those it found already there)."""
        return [] if self._scope is None else self._scope.accepted

    async def __aenter__(self) -> AsyncTransaction:
        if self._entered:
            raise InvalidState("a transaction is entered once")
        self._entered = True
        ledger = self._ledger.sync
        worker = await self._ledger.pool.acquire()

        def begin() -> LedgerTransaction:
            scope = ledger.transaction()  # on this thread: its connection is this thread's
            return scope.__enter__()

        began = worker.submit(begin)
        try:
            scope = await finish(began)
        except BaseException:
            # Cancelled while beginning: a transaction that did begin is rolled back first.
            if began.done() and not began.cancelled() and began.exception() is None:
                opened = began.result()
                await _quietly(worker.submit(lambda: _end(opened, _Rollback())))
            self._ledger.pool.release(worker)
            raise
        self._scope = scope
        self._attach(worker, scope)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        worker, scope = self._worker, self._scope
        assert worker is not None and scope is not None  # entered
        self._detach()
        # A call never awaited (tx.accept without await) never ran: committing would keep the
        # caller's rows without it. One still running in another task ran before this, on the
        # same worker, and is undone with the rest.
        unfinished = self._unfinished()
        # The caller's own exception goes into the synchronous exit (a driver error is
        # translated there, as in a with block); a BaseException becomes a plain rollback.
        reason: BaseException | None = (
            exc if exc is None or isinstance(exc, Exception) else _Rollback()
        )
        if reason is None and unfinished is not None:
            reason = unfinished
        try:
            await finish(worker.submit(lambda: _end(scope, reason)))
        finally:
            self._ledger.pool.release(worker)
        if exc is None and unfinished is not None:
            raise unfinished

    def _detach(self) -> None:
        self._worker, self._sync = None, None

    def accept(
        self,
        key: str,
        kind: str,
        payload: Any,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        delay_seconds: float = 0.0,
        deadline_seconds: float | None = None,
    ) -> Coroutine[Any, Any, Effect]:
        """Record the intent (awaited); durable when this transaction commits, with the rest.
        The same refusals as :meth:`oncewire.LedgerTransaction.accept`. Not awaited, the
        transaction refuses to commit (:class:`InvalidState`, rolled back)."""
        return self._handed(
            "accept",
            self._accept(
                key,
                kind,
                payload,
                max_attempts=max_attempts,
                delay_seconds=delay_seconds,
                deadline_seconds=deadline_seconds,
            ),
        )

    async def _accept(
        self,
        key: str,
        kind: str,
        payload: Any,
        *,
        max_attempts: int,
        delay_seconds: float,
        deadline_seconds: float | None,
    ) -> Effect:
        scope = self._scope

        def accept(_: Transaction) -> Effect:
            assert scope is not None
            return scope.accept(
                key,
                kind,
                payload,
                max_attempts=max_attempts,
                delay_seconds=delay_seconds,
                deadline_seconds=deadline_seconds,
            )

        return await finish(self._on_thread(accept))


def _end(scope: LedgerTransaction, exc: BaseException | None) -> None:
    """Leave the synchronous transaction on its own thread: commit, or roll back for ``exc``.
    The caller's own exception coming back out is not news; anything else (a translated driver
    error, a refused commit) is raised."""
    try:
        scope.__exit__(None if exc is None else type(exc), exc, None)
    except BaseException as raised:
        if raised is exc:
            return
        raise


async def _quietly(future: cf.Future[Any]) -> None:
    try:
        await finish(future)
    except Exception:
        pass  # a rollback after a failure: the first failure is the one reported


class AsyncEffects:
    """``ledger.effects`` for asyncio: reads with :func:`asyncio.to_thread`, the operator's
    ``cancel`` and ``retry`` on one of the ledger's workers."""

    def __init__(self, ledger: AsyncLedger) -> None:
        self._ledger = ledger

    async def get(self, key: str) -> Effect:
        return await asyncio.to_thread(self._ledger.sync.effects.get, key)

    async def find(self, key: str) -> Effect | None:
        return await asyncio.to_thread(self._ledger.sync.effects.find, key)

    async def list(
        self,
        state: EffectState | str | Sequence[EffectState | str] | None = None,
        *,
        kind: str | None = None,
        limit: int = 100,
        after_id: int = 0,
        newest_first: bool = False,
        before_id: int | None = None,
    ) -> builtins.list[Effect]:
        return await asyncio.to_thread(
            self._ledger.sync.effects.list,
            state,
            kind=kind,
            limit=limit,
            after_id=after_id,
            newest_first=newest_first,
            before_id=before_id,
        )

    async def counts(self, *, kind: str | None = None) -> dict[EffectState, int]:
        return await asyncio.to_thread(self._ledger.sync.effects.counts, kind=kind)

    async def attempts(self, key: str) -> builtins.list[AttemptRecord]:
        return await asyncio.to_thread(self._ledger.sync.effects.attempts, key)

    async def cancel(self, key: str, reason: str = "cancelled by operator") -> Effect:
        return await self._ledger.on_worker(lambda: self._ledger.sync.effects.cancel(key, reason))

    async def retry(self, key: str) -> Effect:
        return await self._ledger.on_worker(lambda: self._ledger.sync.effects.retry(key))


class AsyncLedger:
    """``async with AsyncLedger("app.db") as ledger``: the :class:`~oncewire.Ledger` for
    asyncio callers (``AsyncLedger("postgresql://...")`` alike).

    ``url_or_ledger`` is what :class:`~oncewire.Ledger` takes, or a ``Ledger`` already open
    (then closing this one closes it too); ``ledger_options`` go to ``Ledger``.
    ``max_transactions`` bounds the transactions (and so the worker threads and their
    connections) open at once; more wait for a worker. Opening (which may ride out a busy file
    or a restarting server) runs on a thread: ``async with`` or ``await ledger.open()``.
    ``ledger.sync`` is the synchronous ``Ledger``, for a :class:`~oncewire.Dispatcher`.
    """

    def __init__(
        self,
        url_or_ledger: str | Ledger,
        *,
        max_transactions: int = DEFAULT_MAX_TRANSACTIONS,
        **ledger_options: Any,
    ) -> None:
        self._target = url_or_ledger
        self._options = ledger_options
        self._sync: Ledger | None = url_or_ledger if isinstance(url_or_ledger, Ledger) else None
        self.pool = WorkerPool(max_transactions, "oncewire-aio-tx")
        self.effects = AsyncEffects(self)

    @property
    def sync(self) -> Ledger:
        if self._sync is None:
            raise InvalidState("open the AsyncLedger first (async with, or await open())")
        return self._sync

    async def open(self) -> AsyncLedger:
        if self._sync is None:
            target = self._target
            assert isinstance(target, str)
            self._sync = await asyncio.to_thread(Ledger, target, **self._options)
        return self

    async def aclose(self) -> None:
        """Wait for the transactions in progress to end, stop the workers, close the store."""
        await self.pool.close()
        if self._sync is not None:
            await asyncio.to_thread(self._sync.close)

    async def __aenter__(self) -> AsyncLedger:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def transaction(self) -> AsyncTransaction:
        """One transaction for the caller's rows and the intents they accept."""
        return AsyncTransaction(self)

    async def on_worker(self, fn: Callable[[], T]) -> T:
        """``fn()`` on one of this ledger's workers (a write of its own: its transaction
        begins and ends on that thread); a cancellation waits for it to end."""
        worker = await self.pool.acquire()
        try:
            return await finish(worker.submit(fn))
        finally:
            self.pool.release(worker)

    async def accept(
        self,
        key: str,
        kind: str,
        payload: Any,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        delay_seconds: float = 0.0,
        deadline_seconds: float | None = None,
    ) -> Effect:
        """Accept one effect in a transaction of its own (on one worker, in one call)."""
        ledger = self.sync
        return await self.on_worker(
            lambda: ledger.accept(
                key,
                kind,
                payload,
                max_attempts=max_attempts,
                delay_seconds=delay_seconds,
                deadline_seconds=deadline_seconds,
            )
        )

    async def accept_in(
        self,
        connection: Any,
        key: str,
        kind: str,
        payload: Any,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        delay_seconds: float = 0.0,
        deadline_seconds: float | None = None,
    ) -> Effect:
        """Record the intent through the caller's ``psycopg.AsyncConnection``, inside the
        caller's open transaction (a FastAPI request's, an async ORM session's); the caller
        commits or rolls back, and the effect with it.

        The synchronous :meth:`oncewire.Ledger.accept_in` runs on a thread with the same
        validation, limits, conflicts and statements; each statement is awaited on the
        caller's event loop, on ``connection``. A cancellation waits for the statement in
        flight, so nothing of oncewire's is running on the connection once this returns or
        raises. A connection that is not a ``psycopg.AsyncConnection`` inside an open
        transaction, or a SQLite ledger, is :class:`InvalidState` before anything is written.
        With SQLAlchemy's asyncio extension, pass ``(await session.connection()).
        get_raw_connection().driver_connection``.
        """
        ledger = self.sync
        bridge = LoopBridge(asyncio.get_running_loop())
        tx = ledger.store.awaited_caller_transaction(connection, bridge.run)

        def accept() -> Effect:
            effect, _ = ledger.effects.accept_in_tx(
                tx,
                key,
                kind,
                payload,
                max_attempts=max_attempts,
                delay_seconds=delay_seconds,
                deadline_seconds=deadline_seconds,
            )
            return effect

        # Not a worker of the pool: nothing here touches oncewire's own connections.
        future: cf.Future[Effect] = cf.Future()
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, _complete, future, accept)
        return await finish(future)


def _complete(future: cf.Future[T], fn: Callable[[], T]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn())
    except BaseException as exc:
        future.set_exception(exc)
