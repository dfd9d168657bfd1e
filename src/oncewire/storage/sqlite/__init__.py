"""The SQLite backend: the embedded default."""

from oncewire.storage.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
