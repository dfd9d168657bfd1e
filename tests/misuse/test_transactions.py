"""The caller's SQL cannot break "both or neither" inside ``ledger.transaction()``.

A COMMIT, ROLLBACK or END run through ``tx.execute`` used to end the shared transaction: the
caller's row committed without its effect (or the effect autocommitted after the caller
aborted). Each case runs against the database on both backends, and what was stored is read
around oncewire.
"""

from __future__ import annotations

import pytest

from oncewire import Ledger
from oncewire.core.errors import InvalidState, StatementError
from oncewire.receipts.service import Receipts
from tests.contract.conftest import RawDatabase


@pytest.fixture
def caller_table(raw: RawDatabase) -> str:
    raw.execute("CREATE TABLE caller_rows (id INTEGER PRIMARY KEY)")
    return "caller_rows"


REFUSED = [
    "COMMIT",
    "commit",
    "  \n\t COMMIT TRANSACTION",
    "-- the caller's comment\nCOMMIT",
    "/* a block comment */ END",
    "/* nested /* comment */ */ ROLLBACK",
    "ROLLBACK",
    "rollback transaction",
    "END TRANSACTION",
    "ABORT",
    "BEGIN",
    "BEGIN IMMEDIATE",
    "START TRANSACTION",
    "PREPARE TRANSACTION 'x'",
    "COMMIT PREPARED 'x'",
    "ROLLBACK PREPARED 'x'",
    "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
    "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    "SET search_path = public",
    "SET synchronous_commit = off",
    "RESET ALL",
    "DISCARD ALL",
    "VACUUM",
    "PRAGMA journal_mode = DELETE",
    "PRAGMA main.journal_mode(DELETE)",
    "PRAGMA synchronous = OFF",
    "ATTACH DATABASE 'other.db' AS other",
    "DETACH other",
    "INSERT INTO caller_rows VALUES (2); COMMIT",
    "SELECT 1; ROLLBACK",
    "SELECT ';' AS text; COMMIT",
    "SELECT 'it''s; fine'; END",
    "SELECT $$ ; $$; COMMIT",
    "RELEASE SAVEPOINT nobody_opened_this",
    "ROLLBACK TO SAVEPOINT nobody_opened_this",
    "ROLLBACK TO nobody_opened_this",
]


@pytest.mark.parametrize("statement", REFUSED)
def test_a_refused_statement_leaves_neither_row_nor_effect(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str, statement: str
) -> None:
    with pytest.raises(InvalidState, match="nothing was executed"), ledger.transaction() as tx:
        tx.execute("INSERT INTO caller_rows VALUES (:id)", {"id": 1})
        tx.accept("k-1", "send", {"n": 1})
        tx.execute(statement)
    assert raw.count(caller_table) == 0
    assert raw.count("oncewire_effects") == 0


@pytest.mark.parametrize("statement", REFUSED)
def test_a_refused_statement_runs_nothing_and_the_transaction_goes_on(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str, statement: str
) -> None:
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO caller_rows VALUES (:id)", {"id": 1})
        with pytest.raises(InvalidState):
            tx.execute(statement)
        tx.accept("k-1", "send", {"n": 1})
    assert raw.query("SELECT id FROM caller_rows") == [(1,)]  # not 2: nothing ran
    assert raw.effect_row("k-1")["state"] == "pending"


def test_a_normal_exit_commits_both(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str
) -> None:
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO caller_rows VALUES (:id)", {"id": 1})
        tx.execute("  -- a comment before a plain statement\nSELECT 1")
        tx.execute("SELECT 'COMMIT; ROLLBACK' AS text;")  # one statement, keywords in a string
        tx.accept("k-1", "send", {"n": 1})
    assert raw.count(caller_table) == 1
    assert raw.effect_row("k-1")["state"] == "pending"


def test_the_callers_own_savepoints_nest_inside_the_transaction(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str
) -> None:
    insert = "INSERT INTO caller_rows VALUES (:id)"
    with ledger.transaction() as tx:
        tx.execute(insert, {"id": 1})
        tx.accept("k-1", "send", {"n": 1})
        tx.execute("SAVEPOINT mine")
        tx.execute(insert, {"id": 2})
        tx.execute("ROLLBACK TO SAVEPOINT mine")
        tx.execute("RELEASE mine")
        tx.execute("SAVEPOINT Outer_One")
        tx.execute(insert, {"id": 3})
        tx.execute("release savepoint outer_one")
        with pytest.raises(InvalidState):
            tx.execute("RELEASE mine")  # already released
    assert raw.query("SELECT id FROM caller_rows ORDER BY id") == [(1,), (3,)]
    assert raw.count("oncewire_effects") == 1


