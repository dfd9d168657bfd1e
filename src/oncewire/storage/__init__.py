"""storage: the only layer that imports a database driver."""

from __future__ import annotations

from oncewire.core.errors import ConfigurationError
from oncewire.storage.base import Store, Transaction

__all__ = ["Store", "Transaction", "open_store"]


def open_store(url_or_path: str, *, create: bool = True) -> Store:
    """Open (and migrate) the store at ``url_or_path``.

    ``postgresql://...`` selects PostgreSQL; ``sqlite:///path``, ``sqlite:path`` or a plain path
    selects SQLite. With ``create=False`` a missing database is an error instead of a new file.
    """
    text = str(url_or_path)
    if not text:
        raise ConfigurationError("no database given (pass --db or set ONCEWIRE_DB)")
    if text.startswith(("postgresql://", "postgres://")):
        from oncewire.storage.postgres import PostgresStore

        return PostgresStore(text, create=create)
    from oncewire.storage.sqlite import SQLiteStore

    return SQLiteStore(text, create=create)
