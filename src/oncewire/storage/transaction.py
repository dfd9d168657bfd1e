"""The transaction oncewire shares with its caller: its protocol, and the guard around it.

A caller's SQL and oncewire's own ``_in_tx`` verbs run in one database transaction. The
caller sees it as a :class:`Transaction` (``execute`` and nothing else); each backend's driver
opens it as a :class:`GuardedTransaction`, which refuses what would end the transaction or
change the connection before it reaches the database (:mod:`oncewire.storage.sqlguard`) and
keeps oncewire's savepoints out of the caller's reach.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from oncewire.core.errors import InvalidState
from oncewire.storage.sqlguard import SavepointStack, caller_statement, check_statement

__all__ = ["GuardedTransaction", "Transaction", "store_transaction"]


class Transaction(Protocol):
    """An open database transaction shared by the caller and oncewire."""

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        """Run the caller's own SQL: ``:name`` placeholders with a dict, on every backend."""
        ...


def store_transaction(tx: Transaction) -> Transaction:
    """The store's own transaction behind ``tx``. A wrapper that shares one (the Ledger's
    ``with ledger.transaction() as tx``) hands it over as ``tx.store_transaction``, so every
    ``_in_tx`` verb takes either."""
    inner: Transaction | None = getattr(tx, "store_transaction", None)
    return tx if inner is None else inner


class GuardedTransaction(abc.ABC):
    """An open write transaction oncewire shares with its caller, on one connection.

    ``execute`` (the caller's SQL, ``:name`` placeholders with a dict, rendered for the
    ``dialect``) refuses positional values and each driver's own placeholders, and what would
    end the transaction or change the connection (:mod:`oncewire.storage.sqlguard`); oncewire's
    own savepoints go around that
    check and are recorded as oncewire's, so the caller's SQL may not release them. Nothing runs
    once the transaction is no longer open: a statement would autocommit outside of it.
    """

    __slots__ = ("conn", "is_open", "savepoints")

    dialect: str  # the caller's SQL is rendered for it

    def __init__(self, conn: Any, *, is_open: bool) -> None:
        self.conn = conn
        self.is_open = is_open
        self.savepoints = SavepointStack()

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        self.check_open()
        check_statement(sql, self.savepoints, self.dialect)
        text, values = caller_statement(sql, params, self.dialect)
        return self.conn.execute(text, () if values is None else values)

    def check_open(self) -> None:
        """Refuse to go on unless this transaction is still the connection's open one."""
        if not self.is_open:
            raise InvalidState("use the transaction inside its with block")
        if not self.open_on_connection():
            raise InvalidState(self.ended_by_database)

    # What the refusal says when the database ended the transaction on its own.
    ended_by_database = "the transaction is no longer open"

    @abc.abstractmethod
    def open_on_connection(self) -> bool:
        """Whether the connection still has this transaction open."""

    def savepoint(self, name: str) -> AbstractContextManager[None]:
        return _Savepoint(self, name)


class _Savepoint:
    __slots__ = ("name", "tx")

    def __init__(self, tx: GuardedTransaction, name: str) -> None:
        if not name.isidentifier():
            raise ValueError(f"savepoint name {name!r} is not an identifier")
        self.tx, self.name = tx, name

    def _run(self, sql: str) -> None:
        self.tx.check_open()
        self.tx.conn.execute(sql)

    def __enter__(self) -> None:
        self._run(f'SAVEPOINT "{self.name}"')
        self.tx.savepoints.opened(self.name, by_caller=False)

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            self._run(f'ROLLBACK TO SAVEPOINT "{self.name}"')
        self._run(f'RELEASE SAVEPOINT "{self.name}"')
        self.tx.savepoints.released(self.name)
