"""PostgreSQL: a transaction's BEGIN travels with its first statement (one round trip, not two).

What the client sent is read from libpq's protocol trace of the store's connection; what was
committed is read from the server on a connection of its own.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from oncewire import Ledger
from oncewire.core.errors import InvalidState, PayloadConflict, StatementError
from tests.support.pg import migrated_schema, server_url


@pytest.fixture
def pg_url() -> Iterator[str]:
    with migrated_schema(server_url(), "begin") as url:
        yield url


@pytest.fixture
def ledger(pg_url: str) -> Iterator[Ledger]:
    ledger = Ledger(pg_url)
    with ledger.transaction() as tx:
        tx.execute("CREATE TABLE caller_rows (id INTEGER PRIMARY KEY)")
    try:
        yield ledger
    finally:
        ledger.close()


def _count(url: str, sql: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def _sent(ledger: Ledger, work: object) -> list[tuple[str, str]]:
    """(message, text) of every frontend message ``work()`` sent on this thread's connection."""
    conn = ledger.store.db.fresh_conn()  # type: ignore[attr-defined]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace"
        with path.open("w") as out:
            conn.pgconn.trace(out.fileno())
            try:
                work()  # type: ignore[operator]
            finally:
                conn.pgconn.untrace()
        lines = path.read_text().splitlines()
    sent = []
    for line in lines:
        fields = line.split("\t")
        if len(fields) >= 4 and fields[1] == "F":
            sent.append((fields[3], fields[4] if len(fields) > 4 else ""))
    return sent


def test_an_accept_alone_is_one_statement_in_one_round_trip(pg_url: str, ledger: Ledger) -> None:
    ledger.accept("warm", "send", {"n": 0})  # the connection is open
    sent = _sent(ledger, lambda: ledger.accept("k-1", "send", {"n": 1}))
    waits = [i for i, (message, _) in enumerate(sent) if message in ("Sync", "Query")]
    assert len(waits) == 1, sent  # no BEGIN, no COMMIT: the server commits the statement
    parsed = [text for message, text in sent if message == "Parse"]
    assert len(parsed) <= 1 and all("INSERT INTO oncewire_effects" in t for t in parsed), sent
    assert _count(pg_url, "SELECT COUNT(*) FROM oncewire_effects WHERE key = 'k-1'") == 1


def test_an_accept_alone_of_an_existing_key_changes_nothing(pg_url: str, ledger: Ledger) -> None:
    first = ledger.accept("k-1", "send", {"n": 1})
    assert ledger.accept("k-1", "send", {"n": 1}) == first
    with pytest.raises(PayloadConflict):
        ledger.accept("k-1", "send", {"n": 2})
    assert _count(pg_url, "SELECT COUNT(*) FROM oncewire_effects") == 1
    assert _count(pg_url, "SELECT COUNT(*) FROM oncewire_effects WHERE payload = '{\"n\":1}'") == 1


def test_an_accept_alone_inside_an_open_transaction_is_refused(pg_url: str, ledger: Ledger) -> None:
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO caller_rows VALUES (9)")
        with pytest.raises(InvalidState, match="already open"):
            ledger.accept("inside", "send", {"n": 1})
    assert _count(pg_url, "SELECT COUNT(*) FROM oncewire_effects") == 0
    assert _count(pg_url, "SELECT COUNT(*) FROM caller_rows") == 1


def test_an_accept_alone_rides_out_a_connection_dropped_while_idle(
    pg_url: str, ledger: Ledger
) -> None:
    ledger.accept("before", "send", {"n": 0})
    pid = ledger.store.db.fresh_conn().info.backend_pid  # type: ignore[attr-defined]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    ledger.accept("after", "send", {"n": 1})
    assert ledger.store.db.fresh_conn().info.backend_pid != pid  # type: ignore[attr-defined]
    assert _count(pg_url, "SELECT COUNT(*) FROM oncewire_effects WHERE key = 'after'") == 1


def test_an_accept_in_a_transaction_sends_begin_with_its_insert_then_commits(
    pg_url: str, ledger: Ledger
) -> None:
    def accept() -> None:
        with ledger.transaction() as tx:
            tx.accept("k-1", "send", {"n": 1})

    with ledger.transaction() as tx:
        tx.accept("warm", "send", {"n": 0})
    sent = _sent(ledger, accept)
    waits = [i for i, (message, _) in enumerate(sent) if message in ("Sync", "Query")]
    # Two round trips: BEGIN and the INSERT before one Sync, then the COMMIT.
    assert len(waits) == 2, sent
    first = [text for message, text in sent[: waits[0]] if message == "Parse"]
    assert "BEGIN" in first[0] and "INSERT INTO oncewire_effects" in first[1], first
    assert sent[waits[1]] == ("Query", ' "COMMIT"'), sent[waits[1]]
    assert _count(pg_url, "SELECT COUNT(*) FROM oncewire_effects WHERE key = 'k-1'") == 1


