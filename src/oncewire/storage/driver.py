"""The Driver: what a verb written once needs from a database, and nothing more.

A verb in :mod:`oncewire.storage.verbs` runs named queries (:mod:`oncewire.storage.sql`) through
the store's driver, ``self.db``::

    with self.db.write("renewing leases") as conn:           # one transaction, errors translated
        rows = self.db.all(conn, Q.renew_leases, owner=owner, ...)
    rows = self.db.read(Q.get_effect, key=key)                # outside any transaction

A driver owns the connections (one per thread), the transaction discipline (``BEGIN
IMMEDIATE`` on SQLite, a broken connection forgotten and replaced on PostgreSQL), the
translation of driver errors into :mod:`oncewire.core.errors` and the execution strategy
(``batch``, ``pipeline``, how many rows one ``{values}`` statement carries). The two
implementations are :class:`oncewire.storage.sqlite.driver.SQLiteDriver` and
:class:`oncewire.storage.postgres.driver.PostgresDriver`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from oncewire.storage.sql import Queries, Query

__all__ = ["Driver", "Row"]

Row = Sequence[Any]


class Driver(Protocol):
    """The connection half of a backend; see the module docstring."""

    dialect: str
    queries: Queries
    # Rows one ``{values ...}`` statement carries at most (SQLite binds each value on its own).
    values_chunk: int

    def conn(self) -> Any:
        """This thread's connection (opened on first use, replaced when broken)."""
        ...

    def write(self, what: str) -> AbstractContextManager[Any]:
        """A transaction of its own, yielding its connection: committed on normal exit, rolled
        back on an exception; driver errors become :class:`StorageError` naming ``what``."""
        ...

    def translate_errors(self, what: str) -> AbstractContextManager[None]:
        """Inside the block, a driver error becomes a :class:`StorageError` naming ``what``."""
        ...

    def tx_conn(self, tx: Any) -> Any:
        """The connection of the caller's open transaction ``tx`` (refused if it is not open:
        a verb ending in ``_in_tx`` never writes outside the caller's transaction)."""
        ...

    def read(self, q: Query, /, **params: Any) -> list[Row]:
        """Every row of ``q`` outside a transaction (a dropped idle connection is replaced and
        the read run again; a text that is not UTF-8 is read as undecodable, not an error)."""
        ...

    def run(self, conn: Any, q: Query, /, **params: Any) -> int:
        """Run ``q`` on ``conn``; the number of rows it changed."""
        ...

    def one(self, conn: Any, q: Query, /, **params: Any) -> Row | None:
        """The first row of ``q`` on ``conn``, or None."""
        ...

    def all(self, conn: Any, q: Query, /, **params: Any) -> list[Row]:
        """Every row of ``q`` on ``conn``."""
        ...

    def batch(self, conn: Any, q: Query, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run ``q`` once per parameter set (``executemany``)."""
        ...

    def pipeline(self, conn: Any) -> AbstractContextManager[None]:
        """Send the statements of the block without waiting for each answer (PostgreSQL); a
        no-op on SQLite, whose statements do not travel."""
        ...

    def in_transaction(self, conn: Any) -> bool:
        """Whether ``conn`` has a transaction open."""
        ...
