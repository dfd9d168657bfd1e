"""A durable run's session: the conversation a run reads and writes, in the run's transactions.

When ``oncewire.agents.run(..., session=OncewireSession(...))`` runs, the SDK (openai-agents
0.24) talks to the session on its own, at these points of ``agents.run`` and
``agents.run_internal`` (``session_persistence.py``):

1. ``prepare_input_with_session``: ``get_items()`` once, before the first model call; the
   history it returns, followed by the run's input, is what step 0 asks the model;
2. ``save_result_to_session(session, input_items, [])``: ``add_items(the run's input)``, once,
   still before the first model call;
3. ``save_result_to_session(session, [], turn items)`` after each turn (once its tools have
   answered): ``add_items`` of what that turn produced (the model's items, the tools' outputs,
   a handoff's items), the final turn included, before the run returns;
4. ``pop_item``/``get_items`` again only to rewind after a conversation-lock retry of a
   server-managed conversation, where the SDK saves nothing through the session at all.

The model's input for later turns is built from the run's own items, never read back from the
session. So the SDK, given the same recorded steps, makes the same calls in the same order on
every attempt of a run. The session of a durable run is therefore a :class:`RunSession` view
over the caller's :class:`~oncewire.agents.OncewireSession`:

* **the session as the run found it.** The session's last ``seq`` when the run first looked
  (its *base*) is written into step 0's record. ``get_items`` answers with the items up to the
  base (followed by the items this attempt has added so far), so a resumed run reads the
  history its step 0 was asked with, whatever the crashed attempt had added: the request
  digest compares equal and the run is not refused as diverged;
* **written with the steps.** ``add_items`` writes nothing at once: its items wait, in order,
  and are appended to the session in the transaction that records the run's next model step
  (which cannot be asked without them), or, for the final turn, in one transaction when the
  run returns. The input (the user's turn) is therefore committed with step 0, the base in
  the same row: saved once, or not at all, and then saved by the attempt that records step 0;
* **nothing added twice.** Every item the run adds has a position (the ``n``-th item of the
  run). The items the session holds after the base are the run's committed ones; a resumed
  attempt counts its ``add_items`` from 0 again and skips each item whose position is already
  committed, so every item is there once, in its place.

What this keeps after a crash anywhere: the session never holds an item of a turn whose step
the run has not recorded, nor a tool output other than the tool's effect's answer (a turn's
items are written after its tools' effects ended); the run's input is in the session exactly
when step 0 is recorded; and once the run has been resumed to its end, the session holds what
an uninterrupted run would have left, each item once. Between the crash and that resume, the
session may lack the last turn's items (the run's record has them: resuming writes them).

Only the top-level run's session is a view: a run inside a tool that passes a session of its
own uses it as the SDK does. Other writers to the same session during a run are not expected:
the run's own items are those after its base.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import TYPE_CHECKING, Any

from oncewire.core.errors import ConfigurationError
from oncewire.core.extras import refusal
from oncewire.ledger import Ledger
from oncewire.storage import Transaction

try:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import resolve_session_limit
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("agents", "oncewire.agents", exc) from exc

from oncewire.agents.session import OncewireSession, _count, _encoded
from oncewire.core.canonical import loads

if TYPE_CHECKING:
    from oncewire.agents.scope import Scope

__all__ = ["SESSION_FIELD", "RunSession", "bind"]

SESSION_FIELD = "session"  # the key of step 0's record that holds the session's base


def bind(session: Any, ledger: Ledger) -> Any:
    """The session the SDK is given in a durable run on ``ledger``: an OncewireSession of that
    ledger's store (rebound to it when it names the same database); any other session as is
    (the SDK keeps it, outside the run's transactions)."""
    if not isinstance(session, OncewireSession):
        return session
    if session.store is not ledger.store:
        if session.store.url != ledger.store.url:
            raise ConfigurationError(
                f"the session {session.session_id!r} is kept in {session.store.url!r}, the run "
                f"in {ledger.store.url!r}: a durable run writes its session in its own "
                "transactions, so give OncewireSession the run's ledger"
            )
        session = OncewireSession(
            session.session_id,
            ledger,
            session_settings=session.session_settings,
            clock=session.clock,
        )
    return session


class RunSession:
    """The SDK's ``Session`` protocol for one durable run (see the module docstring)."""

    def __init__(self, session: OncewireSession, scope: Scope) -> None:
        self.session = session
        self.scope = scope
        self.session_id = session.session_id
        self.session_settings = session.session_settings
        self.base: int | None = None  # the session's last seq when the run first looked
        self.committed: list[str] = []  # the run's items the session holds (after the base)
        self.history: list[str] = []  # the session's items up to the base
        self.added = 0  # the items this attempt has added (committed or pending)
        self.pending: list[str] = []  # added, waiting for the next step's transaction
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RunSession({self.session_id!r}, run_key={self.scope.key!r})"

    # -- what the run found ------------------------------------------------------------------
    async def _found(self) -> None:
        if self.base is not None:
            return
        step0 = await self.scope.recorded_step(0)
        recorded = None if step0 is None else loads(step0.response_json).get(SESSION_FIELD)
        rows = await asyncio.to_thread(
            self.session.store.agent_session_items, self.session_id, limit=None
        )
        if isinstance(recorded, dict) and recorded.get("id") == self.session_id:
            base = int(recorded["seq"])
        else:
            base = rows[-1].seq if rows else 0
        if self.base is None:
            self.base = base
            self.history = [row.item_json for row in rows if row.seq <= base]
            self.committed = [row.item_json for row in rows if row.seq > base]

    # -- the Session protocol ----------------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The items up to the run's base, then those this attempt has added."""
        await self._found()
        count = _count(resolve_session_limit(limit, self.session_settings))
        with self._lock:
            mine = self.committed[: min(self.added, len(self.committed))] + self.pending
            texts = self.history + mine
        if count is not None:
            texts = texts[len(texts) - count :] if count else []
        return [loads(text) for text in texts]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Hold ``items`` for the next step's transaction (those already committed by an
        earlier attempt of this run are skipped)."""
        texts = _encoded(items)
        await self._found()
        with self._lock:
            for text in texts:
                if self.added >= len(self.committed):
                    self.pending.append(text)
                self.added += 1

    async def pop_item(self) -> TResponseInputItem | None:
        """The newest item this attempt holds, else the session's own newest (the SDK pops
        only to rewind a server-managed conversation, where it saves nothing here)."""
        with self._lock:
            if self.pending:
                self.added -= 1
                item: TResponseInputItem = loads(self.pending.pop())
                return item
        return await self.session.pop_item()

    async def clear_session(self) -> None:
        """Clear the session; the run's view starts afresh with it."""
        with self._lock:
            self.pending.clear()
        await self.session.clear_session()
        self.base = None
        self.added = 0

    # -- in the step's transaction -----------------------------------------------------------
    def write_in_tx(self, tx: Transaction) -> int:
        """Append the pending items in ``tx`` (by the step recorder, or at the end); how many.
        They count as committed once ``tx`` has (:meth:`written`)."""
        with self._lock:
            texts = list(self.pending)
        if texts:
            store = self.session.store
            store.agent_session_append_items_in_tx(
                tx, self.session_id, texts, now=self.session.clock.now()
            )
        return len(texts)

    def written(self, count: int) -> None:
        """The first ``count`` pending items are committed (by this attempt, or by the one
        that recorded the step first)."""
        with self._lock:
            self.committed.extend(self.pending[:count])
            del self.pending[:count]

    def record_field(self) -> dict[str, Any]:
        """What step 0's record keeps of the session: its id and the run's base."""
        return {"id": self.session_id, "seq": self.base if self.base is not None else 0}

    def flush(self) -> None:
        """Write what the last turn added, in a transaction of its own (the run returned)."""
        if not self.pending:
            return
        with self.scope.ledger.transaction() as tx:
            count = self.write_in_tx(tx.store_transaction)
        self.written(count)


def with_base(response_json: str, session: RunSession) -> str:
    """Step 0's stored response with the session's base beside it (decoding ignores it)."""
    data = json.loads(response_json)
    data[SESSION_FIELD] = session.record_field()
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
