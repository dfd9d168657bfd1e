"""Where the PostgreSQL tests find their server, and what happens when it is not there.

``ONCEWIRE_TEST_PG`` (default ``postgresql://127.0.0.1:5432/test``) names a database the tests
may create and drop schemas in. Locally, without a server, PostgreSQL tests are skipped with a
message saying how to run them; under CI (``CI`` set) they fail instead: they must run there.

Two kinds of schema for one test: :func:`fresh_schema`, new and empty (for what is about
creating or migrating a store), and :func:`migrated_schema`, oncewire's current schema with no
rows (for a test that opens a store and uses it). Building the schema costs about a second of
DDL on a busy host and a thousand tests open a store on PostgreSQL, so a migrated schema is
built once per test process and reused: when a test is done with it, it goes back to the
process's pool only if its structure (tables, columns, indexes, constraints, triggers,
functions, grants) and its ``oncewire_schema`` rows are as built, emptied with
``TRUNCATE ... RESTART IDENTITY`` (ids start at 1 again, as in a new schema); a schema a test
altered is dropped. The next test cannot tell a reused schema from a new one.
"""

from __future__ import annotations

import atexit
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from oncewire.lab.fixtures import with_search_path

DEFAULT_URL = "postgresql://127.0.0.1:5432/test"


_REACHED: set[str] = set()  # the URLs this process has reached once: not asked again


def server_url() -> str:
    url = os.environ.get("ONCEWIRE_TEST_PG", DEFAULT_URL)
    if url in _REACHED:
        return url
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
    _REACHED.add(url)
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


# What makes two migrated schemas alike: every catalog row that defines an object of the
# schema, by its xmin. Any DDL (a table, column, index, constraint, trigger, function, grant
# added, dropped, altered, enabled or disabled) writes such a row anew and changes the digest;
# rows written, deleted or counted by VACUUM and ANALYZE do not.
_FINGERPRINT = """
WITH rels AS (SELECT oid FROM pg_class WHERE relnamespace = %(schema)s::text::regnamespace)
SELECT md5(string_agg(item, '|' ORDER BY item)) FROM (
  SELECT 'n' || oid::text || ':' || xmin::text AS item
    FROM pg_namespace WHERE nspname = %(schema)s::text
  UNION ALL SELECT 'c' || oid::text || ':' || xmin::text
    FROM pg_class WHERE oid IN (SELECT oid FROM rels)
  UNION ALL SELECT 'a' || attrelid::text || '.' || attnum::text || ':' || xmin::text
    FROM pg_attribute WHERE attrelid IN (SELECT oid FROM rels)
  UNION ALL SELECT 'd' || oid::text || ':' || xmin::text
    FROM pg_attrdef WHERE adrelid IN (SELECT oid FROM rels)
  UNION ALL SELECT 'k' || oid::text || ':' || xmin::text
    FROM pg_constraint WHERE connamespace = %(schema)s::text::regnamespace
  UNION ALL SELECT 't' || oid::text || ':' || xmin::text
    FROM pg_trigger WHERE tgrelid IN (SELECT oid FROM rels)
  UNION ALL SELECT 'i' || indexrelid::text || ':' || xmin::text
    FROM pg_index WHERE indrelid IN (SELECT oid FROM rels)
  UNION ALL SELECT 'p' || oid::text || ':' || xmin::text
    FROM pg_proc WHERE pronamespace = %(schema)s::text::regnamespace
  UNION ALL SELECT 'r' || oid::text || ':' || xmin::text
    FROM pg_rewrite WHERE ev_class IN (SELECT oid FROM rels)
  UNION ALL SELECT 'o' || oid::text || ':' || xmin::text
    FROM pg_policy WHERE polrelid IN (SELECT oid FROM rels)
  UNION ALL SELECT 's' || seqrelid::text || ':' || xmin::text
    FROM pg_sequence WHERE seqrelid IN (SELECT oid FROM rels)
) objects
"""

# Schemas built and emptied, ready for the next test, per server URL (one pool per process).
_POOL: dict[str, list[tuple[str, str]]] = {}  # url -> [(schema, fingerprint)]
_BUILT: set[tuple[str, str]] = set()  # (url, schema): to drop when the process ends


_ADMIN: dict[str, Any] = {}  # url -> this process's connection for building and emptying


