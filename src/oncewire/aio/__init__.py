"""oncewire for asyncio: the ledger, the receiver and the reply engine, awaited.

The stores stay synchronous; this package runs their calls on threads so that the event loop
never waits on a database (:mod:`oncewire.aio.threads`), and keeps each transaction on one
thread of its own. ``docs/asyncio.md`` is the guide:

* :class:`AsyncLedger` (``async with ledger.transaction() as tx``, ``await ledger.accept``,
  ``await ledger.effects.get``, ``await ledger.accept_in`` on a ``psycopg.AsyncConnection``);
* :class:`AsyncReceipts` (``await receipts.run_once(key, payload, async_work)``);
* :class:`AsyncReplyEngine` (``async def`` platform adapters, ``stream`` over an async
  iterable of text), the one delivery algorithm of :class:`~oncewire.ReplyEngine`.

A dispatcher needs nothing here: :class:`~oncewire.Dispatcher` already awaits ``async def``
sinks on an event loop of its own; give it ``async_ledger.sync``.
"""

from __future__ import annotations

from oncewire.aio.ledger import (
    DEFAULT_MAX_TRANSACTIONS,
    AsyncEffects,
    AsyncLedger,
    AsyncTransaction,
    Rows,
    ThreadTransaction,
)
from oncewire.aio.receipts import AsyncReceipts
from oncewire.aio.replies import DEFAULT_MAX_PASSES, AsyncReplyEngine

__all__ = [
    "DEFAULT_MAX_PASSES",
    "DEFAULT_MAX_TRANSACTIONS",
    "AsyncEffects",
    "AsyncLedger",
    "AsyncReceipts",
    "AsyncReplyEngine",
    "AsyncTransaction",
    "Rows",
    "ThreadTransaction",
]
