"""What the database itself sees in the caller's SQL cannot end or weaken the shared transaction.

The lexer in ``storage/sqlguard.py`` reads the caller's SQL as text; the database reads it
otherwise in places (SQLite skips a leading U+FEFF, PostgreSQL runs ``set_config`` inside any
``SELECT``). Each case here got past the lexer: on SQLite ``\\ufeffCOMMIT`` committed the
caller's rows without the intent, and in ``Receipts.run_once`` a receipt with a NULL result
that every retry replayed; on PostgreSQL ``set_config`` left the pooled connection without
synchronous commits, or sent oncewire's own statements to another schema. Now SQLite's
authorizer refuses what the engine parsed, and PostgreSQL's settings are read after every
statement of the caller's and before the commit. What was stored is read around oncewire, and
the settings on the connection oncewire's next transaction gets.
"""

from __future__ import annotations

from typing import Any

import pytest

from oncewire import Ledger
from oncewire.core.errors import InvalidState
from oncewire.receipts.service import Receipts
from tests.contract.conftest import RawDatabase


@pytest.fixture
def caller_table(raw: RawDatabase) -> str:
    raw.execute("CREATE TABLE caller_rows (id INTEGER PRIMARY KEY)")
    return "caller_rows"


def _settings(ledger: Ledger, backend: str) -> tuple[Any, ...]:
    """The durability settings on the connection the ledger's next transaction gets."""
    conn = ledger.store.db.conn()
    if backend == "sqlite":
        return (
            conn.execute("PRAGMA synchronous").fetchone()[0],
            conn.execute("PRAGMA journal_mode").fetchone()[0],
            [row[1] for row in conn.execute("PRAGMA database_list").fetchall()],
        )
    return tuple(
        conn.execute(f"SHOW {name}").fetchone()[0]
        for name in ("synchronous_commit", "search_path", "role", "default_transaction_isolation")
    )


SQLITE_BYPASSES = [
    "\ufeffCOMMIT",
    "\ufeffEND",
    "\ufeffROLLBACK",
    "\ufeff\ufeffCOMMIT TRANSACTION",
    "\ufeffBEGIN",
    "\ufeffATTACH DATABASE ':memory:' AS other",
    "\ufeffPRAGMA synchronous = OFF",
    "\ufeffPRAGMA journal_mode = DELETE",
    "\ufeffPRAGMA query_only = ON",
    "\ufeffPRAGMA wal_checkpoint",
    "\ufeffRELEASE SAVEPOINT oncewire_nothing",
]


@pytest.mark.parametrize("statement", SQLITE_BYPASSES)
def test_sqlite_refuses_what_the_engine_parses_whatever_the_text_looks_like(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str, statement: str
) -> None:
    if backend != "sqlite":
        pytest.skip("SQLite's tokenizer skips U+FEFF; PostgreSQL reads it as a name")
    before = _settings(ledger, backend)
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO caller_rows VALUES (1)")
        with pytest.raises(InvalidState, match="nothing was executed"):
            tx.execute(statement)
        tx.accept("k-1", "send", {"n": 1})  # the transaction is still the one it was
    assert raw.query("SELECT id FROM caller_rows") == [(1,)]
    assert raw.effect_row("k-1")["state"] == "pending"
    assert _settings(ledger, backend) == before


def test_sqlite_a_callers_own_savepoint_still_works_and_a_disguised_one_is_refused(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str
) -> None:
    if backend != "sqlite":
        pytest.skip("SQLite's authorizer")
    with ledger.transaction() as tx:
        tx.execute("SAVEPOINT mine")
        tx.execute("INSERT INTO caller_rows VALUES (1)")
        tx.execute("ROLLBACK TO mine")
        tx.execute("RELEASE mine")
        tx.execute('SAVEPOINT "Quoted"')
        tx.execute("INSERT INTO caller_rows VALUES (2)")
        with pytest.raises(InvalidState, match="nothing was executed"):
            tx.execute('\ufeffROLLBACK TO "Quoted"')  # the guard cannot read it: refused
        tx.execute('RELEASE "Quoted"')
        tx.execute("PRAGMA table_info(caller_rows)")  # reading stays allowed
        tx.execute("SELECT * FROM pragma_table_info('caller_rows')")
        tx.accept("k-1", "send", {"n": 1})
    assert raw.query("SELECT id FROM caller_rows") == [(2,)]
    assert raw.count("oncewire_effects") == 1


