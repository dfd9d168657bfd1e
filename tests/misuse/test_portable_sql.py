"""The caller's SQL is portable, and an effect can join the caller's own transaction.

``tx.execute`` with ``:name`` placeholders and a dict runs unchanged on SQLite and PostgreSQL
(translated to psycopg's ``%(name)s`` there, with literals, quoted identifiers, comments, dollar
quotes and casts left alone). ``ledger.accept_in`` writes an effect through a connection the
caller owns, inside the caller's transaction: committed with the caller's rows, or gone with
them. What was stored is read around oncewire.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.core.errors import InvalidPayload, InvalidState, PayloadConflict
from oncewire.storage.sqlguard import caller_statement
from tests.contract.conftest import RawDatabase

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def notes(raw: RawDatabase) -> str:
    raw.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    return "notes"


def _readme_transaction() -> str:
    """The README's ``with ledger.transaction() as tx:`` block, as written."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = re.findall(r"```python\n(import oncewire\n.*?)```", readme, flags=re.S)[0]
    lines = quick.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("with ledger.transaction"))
    body = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("    "):
            break
        body.append(line)
    return "\n".join(body) + "\n"


def test_the_readme_api_example_runs_unchanged_on_both_backends(
    ledger: Ledger, raw: RawDatabase
) -> None:
    code = _readme_transaction()
    assert ":id" in code  # the portable form, not one driver's placeholders
    exec(code, {"ledger": ledger})
    assert raw.query("SELECT id, total FROM orders") == [(42, 1999)]
    assert raw.query("SELECT key, kind, state FROM oncewire_effects") == [
        ("order-42/charge", "charge", "pending")
    ]


@pytest.mark.parametrize(
    "body",
    [
        "it is 10:30 :x",  # a ':x' inside a literal is text
        "50% off, 100%% sure",  # a '%' needs no escaping (doubled only for psycopg)
        "it''s :quoted, isn''t it",
        "%(name)s and %s stay text",
    ],
)
def test_literals_are_left_alone(ledger: Ledger, raw: RawDatabase, notes: str, body: str) -> None:
    sql_literal = body.replace("'", "''")
    with ledger.transaction() as tx:
        tx.execute(
            f"INSERT INTO notes (id, body) VALUES (:id, '{sql_literal}' || :tail)",
            {"id": 1, "tail": "!"},
        )
    assert raw.query("SELECT body FROM notes WHERE id = 1") == [(body + "!",)]


def test_comments_and_quoted_identifiers_are_left_alone(
    ledger: Ledger, raw: RawDatabase, notes: str
) -> None:
    with ledger.transaction() as tx:
        tx.execute(
            'INSERT INTO notes ("id", body) -- :not_a_param, 100%\n'
            "VALUES (/* :nor_this, 5% */ :id, :body)",
            {"id": 7, "body": "a:b"},
        )
        row = tx.execute('SELECT body AS ":alias" FROM notes WHERE id = :id', {"id": 7})
        assert row.fetchall()[0][0] == "a:b"
    assert raw.query("SELECT id, body FROM notes") == [(7, "a:b")]


def test_the_same_named_statement_runs_many_times(
    ledger: Ledger, raw: RawDatabase, notes: str
) -> None:
    sql = "INSERT INTO notes (id, body) VALUES (:id, :body)"
    with ledger.transaction() as tx:
        for i in range(5):
            tx.execute(sql, {"id": i, "body": f"n{i}"})
    assert raw.count("notes") == 5


def test_postgres_casts_and_dollar_quotes(ledger: Ledger, raw: RawDatabase, notes: str) -> None:
    if ledger.store.dialect != "postgresql":
        pytest.skip("'::' casts and dollar quotes are PostgreSQL syntax")
    with ledger.transaction() as tx:
        tx.execute(
            "INSERT INTO notes (id, body) VALUES (:id::int, $$ :x 5% $$ || :b::text)",
            {"id": "3", "b": "x"},
        )
        tx.execute(
            "INSERT INTO notes (id, body) VALUES (:id, $tag$it's :y$tag$ || E'\\':z' || '%')",
            {"id": 4},
        )
    assert sorted(raw.query("SELECT id, body FROM notes")) == [
        (3, " :x 5% x"),
        (4, "it's :y':z%"),
    ]


def test_the_translation_rules() -> None:
    def pg(sql: str) -> str:
        return caller_statement(sql, {"x": 1}, "postgresql")[0]

    assert pg("SELECT 1") == "SELECT 1"
    assert pg("SELECT ':x', x::int") == "SELECT ':x', x::int"  # nothing to translate: as is
    assert pg("SELECT :a, :b_2") == "SELECT %(a)s, %(b_2)s"
    assert pg("SELECT :a::int, '5%'") == "SELECT %(a)s::int, '5%%'"
    assert pg('SELECT "c:d", :a -- :e\n') == 'SELECT "c:d", %(a)s -- :e\n'
    assert pg("SELECT a[1 : n], :x") == "SELECT a[1 : n], %(x)s"
    assert pg("SELECT f(a := 1), :x") == "SELECT f(a := 1), %(x)s"
    assert pg("SELECT x$y$ + :x") == "SELECT x$y$ + %(x)s"  # '$' in a name


