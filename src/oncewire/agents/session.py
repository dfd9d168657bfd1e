"""OncewireSession: the OpenAI Agents SDK's ``Session`` on the ledger's own store.

The SDK's ``Session`` protocol (``agents.memory.Session``, openai-agents 0.24) is a
conversation's memory: ``get_items(limit)``, ``add_items``, ``pop_item``, ``clear_session`` and
``session_settings``. :class:`OncewireSession` keeps it in the store of a
:class:`~oncewire.Ledger` (SQLite or PostgreSQL), through the store's ``agent_session_*``
verbs (:mod:`oncewire.storage.verbs.agents_sessions`), and behaves as the SDK's own
``SQLiteSession`` does on the same calls (a test applies random sequences of calls to both
and compares every answer).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any, TypeVar

try:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    from oncewire.core.extras import refusal

    raise refusal("agents", "oncewire.agents.OncewireSession", exc) from exc

from oncewire.aio.threads import finish
from oncewire.core.canonical import canonical_json, loads
from oncewire.core.clock import Clock, SystemClock
from oncewire.core.errors import WrongType
from oncewire.ledger import Ledger
from oncewire.storage import AgentStore, Store, Transaction
from oncewire.storage.verbs.agents_sessions import AgentSessionItem

__all__ = ["OncewireSession"]

T = TypeVar("T")


class OncewireSession:
    """The SDK's ``Session`` protocol for one conversation, kept in the ledger's store.

    ``OncewireSession(session_id, ledger)`` (a :class:`~oncewire.Ledger`, or a
    :class:`~oncewire.storage.Store`) is passed wherever the SDK takes a session
    (``Runner.run(agent, input, session=...)``). What it keeps:

    * **order**: items are stored as canonical JSON, each numbered in its session after the
      ones before it, under the session row's lock, so they read back in the order they were
      added, whichever thread, process or host added them;
    * ``get_items(limit)``: the newest ``limit`` items in chronological order (``limit``
      None: ``session_settings.limit``, and all of them when that is None too). As in the SDK's
      ``SQLiteSession``, 0 is no items and a negative limit is all of them;
    * ``pop_item()``: removes and returns the newest item (None when there is none),
      atomically: two pops, in two processes, never return the same item;
    * ``clear_session()``: removes every item; the next ``add_items`` starts afresh.

    An item must be plain JSON (what the SDK's input items are): anything else, NaN or
    Infinity included, is :class:`~oncewire.errors.InvalidPayload` and nothing is written.
    An item reads back equal to what was added (as a dict: canonical JSON sorts its keys).

    **Off the event loop.** The store is synchronous; each call runs on a thread of the
    event loop's default executor (borrowing one of the store's idle connections, as
    :meth:`Store.borrowed_connection` lends them), so the loop never waits on the database.
    A mutation (``add_items``, ``pop_item``, ``clear_session``) is awaited to its end even
    when the awaiting task is cancelled meanwhile, then the cancellation is delivered: it has
    committed, or it has not, before the caller's next line runs.

    **In the caller's transaction** (the seam a durable run stands on). ``add_items_in_tx(tx,
    items)``, ``pop_item_in_tx(tx)``, ``clear_session_in_tx(tx)`` and
    ``get_items_in_tx(tx, limit)`` take an open ``with ledger.transaction() as tx`` (or a
    store transaction) and write in it, synchronously, on the caller's thread. A run that
    records a model response, or a tool call's effect, in the same transaction as the
    conversation items that response adds commits both or neither: after a crash, the run's
    memory and its actions cannot disagree (a session never holds the answer of a step that
    the run has no record of, and the run never holds a step whose items the session lost).
    Inside such a transaction, on the same thread, use the ``_in_tx`` forms only: an
    ``await session.add_items`` there would be a second transaction waiting on the first.
    """

    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        ledger: Ledger | Store,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise WrongType(f"session_id must be a non-empty string, not {session_id!r}")
        if isinstance(ledger, Ledger):
            self.store: AgentStore = ledger.store
            self.clock: Clock = clock or ledger.clock
        elif isinstance(ledger, Store):
            self.store, self.clock = ledger, clock or SystemClock()
        else:
            raise WrongType(
                f"OncewireSession needs a Ledger or a Store, not {type(ledger).__name__} "
                "(for an AsyncLedger, pass its .sync)"
            )
        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )

    def __repr__(self) -> str:
        return f"OncewireSession({self.session_id!r}, {self.store.url!r})"

    # -- the Session protocol ----------------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation so far, oldest first: the newest ``limit`` items (``limit`` None:
        ``session_settings.limit``; None again: every item)."""
        count = _count(resolve_session_limit(limit, self.session_settings))
        return await self._off_loop(lambda: self._read(count), mutation=False)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` after the newest, in one transaction (all of them, or none)."""
        texts = _encoded(items)
        if not texts:
            return
        await self._off_loop(lambda: self._append(texts), mutation=True)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item; None when the session has none."""
        return await self._off_loop(self._pop, mutation=True)

    async def clear_session(self) -> None:
        """Remove every item of this session."""
        await self._off_loop(lambda: self.store.agent_session_clear_session(self.session_id), True)

    # -- in the caller's transaction ---------------------------------------------------------
    def get_items_in_tx(
        self, tx: Transaction, limit: int | None = None
    ) -> list[TResponseInputItem]:
        """:meth:`get_items` as ``tx`` sees the session (its own writes included)."""
        count = _count(resolve_session_limit(limit, self.session_settings))
        rows = self.store.agent_session_items_in_tx(tx, self.session_id, limit=count)
        return [_decoded(row) for row in rows]

    def add_items_in_tx(self, tx: Transaction, items: list[TResponseInputItem]) -> None:
        """:meth:`add_items` in ``tx``: there when it commits, never there if it rolls back.
        The session stays locked to other writers until then."""
        texts = _encoded(items)
        now = self.clock.now()
        self.store.agent_session_append_items_in_tx(tx, self.session_id, texts, now=now)

    def pop_item_in_tx(self, tx: Transaction) -> TResponseInputItem | None:
        """:meth:`pop_item` in ``tx``: a rollback puts the item back where it was."""
        row = self.store.agent_session_pop_item_in_tx(tx, self.session_id, now=self.clock.now())
        return None if row is None else _decoded(row)

    def clear_session_in_tx(self, tx: Transaction) -> None:
        """:meth:`clear_session` in ``tx``."""
        self.store.agent_session_clear_session_in_tx(tx, self.session_id)

    # -- on a thread -------------------------------------------------------------------------
    def _read(self, count: int | None) -> list[TResponseInputItem]:
        return [
            _decoded(row) for row in self.store.agent_session_items(self.session_id, limit=count)
        ]

    def _append(self, texts: list[str]) -> None:
        self.store.agent_session_append_items(self.session_id, texts, now=self.clock.now())

    def _pop(self) -> TResponseInputItem | None:
        row = self.store.agent_session_pop_item(self.session_id, now=self.clock.now())
        return None if row is None else _decoded(row)

    async def _off_loop(self, fn: Callable[[], T], mutation: bool) -> T:
        store = self.store

        def on_thread() -> T:
            with store.borrowed_connection():
                return fn()

        context = contextvars.copy_context()
        job = asyncio.get_running_loop().run_in_executor(None, context.run, on_thread)
        if not mutation:
            return await job  # a read abandoned half way changes nothing
        return await finish(job)


def _count(limit: int | None) -> int | None:
    """The SDK's limit as a count of items: a negative one is every item (``SQLiteSession``
    passes it to SQLite's ``LIMIT``, where a negative number is no limit)."""
    if limit is None:
        return None
    if type(limit) is not int:
        raise WrongType(f"limit must be an int or None, not {limit!r}")
    return None if limit < 0 else limit


def _encoded(items: list[TResponseInputItem]) -> list[str]:
    if not isinstance(items, list | tuple):
        raise WrongType(f"add_items takes a list of items, not {type(items).__name__}")
    return [canonical_json(item) for item in items]


def _decoded(row: AgentSessionItem) -> TResponseInputItem:
    item: TResponseInputItem = loads(row.item_json)
    return item