def test_sqlite_a_receivers_disguised_commit_leaves_no_receipt_to_replay(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str
) -> None:
    """Regression: the reservation (result NULL) committed with the work's row, and every
    retry replayed None instead of doing the work."""
    if backend != "sqlite":
        pytest.skip("SQLite's tokenizer skips U+FEFF")
    receipts = Receipts(ledger.store)
    calls: list[int] = []

    def sneaky(tx: Any) -> str:
        calls.append(1)
        tx.execute("INSERT INTO caller_rows VALUES (1)")
        tx.execute("\ufeffCOMMIT")
        return "charged"

    with pytest.raises(InvalidState, match="nothing was executed"):
        receipts.run_once("r-1", {"cents": 5}, sneaky)
    assert raw.count("oncewire_receipts") == 0
    assert raw.count(caller_table) == 0

    def honest(tx: Any) -> str:
        calls.append(2)
        tx.execute("INSERT INTO caller_rows VALUES (1)")
        return "charged"

    first = receipts.run_once("r-1", {"cents": 5}, honest)
    assert (first.result, first.replayed) == ("charged", False)
    assert receipts.run_once("r-1", {"cents": 5}, honest).replayed
    assert calls == [1, 2]
    assert raw.query("SELECT key, result FROM oncewire_receipts") == [("r-1", '"charged"')]
    assert raw.query("SELECT id FROM caller_rows") == [(1,)]


PG_SESSION_CHANGES = [
    ("SELECT set_config('synchronous_commit', 'off', false)", "synchronous_commit"),
    ("SELECT set_config('synchronous_commit', 'off', true)", "synchronous_commit"),
    ("SELECT set_config('search_path', 'pg_catalog', false)", "search_path"),
    ("SELECT set_config('search_path', 'public', true)", "search_path"),
    (
        "SELECT set_config('default_transaction_isolation', 'serializable', false)",
        "default_transaction_isolation",
    ),
    (
        "SELECT set_config('default_transaction_read_only', 'on', false)",
        "default_transaction_read_only",
    ),
    ("SELECT set_config('statement_timeout', '17min', false)", "statement_timeout"),
    (
        "SELECT set_config('idle_in_transaction_session_timeout', '17min', false)",
        "idle_in_transaction_session_timeout",
    ),
    ("SELECT set_config('role', current_user, false)", "role"),
    ("SELECT set_config('session_replication_role', 'replica', false)", "session_replication_role"),
    (
        "WITH s AS (SELECT set_config('synchronous_commit', 'local', false)) SELECT * FROM s",
        "synchronous_commit",
    ),
    ("SELECT 1 FROM (SELECT set_config('lock_timeout', '5ms', false)) AS s", "lock_timeout"),
    (
        "DO $$ BEGIN PERFORM set_config('synchronous_commit', 'off', false); END $$",
        "synchronous_commit",
    ),
    ("CREATE TEMPORARY TABLE oncewire_effects (id INTEGER)", "oncewire_effects now names"),
]


@pytest.mark.parametrize(("statement", "setting"), PG_SESSION_CHANGES)
def test_postgres_a_changed_setting_rolls_back_the_whole_transaction_and_names_it(
    ledger: Ledger,
    raw: RawDatabase,
    backend: str,
    caller_table: str,
    statement: str,
    setting: str,
) -> None:
    if backend != "postgresql":
        pytest.skip("PostgreSQL's settings")
    before = _settings(ledger, backend)
    with pytest.raises(InvalidState, match=setting) as caught, ledger.transaction() as tx:
        tx.execute("INSERT INTO caller_rows VALUES (:id)", {"id": 1})
        tx.accept("k-1", "send", {"n": 1})
        tx.execute(statement)
        tx.accept("k-2", "send", {"n": 2})
    assert "rolled back" in str(caught.value)
    assert raw.count(caller_table) == 0
    assert raw.count("oncewire_effects") == 0
    assert _settings(ledger, backend) == before
    ledger.accept("k-3", "send", {"n": 3})  # the connection is oncewire's as it was
    assert [r[0] for r in raw.query("SELECT key FROM oncewire_effects")] == ["k-3"]


