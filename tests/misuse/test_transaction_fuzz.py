"""Generated statements around transaction control cannot split the caller's row from its intent.

Each example runs, in one ``ledger.transaction()``, the caller's row, a generated statement (a
transaction keyword, a PRAGMA, ``set_config``, ``SET``, ATTACH, ... behind a mix of U+FEFF,
whitespace of every kind, comments, case and semicolons, or nested in another statement), which
the caller may swallow the error of, and an accept before or after it; then the block commits or
fails. Read around oncewire, in the same database: the caller's row is there exactly when the
intent is, nothing is there after a failed block, and the settings oncewire's next transaction
runs with are the ones it had before (SQLite: ``synchronous``, ``journal_mode``, the attached
databases; PostgreSQL: ``synchronous_commit``, ``search_path``).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncewire import Ledger
from tests.contract.conftest import RawDatabase

PREFIX_PARTS = [
    "",
    " ",
    "\n",
    "\t",
    "\x0b",
    "\x0c",
    "\r\n",
    "\ufeff",
    "\u00a0",
    "\u2003",
    "\u3000",
    "\u200b",
    "/* a comment */",
    "/* /* nested */ */",
    "-- a line comment\n",
    ";",
    "; ",
]
SUFFIXES = ["", ";", " ;", ";;", " -- trailing", "; COMMIT", "; SELECT 1", "\ufeff"]
KEYWORDS = [
    "BEGIN",
    "BEGIN IMMEDIATE",
    "BEGIN EXCLUSIVE",
    "BEGIN TRANSACTION",
    "COMMIT",
    "COMMIT TRANSACTION",
    "END",
    "END TRANSACTION",
    "ROLLBACK",
    "ROLLBACK TRANSACTION",
    "ABORT",
    "START TRANSACTION",
    "PREPARE TRANSACTION 'fuzz'",
    "COMMIT PREPARED 'fuzz'",
    "SAVEPOINT fuzz",
    "RELEASE fuzz",
    "RELEASE SAVEPOINT fuzz",
    "ROLLBACK TO fuzz",
    'RELEASE "oncewire_item"',
    "ATTACH DATABASE '' AS fuzz",
    "ATTACH '' AS fuzz",
    "DETACH fuzz",
    "SET synchronous_commit = off",
    "SET LOCAL synchronous_commit = off",
    "SET SESSION synchronous_commit TO off",
    "SET search_path = public",
    "SET LOCAL search_path TO public",
    "RESET ALL",
    "RESET synchronous_commit",
    "DISCARD ALL",
    "VACUUM",
    "SELECT 1",
]
# What changes how durable the commit is, or where oncewire's statements go: drawn as often as
# every other keyword together.
DURABILITY = [
    "PRAGMA synchronous=OFF",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA main.synchronous(0)",
    "PRAGMA journal_mode=DELETE",
    "PRAGMA journal_mode = MEMORY",
    "PRAGMA journal_mode=OFF",
    "PRAGMA query_only = 1",
    "PRAGMA wal_checkpoint(TRUNCATE)",
    "PRAGMA synchronous",
    "PRAGMA journal_mode",
    "SELECT set_config('synchronous_commit', 'off', false)",
    "SELECT set_config('synchronous_commit', 'off', true)",
    "SELECT set_config('search_path', 'public', false)",
    "SELECT set_config('search_path', 'pg_catalog', true)",
    "SELECT set_config('role', current_user, false)",
]
NESTINGS = [
    "{}",
    "WITH fuzz AS (SELECT 1) {}",
    "SELECT * FROM ({}) AS fuzz",
    "EXPLAIN {}",
    "DO $$ BEGIN EXECUTE $q${}$q$; END $$",
    "CREATE TRIGGER fuzz AFTER INSERT ON caller_rows BEGIN {}; END",
]

statements = st.builds(
    lambda prefix, keyword, case, nesting, suffix: (
        "".join(prefix) + nesting.format(case(keyword)) + suffix
    ),
    # A U+FEFF in front is what SQLite's tokenizer skips and the lexer did not: drawn often.
    st.lists(st.sampled_from(PREFIX_PARTS) | st.just("\ufeff"), max_size=3),
    st.sampled_from(KEYWORDS) | st.sampled_from(DURABILITY),
    st.sampled_from([str, str.lower, str.upper, str.swapcase]),
    st.sampled_from(NESTINGS) | st.just("{}"),
    st.just("") | st.sampled_from(SUFFIXES),
)

_ids = itertools.count(1)


class _Fails(Exception):
    """The caller's own reason to leave the block with an exception."""


def _durability(conn: Any, backend: str) -> tuple[Any, ...]:
    if backend == "sqlite":
        return (
            conn.execute("PRAGMA synchronous").fetchone()[0],
            conn.execute("PRAGMA journal_mode").fetchone()[0],
            conn.execute("PRAGMA query_only").fetchone()[0],
            [row[1] for row in conn.execute("PRAGMA database_list").fetchall()],
        )
    return (
        conn.execute("SHOW synchronous_commit").fetchone()[0],
        conn.execute("SHOW search_path").fetchone()[0],
        conn.execute("SHOW role").fetchone()[0],
    )


@pytest.fixture
def fresh_settings(ledger: Ledger, backend: str) -> tuple[Any, ...]:
    """What a new connection of the store's runs with."""
    fresh = ledger.store.db.connect()
    try:
        return _durability(fresh, backend)
    finally:
        fresh.close()


@pytest.fixture
def caller_table(raw: RawDatabase) -> str:
    raw.execute("CREATE TABLE caller_rows (id INTEGER PRIMARY KEY)")
    return "caller_rows"


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    statement=statements,
    swallow=st.booleans(),
    accept_first=st.booleans(),
    fail=st.booleans(),
)
def test_the_callers_row_and_its_intent_commit_together_or_not_at_all(
    ledger: Ledger,
    raw: RawDatabase,
    backend: str,
    caller_table: str,
    fresh_settings: tuple[Any, ...],
    statement: str,
    swallow: bool,
    accept_first: bool,
    fail: bool,
) -> None:
    n = next(_ids)
    key = f"fuzz-{n}"
    try:
        with ledger.transaction() as tx:
            tx.execute("INSERT INTO caller_rows VALUES (:n)", {"n": n})
            if accept_first:
                tx.accept(key, "send", {"n": n})
            try:
                tx.execute(statement)
            except Exception:
                if not swallow:
                    raise
            if not accept_first:
                tx.accept(key, "send", {"n": n})
            if fail:
                raise _Fails
    except Exception:
        pass  # a refusal, the database's own error, or the caller's: all must leave neither
    row = raw.query("SELECT COUNT(*) FROM caller_rows WHERE id = ?", (n,))[0][0]
    intent = raw.query("SELECT COUNT(*) FROM oncewire_effects WHERE key = ?", (key,))[0][0]
    assert (row, intent) in ((0, 0), (1, 1)), (statement, row, intent)
    if fail:
        assert (row, intent) == (0, 0)
    # The connection oncewire's next transaction on this thread gets runs as a new one would.
    assert _durability(ledger.store.db.conn(), backend) == fresh_settings
    # Anything the statement left behind in the database (a trigger) is the caller's to drop.
    raw.execute(
        "DROP TRIGGER IF EXISTS fuzz" + (" ON caller_rows" if backend == "postgresql" else "")
    )
