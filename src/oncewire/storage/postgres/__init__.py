"""The PostgreSQL backend: several machines, one database."""

from oncewire.storage.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
