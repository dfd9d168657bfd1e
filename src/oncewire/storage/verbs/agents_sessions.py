"""The OpenAI Agents SDK's sessions, written once (``storage/sql/agents_sessions.sql``).

A session is an ordered list of conversation items, each stored as canonical JSON text under
``(session_id, seq)``. The invariants, held by the database:

* **insertion order**: an append numbers its items after the session's ``last_seq``, raised
  under the session row's lock, so the items of a session read back in the order they were
  added, whoever added them and however the appends interleaved;
* **one pop per item**: a pop locks the session's row before it takes the newest item, so two
  pops (two threads, two processes, two hosts) never return the same item, and a pop finds
  the newest item that is still there;
* **a clear misses nothing**: it removes the session's row first (the lock), then every item
  that any committed append wrote.

The texts are the caller's: the verbs store them as given and return them as stored (the
session layer, :mod:`oncewire.agents.session`, encodes and decodes them). Verbs ending in
``_in_tx`` run in the caller's transaction; the others are each their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oncewire.core.errors import ConfigurationError
from oncewire.storage.driver import Driver, Transaction
from oncewire.storage.twins import verb_twins

__all__ = ["AgentSessionItem", "AgentSessionVerbs"]

_ROWS_PER_STATEMENT = 512  # items inserted by one statement (SQLite binds two values each)


@dataclass(frozen=True, slots=True)
class AgentSessionItem:
    """One stored item of a session: its number in the session, its JSON text, when added."""

    seq: int
    item_json: str
    created_at: float

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> AgentSessionItem:
        seq, item, created_at = row
        return cls(int(seq), str(item), float(created_at))


def _check_id(session_id: str) -> None:
    if not isinstance(session_id, str) or not session_id:
        raise ConfigurationError("a session needs a non-empty session_id (a string)")


def _check_limit(limit: int | None) -> None:
    if limit is not None and (type(limit) is not int or limit < 0):
        raise ConfigurationError(f"limit must be None or a count of items (>= 0), not {limit!r}")


class AgentSessionVerbs:
    """The seam of the Agents SDK's sessions: append, read, pop and clear a session's items."""

    db: Driver

    # -- append ------------------------------------------------------------------------------
    def agent_session_append_items(
        self, session_id: str, items_json: Sequence[str], *, now: float
    ) -> list[int]:
        """Append ``items_json`` (JSON texts, stored as given) to the session, after its
        newest item, in one transaction of its own; their sequence numbers, in order. Nothing
        is written for an empty list."""
        _check_id(session_id)
        texts = list(items_json)
        if not texts:
            return []
        with self.db.write("adding items to an agents session") as conn:
            return self._agents_append(conn, session_id, texts, now)

    def agent_session_append_items_in_tx(
        self, tx: Transaction, session_id: str, items_json: Sequence[str], *, now: float
    ) -> list[int]:
        """:meth:`agent_session_append_items` in the caller's transaction: the items are there when
        it commits and never were when it rolls back. The session's row stays locked until
        then (another writer of the same session waits)."""
        _check_id(session_id)
        texts = list(items_json)
        db = self.db
        conn = db.tx_conn(tx)
        if not texts:
            return []
        with db.translate_errors("adding items to an agents session"):
            return self._agents_append(conn, session_id, texts, now)

    def _agents_append(self, conn: Any, session_id: str, texts: list[str], now: float) -> list[int]:
        for text in texts:
            if not isinstance(text, str):
                raise ConfigurationError(f"a session item is stored as JSON text, not {text!r}")
        db, q = self.db, self.db.queries
        row = db.one(
            conn, q.agent_session_reserve_seqs, session_id=session_id, count=len(texts), now=now
        )
        assert row is not None  # an upsert with RETURNING always returns its row
        first = int(row[0]) - len(texts) + 1
        seqs = list(range(first, first + len(texts)))
        for start in range(0, len(texts), _ROWS_PER_STATEMENT):
            rows = list(
                zip(
                    seqs[start : start + _ROWS_PER_STATEMENT],
                    texts[start : start + _ROWS_PER_STATEMENT],
                    strict=True,
                )
            )
            db.run(conn, q.agent_session_insert_items, rows=rows, session_id=session_id, now=now)
        return seqs

    # -- read --------------------------------------------------------------------------------
    def agent_session_items(
        self, session_id: str, *, limit: int | None = None
    ) -> list[AgentSessionItem]:
        """The session's items, oldest first: all of them (``limit`` None) or the newest
        ``limit`` (none for 0). An unknown session has none."""
        _check_id(session_id)
        _check_limit(limit)
        if limit == 0:
            return []
        db, q = self.db, self.db.queries
        if limit is None:
            rows = db.read(q.agent_session_items, session_id=session_id)
        else:
            rows = db.read(q.agent_session_latest_items, session_id=session_id, limit=limit)[::-1]
        return [AgentSessionItem.from_row(row) for row in rows]

    def agent_session_items_in_tx(
        self, tx: Transaction, session_id: str, *, limit: int | None = None
    ) -> list[AgentSessionItem]:
        """:meth:`agent_session_items` as the caller's transaction sees them (its own appends and
        pops included)."""
        _check_id(session_id)
        _check_limit(limit)
        db, q = self.db, self.db.queries
        conn = db.tx_conn(tx)
        if limit == 0:
            return []
        with db.translate_errors("reading an agents session"):
            if limit is None:
                rows = db.all(conn, q.agent_session_items, session_id=session_id)
            else:
                rows = db.all(
                    conn, q.agent_session_latest_items, session_id=session_id, limit=limit
                )
                rows = rows[::-1]
        return [AgentSessionItem.from_row(row) for row in rows]

    # -- pop ---------------------------------------------------------------------------------
    def _agent_session_pop_item(
        self, conn: Any, session_id: str, *, now: float
    ) -> AgentSessionItem | None:
        """Remove the session's newest item and return it, in one transaction of its own;
        None when it has none. Two pops never return the same item."""
        db, q = self.db, self.db.queries
        if db.one(conn, q.agent_session_lock_session, session_id=session_id, now=now) is None:
            return None  # no row, no items (a clear removes both; an append makes both)
        row = db.one(conn, q.agent_session_pop_item, session_id=session_id)
        return None if row is None else AgentSessionItem.from_row(row)

    agent_session_pop_item, agent_session_pop_item_in_tx = verb_twins(
        "popping an agents session's item",
        _agent_session_pop_item,
        in_tx_doc=":meth:`agent_session_pop_item` in the caller's transaction: a rollback puts "
        "the item back (under its own number, in its own place).",
        check=lambda session_id, *, now: _check_id(session_id),
    )

    # -- clear -------------------------------------------------------------------------------
    def _agent_session_clear_session(self, conn: Any, session_id: str) -> int:
        """Remove the session (its row and every item), in one transaction of its own; how
        many items it had. The next append starts it afresh, numbering from 1."""
        db, q = self.db, self.db.queries
        db.run(conn, q.agent_session_delete_session, session_id=session_id)  # the lock, first
        return db.run(conn, q.agent_session_delete_items, session_id=session_id)

    agent_session_clear_session, agent_session_clear_session_in_tx = verb_twins(
        "clearing an agents session", _agent_session_clear_session, check=_check_id
    )
