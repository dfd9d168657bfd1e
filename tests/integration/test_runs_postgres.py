"""The run ledger on a real PostgreSQL server: a history edited with psycopg, the invariants
the schema holds against direct writes, the migration of a database that predates it, and the
races that SQLite's single writer never let happen (concurrent commands, starts, barriers,
checkpoints and reconcilers)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from oncewire import Ledger
from oncewire.core.errors import RevertBarrierHeld
from oncewire.runs.chain import event_hash
from oncewire.storage.postgres.driver import migrate, migrations
from oncewire.testing import ManualClock
from tests.support.pg import fresh_schema, migrated_schema, server_url

SCOPE = "scope-pg"
LEASE = 30.0


@pytest.fixture
def url() -> Iterator[str]:
    with migrated_schema(server_url(), "runs_pg") as schema_url:
        yield schema_url


@pytest.fixture
def empty_url() -> Iterator[str]:
    with fresh_schema(server_url(), "runs_pg_empty") as schema_url:
        yield schema_url


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ledger(url: str, clock: ManualClock) -> Iterator[Ledger]:
    with Ledger(url, clock=clock) as opened:
        yield opened


def raw(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def start(ledger: Ledger, run_id: str = "run-1", **kw: Any) -> Any:
    kw.setdefault("scope", SCOPE)
    kw.setdefault("owner", "worker")
    kw.setdefault("lease_seconds", LEASE)
    return ledger.runs.start(run_id, key=f"{run_id}:start", **kw)


def propose(ledger: Ledger, n: int, run_id: str = "run-1", **kw: Any) -> Any:
    return ledger.runs.review.propose_action(
        run_id,
        key=f"action-{n}",
        action_id=f"action-{n}",
        kind="shell",
        arguments={"n": n},
        side_effect_class="workspace_write",
        **kw,
    )


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(target())
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def held_open(ledger: Ledger, n: int) -> tuple[threading.Event, threading.Event, Any]:
    """A command whose transaction stays open (its event written) until ``release`` is set."""
    written, release = threading.Event(), threading.Event()

    def pause(tx: Any) -> None:
        written.set()
        assert release.wait(30)

    def command() -> Any:
        return ledger.runs.execute(
            "run-1",
            "propose_action",
            {
                "action_id": f"action-{n}",
                "kind": "shell",
                "arguments": {},
                "side_effect_class": "workspace_write",
                "resource_keys": [],
                "effect_key": None,
            },
            key=f"action-{n}",
            also_in_tx=pause,
        )

    thread, outcome = in_thread(command)
    assert written.wait(10)
    return release, thread, outcome


# -- tampering -----------------------------------------------------------------------------------
def test_an_event_payload_edited_with_psycopg_fails_verification(ledger: Ledger, url: str) -> None:
    start(ledger)
    propose(ledger, 1)
    propose(ledger, 2)
    assert ledger.runs.verify("run-1")[0].ok
    with raw(url) as conn:
        conn.execute(
            "ALTER TABLE oncewire_run_events DISABLE TRIGGER oncewire_run_events_no_update"
        )
        conn.execute(
            "UPDATE oncewire_run_events SET payload = replace(payload, '\"n\":1', '\"n\":7') "
            "WHERE run_id = 'run-1' AND seq = 2"
        )
    result = ledger.runs.verify("run-1")[0]
    assert not result.ok and result.first_bad_seq == 2
    run = ledger.runs.get("run-1")
    assert (run.status, run.terminal_reason) == ("failed", "safety_boundary")
    assert not ledger.runs.verify()[0].ok  # the whole-store sweep finds it too


def test_a_rehashed_edit_is_caught_at_the_next_event(ledger: Ledger, url: str) -> None:
    start(ledger)
    propose(ledger, 1)
    propose(ledger, 2)
    with raw(url) as conn:
        row = conn.execute(
            "SELECT id, type, prev_hash, payload FROM oncewire_run_events WHERE seq = 2"
        ).fetchone()
        assert row is not None
        payload = row[3].replace('"n":1', '"n":7')
        conn.execute(
            "ALTER TABLE oncewire_run_events DISABLE TRIGGER oncewire_run_events_no_update"
        )
        conn.execute(
            "UPDATE oncewire_run_events SET payload = %s, hash = %s WHERE id = %s",
            (payload, event_hash(None, "run-1", 2, row[1], row[2], payload), row[0]),
        )
    result = ledger.runs.verify("run-1")[0]
    assert not result.ok and result.first_bad_seq == 3
    assert ledger.runs.get("run-1").terminal_reason == "safety_boundary"


# -- what the schema refuses ---------------------------------------------------------------------
def test_the_schema_refuses_what_would_break_a_run(ledger: Ledger, url: str) -> None:
    start(ledger)
    ledger.runs.review.record_candidate(
        "run-1",
        key="candidate",
        candidate_id="c-1",
        snapshot_sha256="a" * 64,
        evidence_sha256="e" * 64,
        artifact_set_sha256="b" * 64,
        artifact_ids=["artifact-1"],
        version_ids=["version-1"],
    )
    ledger.runs.review.start_review(
        "run-1", key="review", review_id="r-1", candidate_id="c-1", evidence_sha256="e" * 64
    )
    head = ledger.runs.events("run-1")[-1]
    insert = (
        "INSERT INTO oncewire_run_events (run_id, scope, branch, seq, type, idempotency_key, "
        "request_digest, terminal, payload, prev_hash, hash, at) "
        "VALUES ('run-1', %s, %s, %s, %s, %s, 'd', %s, '{}', %s, 'h', 0)"
    )
    with raw(url) as conn:
        refused = [
            # a terminal while the review is open
            (insert, (SCOPE, SCOPE, head.seq + 1, "run_terminated", "k1", True, head.hash)),
            # an event that does not extend the head
            (insert, (SCOPE, SCOPE, head.seq + 1, "x", "k2", False, "not-the-head")),
            (insert, (SCOPE, SCOPE, head.seq + 5, "x", "k3", False, head.hash)),
            # an event filed under another scope than its run's
            (insert, ("elsewhere", SCOPE, head.seq + 1, "x", "k4", False, head.hash)),
            # history is append-only
            ("UPDATE oncewire_run_events SET payload = '{}' WHERE seq = 1", ()),
            ("DELETE FROM oncewire_run_events WHERE seq = 1", ()),
            ("TRUNCATE oncewire_run_events CASCADE", ()),
            # a second active run on the branch
            (
                "INSERT INTO oncewire_runs (run_id, scope, branch, workflow, chain, status, "
                "state, head_hash, created_at, updated_at) "
                "VALUES ('run-2', %s, %s, 'review', 'sha256', 'new', '{}', 'g', 0, 0)",
                (SCOPE, SCOPE),
            ),
        ]
        for sql, params in refused:
            with pytest.raises(psycopg.IntegrityError):
                conn.execute(sql, params)  # type: ignore[arg-type]
        # A held barrier admits no new work, only late evidence.
        ledger.runs.hold(scope=SCOPE, operation_id="op-1", state="recovery_required")
        with pytest.raises(psycopg.IntegrityError, match="barrier"):
            conn.execute(insert, (SCOPE, SCOPE, head.seq + 1, "x", "k5", False, head.hash))
    assert [e.seq for e in ledger.runs.events("run-1")] == [1, 2, 3]


def test_a_delivery_keeps_its_bytes(ledger: Ledger, url: str) -> None:
    committed = ledger.runs.deliveries.commit(
        "delivery-1", scope=SCOPE, content="hello", manifest={"artifacts": []}
    )
    with raw(url) as conn:
        for column in ("content", "manifest", "content_sha256", "manifest_sha256"):
            with pytest.raises(psycopg.IntegrityError):
                conn.execute(
                    f"UPDATE oncewire_run_deliveries SET {column} = 'x' "  # type: ignore[arg-type]
                    "WHERE delivery_id = %s",
                    (committed.delivery_id,),
                )
    assert ledger.runs.deliveries.publish(committed.delivery_id).content == "hello"


# -- migrations ----------------------------------------------------------------------------------
def test_a_database_migrated_before_the_run_ledger_existed_gains_it(empty_url: str) -> None:
    """Migration 0003 (replies) was released before 0002 (runs): a database at version 3
    still gets 0002."""
    url = empty_url
    without_runs = [m for m in migrations() if m[0] in (1, 3)]
    with raw(url) as conn:
        conn.execute(
            "CREATE TABLE oncewire_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "applied_at DOUBLE PRECISION NOT NULL)"
        )
        for number, name, sql in without_runs:
            conn.execute(sql)  # type: ignore[arg-type]
            conn.execute("INSERT INTO oncewire_schema VALUES (%s, %s, 0)", (number, name))
        assert migrate(conn) == migrations()[-1][0]
        versions = [v for (v,) in conn.execute("SELECT version FROM oncewire_schema ORDER BY 1")]
    assert versions == [number for number, _, _ in migrations()]
    with Ledger(url) as ledger:
        start(ledger)
        assert ledger.runs.verify("run-1")[0].ok


# -- races ---------------------------------------------------------------------------------------
def test_concurrent_commands_on_one_run_extend_one_chain(ledger: Ledger) -> None:
    start(ledger)
    threads = [in_thread(lambda n=n: propose(ledger, n)) for n in range(12)]
    for thread, _ in threads:
        thread.join(60)
    errors = [o for _, outcome in threads for o in outcome if isinstance(o, BaseException)]
    assert errors == []
    events = ledger.runs.events("run-1")
    assert [e.seq for e in events] == list(range(1, 14))
    assert ledger.runs.verify("run-1")[0].ok


def test_concurrent_starts_of_one_run_are_one_start_and_replays(ledger: Ledger) -> None:
    barrier = threading.Barrier(6)

    def go() -> Any:
        barrier.wait(10)
        return start(ledger)

    threads = [in_thread(go) for _ in range(6)]
    for thread, _ in threads:
        thread.join(60)
    outcomes = [o for _, outcome in threads for o in outcome]
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    assert sorted(o.replayed for o in outcomes) == [False] + [True] * 5
    assert len(ledger.runs.events("run-1")) == 1


def test_taking_a_barrier_waits_for_the_command_in_flight(ledger: Ledger) -> None:
    start(ledger)
    release, command, outcome = held_open(ledger, 1)
    hold, held = in_thread(
        lambda: ledger.runs.hold(scope=SCOPE, operation_id="op-1", state="reverting")
    )
    time.sleep(0.5)
    assert hold.is_alive(), "the barrier was taken while a command was being appended"
    release.set()
    command.join(30)
    hold.join(30)
    assert not isinstance(outcome[0], BaseException) and not isinstance(held[0], BaseException)
    with pytest.raises(RevertBarrierHeld):
        propose(ledger, 2)
    assert [e.type for e in ledger.runs.events("run-1")][-1] == "action_proposed"


def test_a_checkpoint_waits_for_the_append_in_flight_in_its_scope(ledger: Ledger) -> None:
    start(ledger)
    release, command, outcome = held_open(ledger, 1)
    checkpoint, taken = in_thread(lambda: ledger.runs.checkpoint("cp-1", scope=SCOPE))
    time.sleep(0.5)
    assert checkpoint.is_alive()
    release.set()
    command.join(30)
    checkpoint.join(30)
    appended = outcome[0].event
    assert taken[0].cursor == appended.cursor  # the event in flight lies before the checkpoint


def test_two_reconcilers_close_each_dead_run_once(url: str, clock: ManualClock) -> None:
    with Ledger(url, clock=clock) as ledger:
        for i in range(6):
            start(ledger, f"run-{i}", scope=f"scope-{i}", owner="daemon-DEAD")
    clock.advance(LEASE * 2)
    ledgers = [Ledger(url, clock=clock) for _ in range(2)]
    try:
        barrier = threading.Barrier(2)

        def sweep(ledger: Ledger, owner: str) -> Any:
            barrier.wait(10)
            return ledger.runs.reconcile(owner=owner)

        threads = [
            in_thread(lambda lg=lg, n=n: sweep(lg, f"daemon-{n}")) for n, lg in enumerate(ledgers)
        ]
        for thread, _ in threads:
            thread.join(60)
        reports = [r for _, outcome in threads for r in outcome[0]]
        assert sorted(r.run_id for r in reports) == [f"run-{i}" for i in range(6)]
        assert {r.outcome for r in reports} == {"terminal"}
        for i in range(6):
            events = ledgers[0].runs.events(f"run-{i}")
            assert sum(e.terminal for e in events) == 1
            assert ledgers[0].runs.verify(f"run-{i}")[0].ok
    finally:
        for opened in ledgers:
            opened.close()


def test_two_barriers_taken_at_once_are_one_barrier_and_a_refusal(ledger: Ledger) -> None:
    start(ledger)
    gate = threading.Barrier(2)

    def hold(operation_id: str) -> Any:
        gate.wait(10)
        return ledger.runs.hold(scope=SCOPE, operation_id=operation_id, state="reverting")

    threads = [in_thread(lambda op=op: hold(op)) for op in ("op-a", "op-b")]
    for thread, _ in threads:
        thread.join(30)
    outcomes = [o for _, outcome in threads for o in outcome]
    refused = [o for o in outcomes if isinstance(o, RevertBarrierHeld)]
    taken = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(refused) == 1 and len(taken) == 1, outcomes


def test_a_barrier_taken_while_a_command_decides_refuses_it_as_a_barrier(
    ledger: Ledger, url: str
) -> None:
    start(ledger)
    with raw(url) as conn, conn.transaction():
        # The barrier's row is written (its scope lock held) but not yet committed: the
        # command reads no barrier, decides, and its append waits for the barrier's fate.
        conn.execute(
            "INSERT INTO oncewire_run_barriers (scope, operation_id, branch, state, created_at, "
            "updated_at) VALUES (%s, 'op-late', NULL, 'reverting', 0, 0)",
            (SCOPE,),
        )
        command, outcome = in_thread(lambda: propose(ledger, 1))
        time.sleep(0.5)
        assert command.is_alive(), "the append did not wait for the barrier being taken"
    command.join(30)
    assert isinstance(outcome[0], RevertBarrierHeld), outcome
    assert outcome[0].fields["scope"] == SCOPE
    assert [e.type for e in ledger.runs.events("run-1")] == ["run_started"]
