"""``PostgresStore.inspect``: the write probe, invalid indexes and the schema comparison.

The expected objects are the names the packaged ``schema.sql`` creates (tables, indexes,
triggers, functions); the store's are read from ``pg_tables``, ``pg_indexes``, ``pg_trigger`` and
``pg_proc`` in its schema (``current_schema()``, the first of its search path). Indexes that back
a primary key or unique constraint come with their table and are not compared. A trigger that is
disabled counts as changed: it is there, but it no longer guards anything.
"""

from __future__ import annotations

from typing import Any

from oncewire.storage.inspection import Inspection, SchemaDifference, WriteProbe, schema_names
from oncewire.storage.postgres.errors import psycopg
from oncewire.storage.postgres.schema import fresh_schema

__all__ = ["inspect"]

_PREFIX = "oncewire_"
_COMPARED = ("table", "index", "trigger", "function")

_ACTUAL = """
SELECT 'table', tablename, tablename, '' FROM pg_tables WHERE schemaname = current_schema()
UNION ALL
SELECT 'index', c.relname, t.relname, CASE WHEN i.indisvalid THEN '' ELSE 'invalid' END
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_class t ON t.oid = i.indrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = current_schema()
   AND NOT EXISTS (SELECT 1 FROM pg_constraint k
                    WHERE k.conindid = i.indexrelid AND k.contype IN ('p', 'u', 'x'))
UNION ALL
SELECT 'trigger', g.tgname, t.relname, CASE WHEN g.tgenabled = 'D' THEN 'disabled' ELSE '' END
  FROM pg_trigger g
  JOIN pg_class t ON t.oid = g.tgrelid
  JOIN pg_namespace n ON n.oid = t.relnamespace
 WHERE n.nspname = current_schema() AND NOT g.tgisinternal
UNION ALL
SELECT 'function', p.proname, '', '' FROM pg_proc p
  JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = current_schema()
"""


def _probe_write(conn: Any) -> tuple[WriteProbe, str | None]:
    # A statement that would write (matching no row) and an assigned transaction id: a read-only
    # transaction, a standby or a role without the privilege refuses one of them. Rolled back.
    try:
        with conn.transaction(force_rollback=True):
            conn.execute("UPDATE oncewire_schema SET version = version WHERE false")
            conn.execute("SELECT pg_current_xact_id()")
    except psycopg.Error as exc:
        state = getattr(exc, "sqlstate", None) or ""
        probe = WriteProbe.BUSY if state in ("40001", "40P01", "55P03") else WriteProbe.REFUSED
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return probe, f"beginning a write transaction: {detail} (SQLSTATE {state})"
    return WriteProbe.OK, None


def inspect(conn: Any) -> Inspection:
    probe, error = _probe_write(conn)
    expected = {
        (kind, name) for kind, name in schema_names(fresh_schema()) if kind in _COMPARED
    } | {("table", "oncewire_schema")}
    rows = conn.execute(_ACTUAL).fetchall()
    actual = {
        (kind, name): (table, note)
        for kind, name, table, note in rows
        if name.startswith(_PREFIX) or table.startswith(_PREFIX)
    }
    differences = [
        SchemaDifference(kind, name, "missing")
        for kind, name in sorted(expected)
        if (kind, name) not in actual
    ]
    invalid: list[str] = []
    for (kind, name), (table, note) in sorted(actual.items()):
        where = f"on {table}" if table and kind in ("index", "trigger") else ""
        if (kind, name) not in expected:
            differences.append(SchemaDifference(kind, name, "extra", where))
        elif note == "disabled":
            differences.append(SchemaDifference(kind, name, "changed", f"disabled {where}"))
        elif note == "invalid":
            invalid.append(f"index {name} is invalid (a failed build): REINDEX it")
    return Inspection(
        write=probe,
        write_error=error,
        integrity=tuple(invalid),
        integrity_check="pg_index.indisvalid",
        objects=len(expected),
        differences=tuple(differences),
    )