def test_a_receivers_work_cannot_release_oncewires_savepoint(
    store_url: str, backend: str, ledger: Ledger, raw: RawDatabase, caller_table: str
) -> None:
    receipts = Receipts(ledger.store)
    insert = "INSERT INTO caller_rows VALUES (:id)"

    def work(tx: object, key: str, payload: object) -> str:
        tx.execute(insert, {"id": int(key)})  # type: ignore[attr-defined]
        if key == "2":
            tx.execute('RELEASE SAVEPOINT "oncewire_item"')  # type: ignore[attr-defined]
        return "ok"

    results = receipts.run_many([("1", {}), ("2", {}), ("3", {})], work)
    assert isinstance(results[1], InvalidState)
    assert raw.query("SELECT id FROM caller_rows ORDER BY id") == [(1,), (3,)]
    assert sorted(r[0] for r in raw.query("SELECT key FROM oncewire_receipts")) == ["1", "3"]


def test_a_transaction_ended_around_oncewire_commits_nothing_more(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str
) -> None:
    """Reaching past ``tx.execute`` to the driver still cannot make oncewire write alone."""
    with pytest.raises(InvalidState, match="no longer open"), ledger.transaction() as tx:
        tx.execute("INSERT INTO caller_rows VALUES (:id)", {"id": 1})
        tx._raw.conn.execute("ROLLBACK")  # type: ignore[attr-defined]
        tx.accept("k-1", "send", {"n": 1})
    assert raw.count(caller_table) == 0
    assert raw.count("oncewire_effects") == 0


def test_a_commit_check_refuses_a_transaction_that_already_ended(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str
) -> None:
    with (
        pytest.raises(InvalidState, match="ended before its with block"),
        ledger.transaction() as tx,
    ):
        tx.accept("k-1", "send", {"n": 1})
        tx._raw.conn.execute("ROLLBACK")  # type: ignore[attr-defined]
        # the block ends normally after the driver-level rollback
    assert raw.count("oncewire_effects") == 0


def test_a_failed_statement_the_caller_swallowed(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str
) -> None:
    """SQLite undoes only the failed statement; PostgreSQL aborts the whole transaction, and
    leaving the block normally then says so instead of reporting a commit that did not happen."""
    insert = "INSERT INTO caller_rows VALUES (:id)"

    def body() -> None:
        with ledger.transaction() as tx:
            tx.execute(insert, {"id": 1})
            tx.accept("k-1", "send", {"n": 1})
            with pytest.raises(Exception):  # noqa: B017 - the driver's own error
                tx.execute(insert, {"id": 1})  # a duplicate key

    if backend == "sqlite":
        body()
        assert raw.count(caller_table) == 1
        assert raw.count("oncewire_effects") == 1
    else:
        with pytest.raises(InvalidState, match="nothing was committed"):
            body()
        assert raw.count(caller_table) == 0
        assert raw.count("oncewire_effects") == 0


def test_execute_after_the_block_is_refused(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str
) -> None:
    with ledger.transaction() as tx:
        tx.accept("k-1", "send", {"n": 1})
    with pytest.raises(InvalidState):
        tx.execute("INSERT INTO caller_rows VALUES (:id)", {"id": 9})
    with pytest.raises(InvalidState):
        tx.accept("k-2", "send", {"n": 2})
    assert raw.count(caller_table) == 0
    assert raw.count("oncewire_effects") == 1


def test_wrong_placeholder_count_is_a_statement_error_on_both_backends(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str
) -> None:
    with pytest.raises(StatementError) as caught, ledger.transaction() as tx:
        tx.accept("k-1", "send", {"n": 1})
        tx.execute("INSERT INTO caller_rows VALUES (:id)", {"other": 1})  # no value for :id
    assert "connection failed" not in str(caught.value)
    assert not caught.value.transient
    assert raw.count(caller_table) == 0
    assert raw.count("oncewire_effects") == 0


def test_a_sqlite_trigger_body_is_one_statement_and_a_commit_after_it_is_not(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str
) -> None:
    """Regression: the semicolons inside CREATE TRIGGER ... BEGIN ...; END were taken for
    statement separators, and the body's END for transaction control."""
    if backend != "sqlite":
        pytest.skip("BEGIN ... END trigger bodies are SQLite's syntax")
    trigger = (
        "CREATE TRIGGER caller_audit AFTER INSERT ON caller_rows BEGIN "
        "INSERT INTO caller_audit VALUES (CASE WHEN new.id > 0 THEN new.id ELSE 0 END); "
        "UPDATE caller_audit SET id = id WHERE id = new.id; END"
    )
    with ledger.transaction() as tx:
        tx.execute("CREATE TABLE caller_audit (id INTEGER)")
        tx.execute(trigger)
        tx.execute("INSERT INTO caller_rows VALUES (7)")
        tx.accept("k-1", "send", {"n": 1})
    assert raw.query("SELECT id FROM caller_audit") == [(7,)]
    assert raw.count("oncewire_effects") == 1
    with pytest.raises(InvalidState, match="more than one statement"), ledger.transaction() as tx:
        tx.execute(trigger.replace("caller_audit AFTER", "caller_audit2 AFTER") + "; COMMIT")
    assert raw.query("SELECT name FROM sqlite_master WHERE name = 'caller_audit2'") == []