def test_a_refused_statement_is_still_refused_with_named_params(
    ledger: Ledger, raw: RawDatabase, notes: str
) -> None:
    with pytest.raises(InvalidState), ledger.transaction() as tx:
        tx.execute("INSERT INTO notes (id, body) VALUES (:id, 'x')", {"id": 1})
        tx.execute("SELECT :id; COMMIT", {"id": 1})
    assert raw.count("notes") == 0


# -- accept_in: the caller's connection, the caller's transaction ---------------------------


@pytest.fixture
def caller_conn(ledger: Ledger, backend: str, notes: str) -> Iterator[Any]:
    """The application's own connection (not autocommit), to the ledger's database."""
    if backend == "sqlite":
        conn: Any = sqlite3.connect(ledger.store.path, timeout=10)  # type: ignore[attr-defined]
    else:
        import psycopg

        conn = psycopg.connect(ledger.store.url)
    try:
        yield conn
    finally:
        conn.close()


def _insert(conn: Any, backend: str, id_: int) -> None:
    mark = "?" if backend == "sqlite" else "%s"
    conn.execute(f"INSERT INTO notes (id, body) VALUES ({mark}, {mark})", (id_, "order"))


def test_accept_in_commits_with_the_callers_rows(
    ledger: Ledger, raw: RawDatabase, caller_conn: Any, backend: str
) -> None:
    _insert(caller_conn, backend, 1)
    effect = ledger.accept_in(caller_conn, "order-1/charge", "charge", {"order": 1})
    assert effect.key == "order-1/charge"
    # Not committed yet: a reader around oncewire sees neither (SQLite: the caller holds the
    # write lock, but WAL readers see the last commit).
    assert raw.count("oncewire_effects") == 0
    assert raw.count("notes") == 0
    caller_conn.commit()
    assert raw.query("SELECT id FROM notes") == [(1,)]
    assert raw.query("SELECT key, kind, state FROM oncewire_effects") == [
        ("order-1/charge", "charge", "pending")
    ]
    assert ledger.effects.get("order-1/charge").payload == {"order": 1}


def test_accept_in_is_gone_when_the_caller_rolls_back(
    ledger: Ledger, raw: RawDatabase, caller_conn: Any, backend: str
) -> None:
    _insert(caller_conn, backend, 1)
    ledger.accept_in(caller_conn, "order-1/charge", "charge", {"order": 1})
    caller_conn.rollback()
    assert raw.count("notes") == 0
    assert raw.count("oncewire_effects") == 0


def test_accept_in_refuses_a_connection_outside_a_transaction(
    ledger: Ledger, raw: RawDatabase, caller_conn: Any, backend: str
) -> None:
    with pytest.raises(InvalidState, match="open transaction"):
        ledger.accept_in(caller_conn, "k", "charge", {})
    _insert(caller_conn, backend, 1)
    caller_conn.commit()  # the transaction ended: the connection is idle again
    with pytest.raises(InvalidState, match="open transaction"):
        ledger.accept_in(caller_conn, "k", "charge", {})
    assert raw.count("oncewire_effects") == 0


def test_accept_in_refuses_the_other_backends_connection(
    ledger: Ledger, raw: RawDatabase, backend: str, tmp_path: Path
) -> None:
    other = sqlite3.connect(tmp_path / "other.db") if backend == "postgresql" else object()
    with pytest.raises(InvalidState, match="accept_in takes"):
        ledger.accept_in(other, "k", "charge", {})
    assert raw.count("oncewire_effects") == 0


def test_accept_in_validates_like_accept(
    ledger: Ledger, raw: RawDatabase, caller_conn: Any, backend: str
) -> None:
    ledger.accept("k", "charge", {"a": 1})
    _insert(caller_conn, backend, 1)
    same = ledger.accept_in(caller_conn, "k", "charge", {"a": 1})  # idempotent
    assert same.digest == ledger.effects.get("k").digest
    with pytest.raises(PayloadConflict):
        ledger.accept_in(caller_conn, "k", "charge", {"a": 2})
    caller_conn.rollback()
    small = Ledger(ledger.store, clock=ledger.clock, max_payload_bytes=64)
    _insert(caller_conn, backend, 2)
    with pytest.raises(InvalidPayload):
        small.accept_in(caller_conn, "big", "charge", {"blob": "x" * 200})
    caller_conn.commit()
    assert raw.query("SELECT key FROM oncewire_effects") == [("k",)]
    assert raw.query("SELECT id FROM notes") == [(2,)]


def test_accept_in_reads_its_rows_whatever_the_callers_row_factory(
    ledger: Ledger, raw: RawDatabase, caller_conn: Any, backend: str
) -> None:
    if backend == "sqlite":
        caller_conn.row_factory = sqlite3.Row
    else:
        from psycopg.rows import dict_row

        caller_conn.row_factory = dict_row
    ledger.accept("k", "charge", {"a": 1})
    _insert(caller_conn, backend, 1)
    assert ledger.accept_in(caller_conn, "new", "charge", {"a": 1}).key == "new"
    assert ledger.accept_in(caller_conn, "k", "charge", {"a": 1}).key == "k"  # read back
    caller_conn.commit()
    assert sorted(raw.query("SELECT key FROM oncewire_effects")) == [("k",), ("new",)]
