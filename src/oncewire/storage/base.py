"""The Store seam: the only way ledgers and engines touch a database.

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
from typing import Any, Protocol

from oncewire.storage.inspection import Inspection
from oncewire.storage.records import (
    AttemptRecord,
    Backlog,
    Claim,
    Effect,
    EffectState,
    Receipt,
    Settlement,
)
from oncewire.storage.replies import ReplyVerbs
from oncewire.storage.runs import RunVerbs

__all__ = ["Store", "Transaction"]


class Transaction(Protocol):
    """An open database transaction shared by the caller and oncewire."""

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        """Run the caller's own SQL (in the backend's dialect and placeholder style)."""
        ...


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


class Store(ReplyVerbs, RunVerbs, abc.ABC):
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

    # -- effects -----------------------------------------------------------------------------
    @abc.abstractmethod
    def insert_effect_in_tx(
        self,
        tx: Transaction,
        *,
        key: str,
        kind: str,
        payload_json: str,
        digest: str,
        max_attempts: int,
        not_before: float,
        deadline: float | None,
        now: float,
    ) -> tuple[Effect, bool]:
        """Insert the effect unless its key exists; return the row and whether it is new.

        Does not compare digests: the ledger does, and raises before the transaction commits.
        """

    @abc.abstractmethod
    def get_effect(self, key: str) -> Effect | None: ...

    @abc.abstractmethod
    def list_effects(
        self,
        *,
        states: Sequence[EffectState] = (),
        kind: str | None = None,
        limit: int = 100,
        after_id: int = 0,
        newest_first: bool = False,
        before_id: int | None = None,
    ) -> list[Effect]:
        """Effects by id, oldest first (``newest_first``: the other way); ``after_id`` and
        ``before_id`` bound the ids (exclusive), so either direction pages by the last id seen."""

    @abc.abstractmethod
    def count_effects(self, *, kind: str | None = None) -> dict[EffectState, int]:
        """How many effects are in each state (of ``kind`` only, when given)."""

    @abc.abstractmethod
    def settle_and_claim(
        self,
        settlements: Sequence[Settlement],
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int,
        kinds: Sequence[str] | None = None,
    ) -> tuple[list[bool], list[Claim]]:
        """In one transaction: apply ``settlements``, then claim up to ``limit`` due effects.

        ``kinds`` limits the claim to effects this worker has sinks for (None: any kind).

        Each settlement applies only if its effect is still claimed under its fence; the first
        list says which did. Claiming bumps the fence and the attempt count and leases the
        effect to ``owner`` until ``now + lease_seconds``. Past-deadline effects are not claimed.
        """

    @abc.abstractmethod
    def renew_leases(
        self, owner: str, fences: Sequence[tuple[int, int]], expires_at: float, now: float
    ) -> int:
        """Extend the leases ``(id, fence)`` still held by ``owner``; return how many were."""

    @abc.abstractmethod
    def lease_holders(self) -> list[str]:
        """The distinct owners of claimed effects."""

    @abc.abstractmethod
    def release_claims(self, *, now: float, dead_owners: Sequence[str] = ()) -> int:
        """Release claims whose lease expired or whose owner is known dead.

        A released effect may have reached its receiver: it becomes ``uncertain`` (its next
        attempt is a redelivery), or ``dead`` when it has no attempts or time left.
        """

    @abc.abstractmethod
    def expire_deadlines(self, now: float) -> int:
        """Move waiting effects whose deadline passed to ``dead``."""

    @abc.abstractmethod
    def backlog(self, kinds: Sequence[str] | None = None) -> Backlog:
        """What remains for a dispatcher of ``kinds`` (None: any kind)."""

    @abc.abstractmethod
    def waiting_kinds(self) -> dict[str, tuple[int, float]]:
        """Every kind with effects waiting for an attempt: kind -> (how many are pending or
        uncertain, the oldest one's ``created_at``). A kind with none waiting is absent."""

    @abc.abstractmethod
    def list_attempts(self, effect_id: int) -> list[AttemptRecord]:
        """The effect's attempt history, oldest first (by fence): one row per attempt closed."""

    @abc.abstractmethod
    def cancel_effect(self, key: str, *, now: float, reason: str) -> Effect:
        """Any non-terminal effect -> ``cancelled``; a claimed one loses its lease."""

    @abc.abstractmethod
    def retry_effect(self, key: str, *, now: float) -> Effect:
        """A ``dead``, ``rejected`` or ``cancelled`` effect -> ``pending`` with fresh attempts."""

    # -- receipts ----------------------------------------------------------------------------
    @abc.abstractmethod
    def reserve_receipt_in_tx(
        self,
        tx: Transaction,
        *,
        key: str,
        digest: str,
        payload_json: str,
        now: float,
        expires_at: float | None,
    ) -> Receipt | None:
        """Reserve ``key`` (None) or return the receipt already stored under it."""

    @abc.abstractmethod
    def complete_receipt_in_tx(self, tx: Transaction, *, key: str, result_json: str) -> None: ...

    @abc.abstractmethod
    def get_receipt(self, key: str) -> Receipt | None: ...

    @abc.abstractmethod
    def list_receipts(self, *, limit: int = 100, after_key: str = "") -> list[Receipt]: ...

    @abc.abstractmethod
    def purge_receipts(self, *, expired_before: float) -> int:
        """Delete receipts whose retention ended before ``expired_before``. Operator-only."""

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
