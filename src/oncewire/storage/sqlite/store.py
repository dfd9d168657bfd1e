"""SQLiteStore: WAL, synchronous=FULL, BEGIN IMMEDIATE writers, one connection per thread.

The store opens, checks and migrates the file and reports on it; its connections and
transactions are :class:`~oncewire.storage.sqlite.driver.SQLiteDriver`'s, and every verb (the
effects, receipts, inbound, reply and run verbs) is written once in :mod:`oncewire.storage.verbs`.
What only SQLite needs stays here: the claim retried when a stored payload is not UTF-8.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from oncewire.core.errors import ConfigurationError, StorageError
from oncewire.storage.base import Store
from oncewire.storage.inspection import Inspection
from oncewire.storage.opening import (
    DEFAULT_OPEN_TIMEOUT_SECONDS,
    check_open_timeout,
    open_with_retries,
)
from oncewire.storage.records import Claim, Settlement
from oncewire.storage.sqlite.connection import (
    check_version,
    configure,
    current_version,
    migrate,
    open_connection,
    path_from_url,
    translate_errors,
)
from oncewire.storage.sqlite.driver import SQLiteDriver, SQLiteTransaction, undecodable_text
from oncewire.storage.sqlite.inspect import inspect

__all__ = ["SQLiteStore", "SQLiteTransaction"]

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


class SQLiteStore(Store):
    """Every ledger's verbs on one SQLite file (see the module's docstring for its settings)."""

    dialect = "sqlite"
    db: SQLiteDriver

    def __init__(
        self,
        url_or_path: str,
        *,
        create: bool = True,
        busy_timeout_ms: int = 10_000,
        synchronous: str = "FULL",
        open_timeout_seconds: float = DEFAULT_OPEN_TIMEOUT_SECONDS,
    ) -> None:
        if synchronous.upper() not in _SYNCHRONOUS:
            raise ConfigurationError(f"synchronous must be one of {', '.join(_SYNCHRONOUS)}")
        self.url = url_or_path
        self.path = path_from_url(url_or_path)
        self._create = create
        self._busy_timeout_ms = busy_timeout_ms
        self.db = SQLiteDriver(
            self.path,
            create=create,
            busy_timeout_ms=busy_timeout_ms,
            synchronous=synchronous.upper(),
        )
        # A store that failed to open must not leak its connection: close() after each failure.
        open_with_retries(
            self._open,
            what=f"opening {self.path}",
            timeout_seconds=check_open_timeout(open_timeout_seconds),
            cleanup=self.close,
        )

    def _open(self) -> None:
        conn = open_connection(
            self.path, create=self._create, busy_timeout_ms=self._busy_timeout_ms
        )
        self.db.adopt(conn)
        # Check before configuring: a file oncewire refuses keeps its journal mode and bytes.
        with translate_errors(f"reading the schema of {self.path}"):
            version = current_version(conn)
        check_version(version, create=self._create, path=self.path)
        configure(conn, self.path, synchronous=self.db.synchronous)
        self.db.use(conn)
        migrate(conn)

    # -- connections (the driver's) ----------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        return self.db.conn()

    def caller_transaction(self, connection: Any) -> SQLiteTransaction:
        return self.db.caller_transaction(connection)

    def close(self) -> None:
        self.db.close()

    def transaction(self) -> SQLiteTransaction:
        return self.db.transaction()

    def group_commit(self) -> AbstractContextManager[None]:
        return self.db.group_commit()

    # -- facts -------------------------------------------------------------------------------
    def schema_version(self) -> int:
        with translate_errors("reading the schema version"):
            return current_version(self._conn()) or 0

    def inspect(self) -> Inspection:
        with translate_errors("inspecting the store"):
            return inspect(self._conn())

    def health(self) -> dict[str, Any]:
        conn = self._conn()
        with translate_errors("reading settings"):
            journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
            synchronous = conn.execute("PRAGMA synchronous").fetchone()[0]
            busy = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        return {
            "backend": "sqlite",
            "path": self.path,
            "sqlite_version": sqlite3.sqlite_version,
            "schema_version": self.schema_version(),
            "journal_mode": str(journal).lower(),
            "synchronous": _SYNCHRONOUS[int(synchronous)] if int(synchronous) < 4 else synchronous,
            "busy_timeout_ms": int(busy),
            "server_time": None,
        }

    # -- what only SQLite needs --------------------------------------------------------------
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
        step = functools.partial(
            super().settle_and_claim,
            settlements,
            owner=owner,
            now=now,
            lease_seconds=lease_seconds,
            limit=limit,
            kinds=kinds,
        )
        try:
            return step()
        except StorageError as exc:
            if not undecodable_text(exc.__cause__):
                raise
        # A claimed payload that is not valid UTF-8 (written around oncewire) failed the whole
        # transaction, which rolled back: claim again with such text marked, so the dispatcher
        # gets it as an undecodable payload instead of failing on every step.
        with self.db.lenient():
            return step()
