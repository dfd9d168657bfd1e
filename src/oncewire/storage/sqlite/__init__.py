"""The SQLite backend, the embedded default: :class:`SQLiteStore` is the shared store on a
:class:`~oncewire.storage.sqlite.driver.SQLiteDriver`."""

from __future__ import annotations

from oncewire.storage.opening import DEFAULT_OPEN_TIMEOUT_SECONDS
from oncewire.storage.sqlite.driver import SQLiteDriver
from oncewire.storage.store import Store

__all__ = ["SQLiteStore"]


class SQLiteStore(Store):
    """Every ledger's verbs on one SQLite file: WAL, ``synchronous`` (FULL unless told otherwise)
    and foreign keys on every connection, writers waiting up to ``busy_timeout_ms`` for the lock.

    ``read_only=True`` opens the file with ``mode=ro`` (query-only, never migrated nor switched
    to WAL); where SQLite cannot create a WAL database's ``-shm`` (a read-only directory or
    mount) it reads the file as an immutable snapshot and logs a warning saying so.

    ``group_commit=True`` makes the write transactions of this process's threads share commits
    (:mod:`oncewire.storage.sqlite.group`); it changes nothing read-only or in memory.
    """

    db: SQLiteDriver

    def __init__(
        self,
        url_or_path: str,
        *,
        create: bool = True,
        adopt: bool = True,
        read_only: bool = False,
        busy_timeout_ms: int = 10_000,
        synchronous: str = "FULL",
        open_timeout_seconds: float = DEFAULT_OPEN_TIMEOUT_SECONDS,
        group_commit: bool = False,
    ) -> None:
        driver = SQLiteDriver(
            url_or_path,
            create=create,
            busy_timeout_ms=busy_timeout_ms,
            synchronous=synchronous,
            read_only=read_only,
            group_commit=group_commit,
        )
        self.path = driver.path
        super().__init__(
            driver, create=create, adopt=adopt, open_timeout_seconds=open_timeout_seconds
        )
