"""storage: the only layer that imports a database driver."""

from __future__ import annotations

from oncewire.core.errors import ConfigurationError
from oncewire.storage.opening import DEFAULT_OPEN_TIMEOUT_SECONDS
from oncewire.storage.store import (
    AgentStore,
    EffectStore,
    InboundStore,
    LangGraphStore,
    ReceiptStore,
    ReplyStore,
    RunStore,
    Store,
    StoreCore,
    Transaction,
)

__all__ = [
    "DEFAULT_OPEN_TIMEOUT_SECONDS",
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
    "file_integrity",
    "latest_schema_version",
    "open_store",
]

_SCHEMES = ("postgresql", "postgres", "sqlite")


def open_store(
    url_or_path: str,
    *,
    create: bool = True,
    adopt: bool = True,
    read_only: bool = False,
    open_timeout_seconds: float = DEFAULT_OPEN_TIMEOUT_SECONDS,
    group_commit: bool = False,
) -> Store:
    """Open (and migrate) the store at ``url_or_path``.

    ``postgresql://...`` selects PostgreSQL; ``sqlite:///path``, ``sqlite:path`` or a plain path
    selects SQLite; any other ``scheme://`` is a :class:`ConfigurationError`. With
    ``create=False`` a missing database is an error instead of a new file, and a database
    without oncewire's schema is refused without being changed. A database that holds other
    tables gains oncewire's beside them (the outbox in the application's own database); with
    ``adopt=False`` it is refused unchanged, naming them, as the command line does unless
    ``--adopt`` is given.

    ``read_only=True`` opens an existing store without writing to it: never created, migrated
    nor switched to WAL, every write refused (on PostgreSQL, a read-only session); a SQLite
    file whose directory refuses the WAL's ``-shm`` is read as an immutable snapshot.

    A transient failure while opening (the server restarting, a connection terminated, the
    SQLite file locked by another writer) is retried with backoff for ``open_timeout_seconds``;
    a permanent one (not a database, read-only, corrupt, no access, a foreign or newer schema)
    is raised at once.

    ``group_commit=True`` lets the write transactions of this process's threads share commits
    (:mod:`oncewire.storage.grouping`): concurrent callers are no longer held to one flush of
    the disk each, and each still returns only once its own transaction is durable.
    """
    text = str(url_or_path)
    if not text:
        raise ConfigurationError("no database given (pass --db or set ONCEWIRE_DB)")
    scheme, separator, _ = text.partition("://")
    if separator and scheme.lower() not in _SCHEMES:
        # Never a SQLite file named after a URL meant for another database.
        raise ConfigurationError(
            f"unknown database URL scheme {scheme + '://'!r}: oncewire stores in "
            "postgresql://... or sqlite:///path (or a plain path)"
        )
    if text.startswith(("postgresql://", "postgres://")):
        from oncewire.storage.postgres import PostgresStore

        return PostgresStore(
            text,
            create=create,
            adopt=adopt,
            read_only=read_only,
            open_timeout_seconds=open_timeout_seconds,
            group_commit=group_commit,
        )
    from oncewire.storage.sqlite import SQLiteStore

    return SQLiteStore(
        text,
        create=create,
        adopt=adopt,
        read_only=read_only,
        open_timeout_seconds=open_timeout_seconds,
        group_commit=group_commit,
    )


def latest_schema_version(dialect: str) -> int:
    """The schema version this oncewire migrates a ``dialect`` store to ("sqlite" or
    "postgresql")."""
    if dialect == "postgresql":
        from oncewire.storage.postgres.driver import migrations
    else:
        from oncewire.storage.sqlite.driver import migrations
    return migrations()[-1][0]


def file_integrity(url_or_path: str) -> tuple[str, tuple[str, ...] | None]:
    """What SQLite's integrity check finds in a file that does not open as a store (its
    schema unreadable), read without writing: the check's name and its findings (none for a
    sound file), or None for findings when the file cannot be opened at all."""
    from oncewire.storage.sqlite.inspect import QUICK_CHECK
    from oncewire.storage.sqlite.inspect import file_integrity as check

    return QUICK_CHECK, check(url_or_path)
