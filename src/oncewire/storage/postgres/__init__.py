"""The PostgreSQL backend, several machines on one database: :class:`PostgresStore` is the shared
store on a :class:`~oncewire.storage.postgres.driver.PostgresDriver`."""

from __future__ import annotations

from oncewire.storage.opening import DEFAULT_OPEN_TIMEOUT_SECONDS
from oncewire.storage.postgres.driver import PostgresDriver
from oncewire.storage.store import Store

__all__ = ["PostgresStore"]


class PostgresStore(Store):
    """Every ledger's verbs on one PostgreSQL database (or schema): SKIP LOCKED claims,
    LISTEN/NOTIFY wake-ups, a connection per thread.

    ``group_commit=True`` keeps a connection (and a commit) per thread: the server flushes
    concurrent commits together (see :mod:`oncewire.storage.grouping`)."""

    db: PostgresDriver

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        adopt: bool = True,
        read_only: bool = False,
        open_timeout_seconds: float = DEFAULT_OPEN_TIMEOUT_SECONDS,
        group_commit: bool = False,
    ) -> None:
        super().__init__(
            PostgresDriver(url, read_only=read_only, group_commit=group_commit),
            create=create,
            adopt=adopt,
            open_timeout_seconds=open_timeout_seconds,
        )
