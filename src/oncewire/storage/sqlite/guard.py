"""What SQLite itself parsed in the caller's SQL, refused by the engine's authorizer.

The lexer (:mod:`oncewire.storage.sqlguard`) reads the caller's text; SQLite reads it otherwise
in places (its tokenizer skips a leading U+FEFF, which the lexer took for the start of a word):
``tx.execute("\\ufeffCOMMIT")`` committed the caller's rows without the intent. While a
caller's statement is prepared, :class:`CallerAuthorizer` is the connection's authorizer
(``sqlite3.Connection.set_authorizer``) and refuses, from what SQLite parsed:

- transaction control (``SQLITE_TRANSACTION``: BEGIN, COMMIT, END, ROLLBACK);
- a savepoint statement the lexer did not read as the same one (``SQLITE_SAVEPOINT``): the
  lexer decides which savepoints are the caller's to release or roll back to, so a statement
  it could not read is not run;
- ATTACH and DETACH;
- a PRAGMA that assigns a value, and one that changes something when read (``wal_checkpoint``,
  ``optimize``, ``incremental_vacuum``, ...): only reads known to change nothing are allowed.

It is active only while the caller's own statements are prepared: oncewire's statements are
prepared without it, and a caller's statement is never one of them (:data:`_MARK`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from oncewire.core.errors import InvalidState
from oncewire.storage.sqlguard import SavepointOp, SavepointStack, check_statement, refused

__all__ = ["CallerGuard"]

# PRAGMAs that only read, without a value: a setting's current value, a list, a check.
_READS = frozenset(
    {
        "analysis_limit",
        "application_id",
        "auto_vacuum",
        "automatic_index",
        "busy_timeout",
        "cache_size",
        "cache_spill",
        "cell_size_check",
        "checkpoint_fullfsync",
        "collation_list",
        "compile_options",
        "data_version",
        "database_list",
        "defer_foreign_keys",
        "encoding",
        "foreign_key_check",
        "foreign_keys",
        "freelist_count",
        "fullfsync",
        "function_list",
        "hard_heap_limit",
        "ignore_check_constraints",
        "integrity_check",
        "journal_mode",
        "journal_size_limit",
        "legacy_alter_table",
        "locking_mode",
        "max_page_count",
        "mmap_size",
        "module_list",
        "page_count",
        "page_size",
        "pragma_list",
        "query_only",
        "quick_check",
        "read_uncommitted",
        "recursive_triggers",
        "reverse_unordered_selects",
        "schema_version",
        "secure_delete",
        "soft_heap_limit",
        "synchronous",
        "table_list",
        "temp_store",
        "threads",
        "trusted_schema",
        "user_version",
        "wal_autocheckpoint",
    }
)
# PRAGMAs whose argument names what to read (a table, an index, a number of errors).
_READS_OF = frozenset(
    {
        "foreign_key_check",
        "foreign_key_list",
        "index_info",
        "index_list",
        "index_xinfo",
        "integrity_check",
        "quick_check",
        "table_info",
        "table_list",
        "table_xinfo",
    }
)


# Appended to every caller statement: its text is then never one of oncewire's own, so the
# connection's statement cache never hands the caller a statement oncewire prepared (which the
# authorizer, inert then, let through). SQLite does not store a trailing comment with a schema
# object it creates.
_MARK = "\n-- the caller's"


class CallerGuard:
    """The authorizer of one connection, active while a caller's statement is prepared (see
    the module docstring): :meth:`run` runs one.

    Installed on the connection at the caller's first statement, it stays: installing an
    authorizer makes SQLite prepare every statement of the connection again, which done around
    each caller statement doubled the cost of a shared transaction (oncewire's statements were
    prepared again after it). Outside a caller's statement it answers "allowed" at once, and
    oncewire's statements, prepared once and cached, do not call it again. ``scoped`` (a
    connection that is not oncewire's) installs it around each statement and removes it after.
    """

    __slots__ = ("active", "conn", "expected", "installed", "refusal", "savepoint_seen", "scoped")

    def __init__(self, conn: sqlite3.Connection, *, scoped: bool = False) -> None:
        self.conn = conn
        self.scoped = scoped
        self.installed = False
        self.active = False
        self.expected: SavepointOp | None = None
        self.refusal: InvalidState | None = None
        self.savepoint_seen = False

    def run(
        self, sql: str, params: Sequence[Any] | dict[str, Any], savepoints: SavepointStack
    ) -> Any:
        """The caller's ``sql``, refused by the lexer first (the clearer message), then by
        SQLite from what it parsed; ``savepoints`` as the statement left them."""
        conn = self.conn
        before = savepoints.state()
        self.expected = check_statement(sql, savepoints, "sqlite")
        self.refusal, self.savepoint_seen = None, False
        if not self.installed:
            conn.set_authorizer(self)
            self.installed = True
        self.active = True
        try:
            cursor = conn.execute(sql + _MARK, params)
        except BaseException as exc:
            savepoints.restore(before)  # the statement did not run
            if self.refusal is not None and isinstance(exc, sqlite3.DatabaseError):
                raise self.refusal from exc
            raise
        finally:
            self.active = False
            if self.scoped:
                conn.set_authorizer(None)
                self.installed = False
        if self.expected is not None and not self.savepoint_seen:
            savepoints.restore(before)  # the lexer read a savepoint statement SQLite did not run
        return cursor

    def __call__(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None
    ) -> int:
        if not self.active:
            return sqlite3.SQLITE_OK  # oncewire's own statement
        if action == sqlite3.SQLITE_TRANSACTION:
            return self._deny(str(arg1), "it would end or restart the shared transaction")
        if action == sqlite3.SQLITE_SAVEPOINT:
            return self._savepoint(str(arg1), arg2 or "")
        if action == sqlite3.SQLITE_ATTACH or action == sqlite3.SQLITE_DETACH:
            verb = "ATTACH" if action == sqlite3.SQLITE_ATTACH else "DETACH"
            return self._deny(verb, "it changes the connection oncewire goes on using")
        if action == sqlite3.SQLITE_PRAGMA:
            name = (arg1 or "").lower()
            if (name in _READS_OF) if arg2 is not None else (name in _READS):
                return sqlite3.SQLITE_OK
            what = f"PRAGMA {name}" + ("" if arg2 is None else " with a value")
            return self._deny(
                what, "it changes a setting of the connection oncewire goes on using, or the file"
            )
        return sqlite3.SQLITE_OK

    def _savepoint(self, verb: str, name: str) -> int:
        # Compared, not consumed: SQLite prepares a statement again when the schema changed.
        expected = self.expected
        if expected is not None and expected[0] == verb and expected[1].lower() == name.lower():
            self.savepoint_seen = True
            return sqlite3.SQLITE_OK
        shown = {"BEGIN": "SAVEPOINT", "ROLLBACK": "ROLLBACK TO"}.get(verb, verb)
        return self._deny(
            f"{shown} {name!r}",
            "the statement could not be read as the savepoint statement SQLite runs, so whose "
            "savepoint it is could not be checked",
        )

    def _deny(self, what: str, why: str) -> int:
        if self.refusal is None:
            self.refusal = refused(what, why)
        return sqlite3.SQLITE_DENY
