"""The Store: the only way ledgers and engines touch a database.

One seam per ledger: the verbs of each ledger are one class in :mod:`oncewire.storage.verbs`,
written once over the backend's driver, whose docstrings are the contract (``EffectVerbs`` for
the outbox, ``ReceiptVerbs`` for the receiver, ``InboundVerbs`` for the inbox, ``ReplyVerbs``
for the replies, ``RunLedgerVerbs`` for the run ledger, ``LeaseVerbs`` for named leases such as a
gateway's bot leases). :class:`Store` inherits them and holds the lifecycle once (opening
with retries, transactions, savepoints, notifications, health); a backend is a
:class:`~oncewire.storage.driver.Driver` and a constructor (``SQLiteStore``,
``PostgresStore``).

A store speaks in domain verbs (accept an effect, claim what is due, settle an attempt, reserve a
receipt), never in raw SQL from the layers above. Verbs whose name ends in ``_in_tx`` run inside
a transaction the caller opened with :meth:`Store.transaction`, so that the caller's own writes
and oncewire's commit together; every other verb is its own transaction.

Each backend keeps its schema as numbered SQL files and translates its driver's errors into the
:mod:`oncewire.core.errors` tree at its driver, once.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from oncewire.storage.driver import Driver
from oncewire.storage.inspection import Inspection
from oncewire.storage.opening import (
    DEFAULT_OPEN_TIMEOUT_SECONDS,
    check_open_timeout,
    open_with_retries,
)
from oncewire.storage.transaction import GuardedTransaction, Transaction, store_transaction
from oncewire.storage.verbs.agents import AgentVerbs
from oncewire.storage.verbs.agents_sessions import AgentSessionVerbs
from oncewire.storage.verbs.effects import EffectVerbs
from oncewire.storage.verbs.inbound import InboundVerbs
from oncewire.storage.verbs.langgraph import LangGraphVerbs
from oncewire.storage.verbs.langgraph_fast import LangGraphFastVerbs
from oncewire.storage.verbs.leases import LeaseVerbs
from oncewire.storage.verbs.receipts import ReceiptVerbs
from oncewire.storage.verbs.replies import ReplyVerbs
from oncewire.storage.verbs.runs import RunLedgerVerbs

__all__ = [
    "AgentStore",
    "EffectStore",
    "InboundStore",
    "LangGraphStore",
    "ReceiptStore",
    "ReplyStore",
    "RunStore",
    "Store",
    "StoreCore",
    "Transaction",
]


class StoreCore:
    """What every floor's store has, whichever verbs it speaks: opening with retries, the
    lifecycle, transactions and savepoints, notifications, the facts an operator reads."""

    def __init__(
        self,
        db: Driver,
        *,
        create: bool = True,
        adopt: bool = True,
        open_timeout_seconds: float = DEFAULT_OPEN_TIMEOUT_SECONDS,
    ) -> None:
        self.db = db
        self.dialect = db.dialect
        self.url = db.url
        open_with_retries(
            lambda: db.open(create=create, adopt=adopt),
            what=f"opening {db.label}",
            timeout_seconds=check_open_timeout(open_timeout_seconds),
            cleanup=db.close,
        )

    @property
    def read_only(self) -> bool:
        """Opened without writing (``read_only=True``): not migrated, every write refused."""
        return self.db.read_only

    @property
    def label(self) -> str:
        """What was opened, as messages name it: a SQLite store's file; on PostgreSQL, "the
        PostgreSQL store" (its URL may carry a password)."""
        return self.db.label

    @property
    def snapshot(self) -> bool:
        """Read as an immutable snapshot: a read-only SQLite file whose directory refused the
        WAL's ``-shm`` (what a concurrent writer commits is not seen)."""
        return self.db.immutable

    def shared_commits(self) -> dict[str, int] | None:
        """With ``group_commit=True`` on SQLite, this process's shared commits so far
        (``commits``) and the write transactions they made durable (``committed``); None
        where each transaction commits on its own."""
        return self.db.shared_commits()

    @property
    def commits_grouped(self) -> bool:
        """Opened with ``group_commit=True``: the write transactions of this process's threads
        share commits (:mod:`oncewire.storage.grouping`)."""
        return self.db.commits_grouped

    # -- lifecycle ---------------------------------------------------------------------------
    def transaction(self) -> AbstractContextManager[GuardedTransaction]:
        """A write transaction: committed on normal exit, rolled back on an exception."""
        return self.db.transaction()

    def close(self) -> None:
        self.db.close()

    def on_close(self, hook: Callable[[], None]) -> Callable[[], None]:
        """See :meth:`Driver.on_close`: ``hook()`` runs when the store begins to close."""
        return self.db.on_close(hook)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self.db.closed

    def borrowed_connection(self) -> AbstractContextManager[None]:
        """Inside the block, a thread without a connection of its own borrows an idle one of
        the store's and gives it back at the end, instead of opening one that stays open until
        the store closes (for work on short-lived threads, such as an executor's that a graph
        run makes anew); a thread with its own connection keeps using it."""
        return self.db.borrowed()

    def caller_transaction(self, connection: Any) -> GuardedTransaction:
        """The caller's own driver connection, inside the caller's own open transaction, as a
        transaction oncewire's ``_in_tx`` verbs write through; committing stays the caller's.

        A connection of another driver, or one that is not inside an open transaction, is
        :class:`~oncewire.core.errors.InvalidState` before anything is written.
        """
        return self.db.caller_transaction(connection)

    def awaited_caller_transaction(
        self, connection: Any, run: Callable[[Any], Any]
    ) -> GuardedTransaction:
        """:meth:`caller_transaction` for the caller's ``psycopg.AsyncConnection``, written
        through from a thread that is not its event loop: ``run(coroutine)`` awaits each
        statement on that loop. On a store that is not PostgreSQL, or with any other
        connection, :class:`~oncewire.core.errors.InvalidState` before anything is written."""
        return self.db.awaited_caller_transaction(connection, run)

    def savepoint_in_tx(self, tx: Transaction, name: str) -> AbstractContextManager[None]:
        """A nested scope inside ``tx``: an exception rolls back only what the scope wrote.

        SAVEPOINT / RELEASE / ROLLBACK TO mean the same on every backend oncewire supports. The
        savepoint is oncewire's: the caller's SQL in ``tx`` may not release or roll back to it.
        """
        self.db.tx_conn(tx)  # refused unless it is this store's open transaction
        inner = store_transaction(tx)
        assert isinstance(inner, GuardedTransaction)  # what tx_conn accepted
        return inner.savepoint(name)

    def group_commit(self) -> AbstractContextManager[None]:
        """Make the transactions of this thread inside the block durable together at its end.

        Each transaction still commits atomically on its own (a crash of the process loses
        none of them); what changes is that they reach the disk with one flush when the block
        ends instead of one per commit. Only for idempotent batches that are safe to redo after
        a power loss, such as a reconciliation sweep. Where the backend cannot, every commit
        stays durable on its own. (Not to be confused with ``group_commit=True`` when opening,
        which lets many threads' transactions share commits without giving up durability.)
        """
        return self.db.group_commit()

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` when new effects commit; return a stopper.

        SQLite: after any commit to the file, by any process, within a few milliseconds
        (``PRAGMA data_version`` watched by one thread per file). PostgreSQL: when effects are
        inserted (LISTEN on a connection of its own).
        """
        return self.db.subscribe(wake)

    def subscribe_settled(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` when effects may have ended (a tool call's caller waits for that);
        return a stopper. SQLite: as :meth:`subscribe`, any commit. PostgreSQL: a
        dispatcher's step that settles attempts sends ``NOTIFY oncewire_settled``."""
        return self.db.subscribe_settled(wake)

    def subscribe_inbound(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` when the inbox may have changed (a message admitted, a session's turn
        answered or superseded, an interrupt announced with :meth:`announce_inbound_in_tx`); a
        gateway's scheduler waits on it. Return a stopper. SQLite: as :meth:`subscribe`, any
        commit. PostgreSQL: ``NOTIFY oncewire_inbound`` (a trigger on the inbox)."""
        return self.db.subscribe_inbound(wake)

    def subscribe_replies(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` when a reply may have become deliverable by anyone (committed with no
        lease, or given back with a retry time); a delivery thread waits on it, and on the
        next due time for the rest. Return a stopper. SQLite: as :meth:`subscribe`, any commit.
        PostgreSQL: ``NOTIFY oncewire_replies`` (a trigger on the replies)."""
        return self.db.subscribe_replies(wake)

    # -- facts -------------------------------------------------------------------------------
    def schema_version(self) -> int:
        db = self.db
        current = db.schema.current_version
        return db.reading(lambda conn: current(conn) or 0, "reading the schema version")

    def health(self) -> dict[str, Any]:
        """Facts an operator checks: backend, versions, durability settings, server time."""
        return self.db.health(self.schema_version())

    def inspect(self) -> Inspection:
        """For ``oncewire doctor``: a write probe (always rolled back), the backend's integrity
        check, and the schema's objects compared with the packaged ``schema.sql``."""
        return self.db.inspect()


# -- the seams: the verbs each floor uses, and nothing else -------------------------------------
# A floor is typed against its seam, so mypy refuses a call outside it; :class:`Store` is every
# seam at once, and what the Ledger hands each floor.
class EffectStore(StoreCore, EffectVerbs):
    """The outbox and its dispatcher (``oncewire.effects``, ``oncewire.dispatch``)."""


class ReceiptStore(StoreCore, ReceiptVerbs):
    """The receiver (``oncewire.receipts``, ``oncewire.asgi``)."""


class InboundStore(StoreCore, InboundVerbs):
    """The inbox (``oncewire.inbound``)."""


class ReplyStore(InboundStore, ReplyVerbs):
    """The replies and their engine (``oncewire.replies``): a reply answers an inbound
    message, and its delivery reads the session's history."""


class RunStore(StoreCore, RunLedgerVerbs):
    """The run ledger (``oncewire.runs``)."""


class LangGraphStore(StoreCore, LangGraphVerbs, LangGraphFastVerbs, LeaseVerbs):
    """The LangGraph checkpointer (``oncewire.langgraph``): its threads' chains, and the
    fenced lease a thread's writer holds."""


class AgentStore(StoreCore, AgentVerbs, AgentSessionVerbs):
    """The Agents SDK's durable run and session (``oncewire.agents``)."""


class Store(
    EffectStore,
    ReceiptStore,
    ReplyStore,
    RunStore,
    LangGraphStore,
    AgentStore,
):
    """Every ledger's verbs on one database. Thread-safe: each thread gets its own connection.

    Opening checks and migrates the database; a transient failure while opening is retried for
    ``open_timeout_seconds`` (:mod:`oncewire.storage.opening`), and whatever a failed attempt
    opened is closed before the next.
    """