@contextmanager
def _admin(url: str) -> Iterator[Any]:
    """This process's autocommit connection to ``url``, opened again if it broke."""
    import psycopg

    conn = _ADMIN.get(url)
    if conn is None or conn.closed or conn.broken:
        conn = _ADMIN[url] = psycopg.connect(url, autocommit=True)
    try:
        yield conn
    except psycopg.OperationalError:
        _ADMIN.pop(url, None)
        conn.close()
        raise


def _fingerprint(conn: Any, schema: str) -> str:
    digest = conn.execute(_FINGERPRINT, {"schema": schema}).fetchone()[0]
    # The migrations recorded, as written by the build (a test may delete or add one).
    applied = conn.execute(
        "SELECT string_agg(version || ':' || xmin::text, ',' ORDER BY version) "
        f"FROM {schema}.oncewire_schema"  # type: ignore[arg-type]
    ).fetchone()[0]
    return f"{digest}/{applied}"


def _build(url: str, prefix: str) -> tuple[str, str]:
    """A new schema with oncewire's current schema in it, opened once by a store."""

    from oncewire.storage.postgres import PostgresStore

    name = f"oncewire_{prefix}_{uuid.uuid4().hex[:12]}"
    with _admin(url) as conn:
        conn.execute(f"CREATE SCHEMA {name}")  # type: ignore[arg-type]
    _BUILT.add((url, name))
    PostgresStore(with_search_path(url, name)).close()
    with _admin(url) as conn:
        return name, _fingerprint(conn, name)


def _drop(url: str, name: str) -> None:
    with _admin(url) as conn:
        conn.execute("SET lock_timeout = '30s'")
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")  # type: ignore[arg-type]
    _BUILT.discard((url, name))


def _give_back(url: str, name: str, built: str) -> None:
    """Empty ``name`` into the pool if a test left its structure as built; else drop it."""
    import psycopg

    with _admin(url) as conn:
        exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (name,)).fetchone()
        if exists is None:
            _BUILT.discard((url, name))
            return
        try:
            same = _fingerprint(conn, name) == built
        except psycopg.Error:  # oncewire_schema dropped or altered: not the schema we built
            same = False
        if same:
            tables = conn.execute(
                "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = %s "
                "AND tablename <> 'oncewire_schema'",
                (name,),
            ).fetchall()
            sequences = conn.execute(
                "SELECT quote_ident(sequencename) FROM pg_sequences WHERE schemaname = %s",
                (name,),
            ).fetchall()
            # DELETE and setval, not TRUNCATE: a few rows go in milliseconds where TRUNCATE
            # makes every table and index anew (half a second), and neither writes a catalog
            # row. The run events refuse deletion by trigger (append-only); a superuser's
            # session can leave triggers unfired (this connection's only).
            reset = [f"DELETE FROM {name}.{table}" for (table,) in tables] + [
                f"SELECT setval('{name}.{sequence}', 1, false)" for (sequence,) in sequences
            ]
            try:
                conn.execute("SET lock_timeout = '30s'; SET session_replication_role = replica")
                conn.execute("; ".join(reset))  # type: ignore[arg-type]
            except psycopg.errors.InsufficientPrivilege:
                same = False  # not a superuser: the schema is dropped, as fresh_schema does
            except psycopg.errors.LockNotAvailable:
                return  # a connection the test left open holds it: dropped when the process ends
            if same:
                _POOL.setdefault(url, []).append((name, built))
                return
    _drop(url, name)


@contextmanager
def migrated_schema(url: str, prefix: str = "t") -> Iterator[str]:
    """A schema holding oncewire's current schema and no rows, for one test; yields a URL whose
    search_path points at it. Reused from this process's pool when one is free (see the module's
    docstring): for a test that opens a store, not for one about creating or migrating it."""
    pool = _POOL.setdefault(url, [])
    name, built = pool.pop() if pool else _build(url, prefix)
    try:
        yield with_search_path(url, name)
    finally:
        _give_back(url, name, built)


@atexit.register
def _drop_built() -> None:
    for url, name in sorted(_BUILT):
        try:
            _drop(url, name)
        except Exception:  # the server went away first: nothing left to tidy here
            pass
    for conn in _ADMIN.values():
        conn.close()