def test_a_failing_first_statement_commits_nothing(pg_url: str, ledger: Ledger) -> None:
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO caller_rows VALUES (1)")
    with pytest.raises(StatementError, match="23505"), ledger.transaction() as tx:
        tx.execute("INSERT INTO caller_rows VALUES (1)")  # the first statement: refused
    with ledger.transaction() as tx:  # the connection is usable again, and idle
        tx.execute("INSERT INTO caller_rows VALUES (2)")
        tx.accept("k-2", "send", {"n": 2})
    assert _count(pg_url, "SELECT COUNT(*) FROM caller_rows") == 2
    assert _count(pg_url, "SELECT COUNT(*) FROM oncewire_effects") == 1


def test_a_block_that_runs_nothing_sends_nothing(ledger: Ledger) -> None:
    def empty() -> None:
        with ledger.transaction():
            pass

    assert _sent(ledger, empty) == []


def test_the_store_reaching_the_connection_directly_writes_inside_the_transaction(
    pg_url: str, ledger: Ledger
) -> None:
    """Before its first statement the transaction has sent nothing: a statement run on this
    thread's connection through the driver must still run inside it (and roll back with it),
    never in autocommit."""
    with pytest.raises(RuntimeError, match="after the write"), ledger.transaction():
        conn = ledger.store.db.conn()
        conn.execute("INSERT INTO caller_rows VALUES (7)")
        raise RuntimeError("after the write")
    assert _count(pg_url, "SELECT COUNT(*) FROM caller_rows") == 0


def test_a_connection_dropped_while_idle_is_replaced_at_the_first_statement(
    pg_url: str, ledger: Ledger
) -> None:
    ledger.accept("before", "send", {"n": 0})
    pid = ledger.store.db.fresh_conn().info.backend_pid  # type: ignore[attr-defined]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO caller_rows VALUES (3)")
        tx.accept("after", "send", {"n": 1})
    assert ledger.store.db.fresh_conn().info.backend_pid != pid  # type: ignore[attr-defined]
    assert _count(pg_url, "SELECT COUNT(*) FROM caller_rows WHERE id = 3") == 1
    assert _count(pg_url, "SELECT COUNT(*) FROM oncewire_effects") == 2


def test_a_transaction_inside_a_waiting_one_is_refused(ledger: Ledger) -> None:
    with (
        pytest.raises(InvalidState, match="already open"),
        ledger.transaction(),
        ledger.transaction(),
    ):
        pass


def test_a_dispatcher_step_is_one_round_trip(pg_url: str, ledger: Ledger) -> None:
    """Settle a batch, record its history, tell the waiters and claim the next batch: BEGIN,
    the statements and COMMIT travel together when no suspect is looked for."""
    from oncewire.storage.records import EffectState, Settlement

    with ledger.transaction() as tx:
        for n in range(6):
            tx.accept(f"s-{n}", "send", {"n": n})
    store = ledger.store
    now = time.time()
    first = store.dispatch_step(
        [], owner="w1", now=now, lease_seconds=30.0, limit=3, mark=3, suspects=False
    )
    done = [
        Settlement(c.id, c.fence, EffectState.DONE, attempt=1, outcome="done", finished_at=now)
        for c in first.claims
    ]
    steps = []

    def step() -> None:
        steps.append(
            store.dispatch_step(
                done, owner="w1", now=now + 1, lease_seconds=30.0, limit=3, mark=3, suspects=False
            )
        )

    sent = _sent(ledger, step)
    waits = [message for message, _ in sent if message in ("Sync", "Query")]
    assert waits == ["Sync"], sent
    parsed = [text for message, text in sent if message == "Parse"]
    assert "BEGIN" in parsed[0] and "COMMIT" in parsed[-1], parsed
    assert steps[0].applied == [True, True, True] and len(steps[0].claims) == 3
    assert _count(pg_url, "SELECT COUNT(*) FROM oncewire_effects WHERE state = 'done'") == 3
    assert _count(pg_url, "SELECT COUNT(*) FROM oncewire_attempts") == 3
    assert _count(pg_url, "SELECT COUNT(*) FROM oncewire_effects WHERE state = 'claimed'") == 3


def test_dispatcher_steps_go_on_after_the_server_terminates_their_connection(
    pg_url: str, ledger: Ledger
) -> None:
    """The one-round-trip step on a connection the server terminated: the step fails (a
    transient StorageError) or is sent again on a new connection, and the next one works;
    the connection is never handed out again in a failed state."""
    from oncewire.core.errors import StorageError

    with ledger.transaction() as tx:
        for n in range(4):
            tx.accept(f"t-{n}", "send", {"n": n})
    store, now = ledger.store, time.time()
    first = store.dispatch_step(
        [], owner="w1", now=now, lease_seconds=30.0, limit=1, mark=1, suspects=False
    )
    assert len(first.claims) == 1
    for round_ in range(3):
        pid = store.db.fresh_conn().info.backend_pid  # type: ignore[attr-defined]
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        try:
            store.dispatch_step(
                [], owner="w1", now=now, lease_seconds=30.0, limit=0, suspects=False
            )
        except StorageError as exc:
            assert exc.transient, exc
        step = store.dispatch_step(
            [], owner="w1", now=now, lease_seconds=30.0, limit=1, mark=1, suspects=False
        )
        assert len(step.claims) == 1, round_
    assert _count(pg_url, "SELECT COUNT(*) FROM oncewire_effects WHERE state = 'claimed'") == 4
