"""The Store: the only way ledgers and engines touch a database.

One seam per ledger: the verbs of each ledger are one class in :mod:`oncewire.storage.verbs`,
written once over the backend's driver, whose docstrings are the contract (``EffectVerbs`` for
the outbox, ``ReceiptVerbs`` for the receiver, ``InboundReplyVerbs`` for the inbox and the
replies, ``RunLedgerVerbs`` for the run ledger); :class:`Store` inherits them and declares only
the lifecycle each backend implements.

A store speaks in domain verbs (accept an effect, claim what is due, settle an attempt, reserve a
receipt), never in raw SQL from the layers above. Verbs whose name ends in ``_in_tx`` run inside
a transaction the caller opened with :meth:`Store.transaction`, so that the caller's own writes
and oncewire's commit together; every other verb is its own transaction.

Each backend keeps its schema as numbered SQL files and translates its driver's errors into the
:mod:`oncewire.core.errors` tree at this boundary, once.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from oncewire.storage.driver import Transaction
from oncewire.storage.inspection import Inspection
from oncewire.storage.records import (
    Effect,
    EffectState,
)
from oncewire.storage.verbs.effects import EffectVerbs
from oncewire.storage.verbs.receipts import ReceiptVerbs
from oncewire.storage.verbs.replies import InboundReplyVerbs
from oncewire.storage.verbs.runs import RunLedgerVerbs

__all__ = ["Store", "Transaction"]


class _Savepoint:
    __slots__ = ("name", "tx")

    def __init__(self, tx: Transaction, name: str) -> None:
        if not name.isidentifier():
            raise ValueError(f"savepoint name {name!r} is not an identifier")
        self.tx, self.name = tx, name

    def _run(self, sql: str) -> None:
        # oncewire's own savepoints bypass the caller's statement check, and are recorded as
        # oncewire's: the caller's SQL may not release or roll back to them.
        internal = getattr(self.tx, "execute_internal", None)
        savepoints = getattr(self.tx, "savepoints", None)
        if internal is None:
            self.tx.execute(sql)
            return
        internal(sql)
        if savepoints is not None:
            if sql.startswith("SAVEPOINT"):
                savepoints.opened(self.name, by_caller=False)
            elif sql.startswith("RELEASE"):
                savepoints.released(self.name)

    def __enter__(self) -> None:
        self._run(f'SAVEPOINT "{self.name}"')

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            self._run(f'ROLLBACK TO SAVEPOINT "{self.name}"')
        self._run(f'RELEASE SAVEPOINT "{self.name}"')


class Store(EffectVerbs, ReceiptVerbs, InboundReplyVerbs, RunLedgerVerbs, abc.ABC):
    """A backend. Thread-safe: each thread gets its own connection."""

    dialect: str
    url: str

    # -- lifecycle ---------------------------------------------------------------------------
    @abc.abstractmethod
    def transaction(self) -> AbstractContextManager[Transaction]:
        """A write transaction: committed on normal exit, rolled back on an exception."""

    @abc.abstractmethod
    def schema_version(self) -> int: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    # -- helpers -----------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """Facts an operator checks: backend, versions, durability settings, server time."""
        return {"backend": self.dialect, "schema_version": self.schema_version()}

    @abc.abstractmethod
    def inspect(self) -> Inspection:
        """For ``oncewire doctor``: a write probe (always rolled back), the backend's integrity
        check, and the schema's objects compared with the packaged ``schema.sql``."""

    def group_commit(self) -> AbstractContextManager[None]:
        """Make the transactions of this thread inside the block durable together at its end.

        Each transaction still commits atomically on its own (a crash of the process loses
        none of them); what changes is that they reach the disk with one flush when the block
        ends instead of one per commit. Only for idempotent batches that are safe to redo after
        a power loss, such as a reconciliation sweep. The default keeps every commit durable.
        """
        return contextlib.nullcontext()

    @abc.abstractmethod
    def caller_transaction(self, connection: Any) -> Transaction:
        """The caller's own driver connection, inside the caller's own open transaction, as a
        transaction oncewire's ``_in_tx`` verbs write through; committing stays the caller's.

        A connection of another driver, or one that is not inside an open transaction, is
        :class:`~oncewire.core.errors.InvalidState` before anything is written.
        """

    def savepoint_in_tx(self, tx: Transaction, name: str) -> AbstractContextManager[None]:
        """A nested scope inside ``tx``: an exception rolls back only what the scope wrote.

        SAVEPOINT / RELEASE / ROLLBACK TO mean the same on every backend oncewire supports.
        """
        return _Savepoint(tx, name)

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` when new effects commit, where the backend can tell; return a stopper.

        The default cannot tell (SQLite has no cross-process notifications): dispatchers poll.
        """
        return lambda: None

    def iter_effects(
        self, *, states: Sequence[EffectState] = (), page: int = 500
    ) -> Iterator[Effect]:
        after = 0
        while True:
            rows = self.list_effects(states=states, limit=page, after_id=after)
            yield from rows
            if len(rows) < page:
                return
            after = rows[-1].id
