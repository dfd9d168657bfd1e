"""Where the PostgreSQL tests find their server, and what happens when it is not there.

``ONCEWIRE_TEST_PG`` (default ``postgresql://127.0.0.1:5432/test``) names a database the tests
may create and drop schemas in. Locally, without a server, PostgreSQL tests are skipped with a
message saying how to run them; under CI (``CI`` set) they fail instead: they must run there.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from oncewire.lab.fixtures import with_search_path

DEFAULT_URL = "postgresql://127.0.0.1:5432/test"


def server_url() -> str:
    url = os.environ.get("ONCEWIRE_TEST_PG", DEFAULT_URL)
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        message = (
            f"PostgreSQL is not reachable at {url} ({type(exc).__name__}); start a server "
            "(pg_ctlcluster ... main start) or set ONCEWIRE_TEST_PG to run these tests"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return url


@contextmanager
def fresh_schema(url: str, prefix: str = "t") -> Iterator[str]:
    """A new empty schema for one test; yields a URL whose search_path points at it."""
    import psycopg

    name = f"oncewire_{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")  # type: ignore[arg-type]
    try:
        yield with_search_path(url, name)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")  # type: ignore[arg-type]