@pytest.mark.parametrize(("statement", "setting"), PG_SESSION_CHANGES[:3])
def test_postgres_a_refusal_the_caller_swallows_still_commits_nothing(
    ledger: Ledger,
    raw: RawDatabase,
    backend: str,
    caller_table: str,
    statement: str,
    setting: str,
) -> None:
    if backend != "postgresql":
        pytest.skip("PostgreSQL's settings")
    before = _settings(ledger, backend)
    with pytest.raises(InvalidState, match=setting), ledger.transaction() as tx:
        tx.execute("INSERT INTO caller_rows VALUES (:id)", {"id": 1})
        with pytest.raises(InvalidState, match=setting):
            tx.execute(statement)
        with pytest.raises(InvalidState, match=setting):
            tx.accept("k-1", "send", {"n": 1})  # nothing of oncewire's runs after it
        # the block then ends normally: the commit is refused, and rolls back
    assert raw.count(caller_table) == 0
    assert raw.count("oncewire_effects") == 0
    assert _settings(ledger, backend) == before


def test_postgres_a_setting_changed_by_a_deferred_trigger_at_commit_is_caught(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str
) -> None:
    """A constraint trigger deferred to the commit runs after the caller's last statement."""
    if backend != "postgresql":
        pytest.skip("PostgreSQL's deferred triggers")
    raw.execute(
        "CREATE FUNCTION caller_rows_quietly() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN PERFORM set_config('synchronous_commit', 'off', false); RETURN NULL; END $$"
    )
    raw.execute(
        "CREATE CONSTRAINT TRIGGER caller_rows_at_commit AFTER INSERT ON caller_rows "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION caller_rows_quietly()"
    )
    before = _settings(ledger, backend)
    with pytest.raises(InvalidState, match="synchronous_commit"), ledger.transaction() as tx:
        tx.execute("INSERT INTO caller_rows VALUES (:id)", {"id": 1})
        tx.accept("k-1", "send", {"n": 1})
    assert raw.count(caller_table) == 0
    assert raw.count("oncewire_effects") == 0
    assert _settings(ledger, backend) == before


PG_REFUSED_BY_THE_SERVER = [
    "DO $$ BEGIN COMMIT; END $$",
    "CALL caller_commits()",
]


@pytest.mark.parametrize("statement", PG_REFUSED_BY_THE_SERVER)
def test_postgres_a_commit_the_server_refuses_leaves_neither(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str, statement: str
) -> None:
    if backend != "postgresql":
        pytest.skip("PostgreSQL's procedures")
    raw.execute("CREATE PROCEDURE caller_commits() LANGUAGE plpgsql AS $$ BEGIN COMMIT; END $$")
    with pytest.raises(Exception), ledger.transaction() as tx:  # noqa: B017 - refused somewhere
        tx.execute("INSERT INTO caller_rows VALUES (:id)", {"id": 1})
        tx.accept("k-1", "send", {"n": 1})
        try:
            tx.execute(statement)
        except Exception:
            pass  # the caller swallows it: the transaction is still not committed
    assert raw.count(caller_table) == 0
    assert raw.count("oncewire_effects") == 0


LEXER_REFUSED = [
    "SET LOCAL synchronous_commit = off",
    "SET LOCAL search_path = public",
    "set local ROLE nobody_in_particular",
    "SET LOCAL SESSION AUTHORIZATION DEFAULT",
    "SET LOCAL statement_timeout = 1",
    'SET LOCAL "synchronous_commit" TO off',
    "LISTEN oncewire_effects",
    "COPY caller_rows FROM STDIN",
    "COPY (SELECT 1) TO STDOUT",
    "DEALLOCATE ALL",
]


@pytest.mark.parametrize("statement", LEXER_REFUSED)
def test_what_oncewire_relies_on_is_refused_before_it_runs(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str, statement: str
) -> None:
    before = _settings(ledger, backend)
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO caller_rows VALUES (:id)", {"id": 1})
        with pytest.raises(InvalidState, match="nothing was executed"):
            tx.execute(statement)
        tx.accept("k-1", "send", {"n": 1})
    assert raw.query("SELECT id FROM caller_rows") == [(1,)]
    assert raw.count("oncewire_effects") == 1
    assert _settings(ledger, backend) == before


def test_postgres_settings_oncewire_does_not_rely_on_stay_the_callers(
    ledger: Ledger, raw: RawDatabase, backend: str, caller_table: str
) -> None:
    if backend != "postgresql":
        pytest.skip("PostgreSQL's settings")
    with ledger.transaction() as tx:
        tx.execute("SET LOCAL TimeZone = 'UTC'")
        tx.execute("SET LOCAL work_mem = '8MB'")
        tx.execute("SELECT set_config('application_name', 'caller', true)")
        tx.execute("INSERT INTO caller_rows VALUES (:id)", {"id": 1})
        tx.accept("k-1", "send", {"n": 1})
    assert raw.count(caller_table) == 1
    assert raw.count("oncewire_effects") == 1
