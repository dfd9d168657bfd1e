"""PostgresStore: SKIP LOCKED claims, LISTEN/NOTIFY wake-ups, fenced settlements.

The store opens and migrates the database and reports on it; its connections, transactions and
notifications are :class:`~oncewire.storage.postgres.driver.PostgresDriver`'s, and the effects,
receipts, inbound, reply and run verbs are written once in :mod:`oncewire.storage.verbs` (the
PostgreSQL-only forms of their statements are in ``storage/sql/postgresql.sql``: SKIP LOCKED,
FILTER, and the locks that concurrent writers need).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from oncewire.core.errors import SchemaError
from oncewire.storage.base import Store
from oncewire.storage.inspection import Inspection
from oncewire.storage.opening import (
    DEFAULT_OPEN_TIMEOUT_SECONDS,
    check_open_timeout,
    open_with_retries,
)
from oncewire.storage.postgres.connection import (
    connect_timeout_seconds,
    current_version,
    migrate,
    require_driver,
    translate_errors,
)
from oncewire.storage.postgres.driver import CHANNEL, PostgresDriver, PostgresTransaction
from oncewire.storage.postgres.inspect import inspect

__all__ = ["CHANNEL", "PostgresStore", "PostgresTransaction"]


class PostgresStore(Store):
    """Every ledger's verbs on one PostgreSQL database (see the module's docstring)."""

    dialect = "postgresql"
    db: PostgresDriver

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        open_timeout_seconds: float = DEFAULT_OPEN_TIMEOUT_SECONDS,
    ) -> None:
        require_driver()
        self.url = url
        self.db = PostgresDriver(url, connect_timeout=connect_timeout_seconds(url))
        # A dropped connection or a restarting server while opening is waited out (bounded).
        open_with_retries(
            lambda: self._open(create),
            what="opening the PostgreSQL store",
            timeout_seconds=check_open_timeout(open_timeout_seconds),
            cleanup=self.close,
        )

    def _open(self, create: bool) -> None:
        conn = self._conn()
        try:
            with translate_errors("reading the schema"):
                version = current_version(conn)
            if version is None and not create:
                raise SchemaError(
                    "this database holds no oncewire schema (oncewire_schema missing)"
                )
            migrate(conn)
        finally:
            if conn.broken:
                self.db.forget(conn)

    # -- connections (the driver's) ----------------------------------------------------------
    def _conn(self) -> Any:
        return self.db.conn()

    def caller_transaction(self, connection: Any) -> PostgresTransaction:
        return self.db.caller_transaction(connection)

    def close(self) -> None:
        self.db.close()

    def transaction(self) -> AbstractContextManager[PostgresTransaction]:
        return self.db.transaction()

    def group_commit(self) -> AbstractContextManager[None]:
        return self.db.group_commit()

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` whenever new effects commit (LISTEN on a connection of its own)."""
        return self.db.subscribe(wake)

    # -- facts -------------------------------------------------------------------------------
    def schema_version(self) -> int:
        return self.db.reading(
            lambda conn: current_version(conn) or 0, "reading the schema version"
        )

    def inspect(self) -> Inspection:
        with translate_errors("inspecting the store"):
            return inspect(self._conn())

    def health(self) -> dict[str, Any]:
        row = self.db.read_sql(
            "SELECT current_setting('server_version'), current_database(), current_user, "
            "current_schema(), extract(epoch FROM clock_timestamp())::float8"
        )[0]
        return {
            "backend": "postgresql",
            "server_version": row[0],
            "database": row[1],
            "user": row[2],
            "schema": row[3],
            "schema_version": self.schema_version(),
            "server_time": float(row[4]),
        }
