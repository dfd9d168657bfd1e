"""Store contract: the run ledger's id, snapshot and key-pin verbs, on every backend.

``used_ids_in_tx`` is how a command is refused before it opens a review, repair, finding or
action id the run already uses; ``read_snapshot`` is the one moment a verified read judges a
run at; ``insert_key_pins_in_tx``, ``run_key_pin`` and ``unpinned_keyless_runs_in_tx`` are how a
keyless store adopts a key. Each is checked against the database itself through ``raw``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import pytest

from oncewire.core.errors import InvalidState, OncewireError
from oncewire.storage import Store
from oncewire.storage.runs import (
    ActionRow,
    EventRow,
    FindingRow,
    KeyPinRow,
    PhaseRow,
    RunAppend,
    RunRow,
)
from oncewire.storage.sqlite import SQLiteStore

from .conftest import T0, RawDatabase
from .test_store_runs import _append
from .test_store_runs_verbs import _started

PIN_COLUMNS = "run_id, key_id, head_seq, head_hash, mac, created_at"


def _phase(run_id: str, phase_id: str, kind: str, seq: int) -> PhaseRow:
    return PhaseRow(run_id, phase_id, kind, "open", None, "c1", "{}", None, False, seq, None, T0,
                    None)  # fmt: skip


def _action(run_id: str, action_id: str, seq: int) -> ActionRow:
    return ActionRow(run_id, action_id, None, "shell", "{}", "d", "external", "[]", None,
                     "proposed", None, seq, None)  # fmt: skip


def _change(
    row: RunRow,
    key: str,
    *,
    phases: Sequence[PhaseRow] = (),
    findings: Sequence[FindingRow] = (),
    actions: Sequence[ActionRow] = (),
) -> RunAppend:
    seq = row.head_seq + 1
    event = EventRow(0, row.run_id, row.scope, row.branch, seq, "e", key, "d", False, "{}",
                     row.head_hash, f"h{seq}-{row.run_id}", T0)  # fmt: skip
    after = replace(row, head_seq=seq, head_hash=event.hash, status="running")
    return RunAppend(event, after, phases, findings, actions)


def _write(store: Store, change: RunAppend) -> RunRow:
    with store.transaction() as tx:
        store.append_run_event_in_tx(tx, change)
    return change.run


def _pin(row: RunRow, key_id: str = "key-a") -> KeyPinRow:
    return KeyPinRow(row.run_id, key_id, row.head_seq, row.head_hash, f"mac-{row.run_id}", T0 + 5)


def _stored_pins(raw: RawDatabase) -> list[KeyPinRow]:
    rows = raw.query(f"SELECT {PIN_COLUMNS} FROM oncewire_run_key_pins ORDER BY run_id")
    return [KeyPinRow(str(r[0]), str(r[1]), int(r[2]), str(r[3]), str(r[4]), float(r[5]))
            for r in rows]  # fmt: skip


@contextmanager
def _second_store(store: Store) -> Iterator[Store]:
    """Another store on the same database: its own connections, its own transactions."""
    if isinstance(store, SQLiteStore):
        other: Store = SQLiteStore(store.path)
    else:
        from oncewire.storage.postgres import PostgresStore

        assert isinstance(store, PostgresStore)
        other = PostgresStore(store.url)
    try:
        yield other
    finally:
        other.close()


# -- used_ids_in_tx ------------------------------------------------------------------------------


def test_used_ids_are_exactly_the_ids_the_run_already_uses(store: Store, raw: RawDatabase) -> None:
    row = _started(store, "r1")
    # seq 2 opens review p1 and proposes a1; seq 3 closes p1 with finding f1 and opens repair p2.
    row = _write(store, _change(row, "k2", phases=[_phase("r1", "p1", "review", 2)],
                                actions=[_action("r1", "a1", 2)]))  # fmt: skip
    closed = replace(_phase("r1", "p1", "review", 2), status="passed", verdict="pass",
                     result_json="{}", closed_seq=3, closed_at=T0)  # fmt: skip
    finding = FindingRow("r1", "f1", "p1", "c1", "minor", "{}")
    _write(store, _change(row, "k3", phases=[closed, _phase("r1", "p2", "repair", 3)],
                          findings=[finding]))  # fmt: skip
    # Another run uses the ids r1 has not: they are not r1's.
    other = _started(store, "r2", "b2")
    _write(store, _change(other, "k2", phases=[_phase("r2", "p9", "review", 2)],
                          actions=[_action("r2", "a9", 2)]))  # fmt: skip

    with store.transaction() as tx:
        used = store.used_ids_in_tx(
            tx, "r1", phases=["p1", "p2", "p9", "nope"], findings=["f1", "f9"],
            actions=["a1", "a9"],
        )  # fmt: skip
        assert store.used_ids_in_tx(tx, "r1") == []
        assert store.used_ids_in_tx(tx, "r1", phases=["p9"], actions=["a9"], findings=["f9"]) == []
        assert store.used_ids_in_tx(tx, "nope", phases=["p1"], actions=["a1"]) == []
        theirs = store.used_ids_in_tx(tx, "r2", phases=["p9", "p1"], actions=["a9", "a1"])
    assert sorted(used) == [
        ("action", "a1", 2),
        ("finding", "f1", 3),  # the event that closed the review it was found in
        ("repair", "p2", 3),
        ("review", "p1", 2),
    ]
    assert sorted(theirs) == [("action", "a9", 2), ("review", "p9", 2)]
    # The same answer, read from the tables themselves.
    stored = raw.query(
        "SELECT kind, phase_id, opened_seq FROM oncewire_run_phases WHERE run_id = ? "
        "UNION ALL SELECT 'action', action_id, proposed_seq FROM oncewire_run_actions "
        "WHERE run_id = ? UNION ALL SELECT 'finding', f.finding_id, p.closed_seq "
        "FROM oncewire_run_findings f JOIN oncewire_run_phases p "
        "ON p.run_id = f.run_id AND p.phase_id = f.phase_id WHERE f.run_id = ?",
        ("r1", "r1", "r1"),
    )
    assert sorted((str(k), str(i), int(s)) for k, i, s in stored) == sorted(used)


def test_used_ids_see_what_the_same_transaction_wrote(store: Store, raw: RawDatabase) -> None:
    row = _started(store, "r1")
    with store.transaction() as tx:
        assert store.used_ids_in_tx(tx, "r1", actions=["a1"], phases=["p1"]) == []
        store.append_run_event_in_tx(
            tx, _change(row, "k2", phases=[_phase("r1", "p1", "review", 2)],
                        actions=[_action("r1", "a1", 2)]),
        )  # fmt: skip
        used = store.used_ids_in_tx(tx, "r1", actions=["a1"], phases=["p1"])
        assert raw.count("oncewire_run_actions") == 0  # not committed yet
    assert sorted(used) == [("action", "a1", 2), ("review", "p1", 2)]
    assert raw.count("oncewire_run_actions") == 1


# -- read_snapshot -------------------------------------------------------------------------------


def test_a_read_snapshot_does_not_see_writes_committed_after_its_first_read(
    store: Store, raw: RawDatabase
) -> None:
    row = _started(store, "r1")
    with _second_store(store) as other:
        with store.read_snapshot():
            before = store.get_run("r1")
            assert before is not None and before.head_seq == 1
            # Another connection extends the chain and pins the run; both commit.
            _append(other, row, "k2")
            raw.execute(
                f"INSERT INTO oncewire_run_key_pins ({PIN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                ("r1", "key-a", 1, row.head_hash, "mac", T0),
            )
            assert raw.query("SELECT head_seq FROM oncewire_runs WHERE run_id = ?", ("r1",)) == [
                (2,)
            ]
            # Inside the snapshot the run, its chain and its pin are all from before them.
            assert store.get_run("r1") == before
            assert [c[1] for c in store.run_chain("r1")] == [1]
            assert [e.seq for e in store.run_events("r1")] == [1]
            assert store.run_key_pin("r1") is None
        after = store.get_run("r1")
    assert after is not None and after.head_seq == 2
    assert [c[1] for c in store.run_chain("r1")] == [1, 2]
    pin = store.run_key_pin("r1")
    assert pin is not None and pin.key_id == "key-a"


def test_a_read_snapshot_is_taken_at_its_first_read(store: Store, raw: RawDatabase) -> None:
    # Deferred on both backends: what commits between entering the block and its first read is
    # part of the snapshot; what commits after that first read is not.
    _started(store, "r1")
    with store.read_snapshot():
        raw.execute("UPDATE oncewire_runs SET owner = ? WHERE run_id = ?", ("before-read", "r1"))
        assert store.get_run("r1").owner == "before-read"  # type: ignore[union-attr]
        raw.execute("UPDATE oncewire_runs SET owner = ? WHERE run_id = ?", ("after-read", "r1"))
        assert store.get_run("r1").owner == "before-read"  # type: ignore[union-attr]
    assert store.get_run("r1").owner == "after-read"  # type: ignore[union-attr]


def test_a_read_snapshot_ends_with_its_block_even_when_it_raises(
    store: Store, raw: RawDatabase
) -> None:
    row = _started(store, "r1")
    with pytest.raises(LookupError, match="the caller's own"), store.read_snapshot():
        assert store.get_run("r1") == row
        raw.execute("UPDATE oncewire_runs SET owner = ? WHERE run_id = ?", ("w2", "r1"))
        raise LookupError("the caller's own error")
    # The snapshot is gone: a fresh read sees the write, and the thread can write again.
    assert store.get_run("r1").owner == "w2"  # type: ignore[union-attr]
    with store.transaction() as tx:
        store.insert_key_pins_in_tx(tx, [_pin(row)])
    assert _stored_pins(raw) == [_pin(row)]


def test_a_write_inside_a_read_snapshot_is_refused_and_writes_nothing(
    store: Store, raw: RawDatabase
) -> None:
    row = _started(store, "r1")
    with store.read_snapshot():
        assert store.get_run("r1") == row
        with pytest.raises(InvalidState), store.transaction() as tx:
            store.insert_key_pins_in_tx(tx, [_pin(row)])
        assert store.run_key_pin("r1") is None  # the snapshot still reads
    assert raw.count("oncewire_run_key_pins") == 0
    assert store.run_key_pin("r1") is None


def test_a_read_snapshot_inside_a_transaction_reads_it_and_leaves_it_open(
    store: Store, raw: RawDatabase
) -> None:
    first = _started(store, "r1")
    second = _started(store, "r2", "b2")
    with store.transaction() as tx:
        store.insert_key_pins_in_tx(tx, [_pin(first)])
        with store.read_snapshot():
            # The caller's transaction is the snapshot: its own uncommitted pin is seen.
            assert store.run_key_pin("r1") == _pin(first)
        # ...and it is still open and still the caller's: it writes and commits both pins.
        store.insert_key_pins_in_tx(tx, [_pin(second)])
        assert raw.count("oncewire_run_key_pins") == 0
    assert _stored_pins(raw) == [_pin(first), _pin(second)]


# -- key pins ------------------------------------------------------------------------------------


def test_an_unpinned_keyless_run_is_listed_until_it_is_pinned(
    store: Store, raw: RawDatabase
) -> None:
    active = _started(store, "k2", "b2")  # started first, listed second: by run id
    done = _append(store, _started(store, "k1", "b1"), "end", terminal=True)
    _started(store, "h1", "b3", chain="hmac-sha256", key_id="fp-1")  # keyed: never listed
    with store.transaction() as tx:
        listed = store.unpinned_keyless_runs_in_tx(tx)
    assert listed == [store.get_run("k1"), store.get_run("k2")]
    assert [(r.run_id, r.active) for r in listed] == [("k1", False), ("k2", True)]

    with store.transaction() as tx:
        store.insert_key_pins_in_tx(tx, [])  # nothing to pin writes nothing
        store.insert_key_pins_in_tx(tx, [_pin(done)])
        # Read on the transaction's connection: the pin is there before it commits.
        assert store.run_key_pin("k1") == _pin(done)
        assert [r.run_id for r in store.unpinned_keyless_runs_in_tx(tx)] == ["k2"]
        assert raw.count("oncewire_run_key_pins") == 0
    assert _stored_pins(raw) == [_pin(done)]
    assert store.run_key_pin("k1") == _pin(done)
    assert store.run_key_pin("k2") is None
    assert store.run_key_pin("h1") is None
    assert store.run_key_pin("nope") is None

    with store.transaction() as tx:
        assert [r.run_id for r in store.unpinned_keyless_runs_in_tx(tx)] == ["k2"]
        store.insert_key_pins_in_tx(tx, [_pin(active, "key-b")])
    with store.transaction() as tx:
        assert store.unpinned_keyless_runs_in_tx(tx) == []
    assert _stored_pins(raw) == [_pin(done), _pin(active, "key-b")]


def test_a_run_is_pinned_once_and_a_refused_batch_pins_nothing(
    store: Store, raw: RawDatabase
) -> None:
    first = _started(store, "r1")
    second = _started(store, "r2", "b2")
    with store.transaction() as tx:
        store.insert_key_pins_in_tx(tx, [_pin(first)])
    with pytest.raises(OncewireError), store.transaction() as tx:  # r1 again, under another key
        store.insert_key_pins_in_tx(tx, [_pin(second), _pin(first, "key-b")])
    with pytest.raises(OncewireError), store.transaction() as tx:  # no such run
        store.insert_key_pins_in_tx(tx, [_pin(second), replace(_pin(second), run_id="ghost")])
    assert _stored_pins(raw) == [_pin(first)]
    assert store.run_key_pin("r2") is None
    with store.transaction() as tx:
        assert [r.run_id for r in store.unpinned_keyless_runs_in_tx(tx)] == ["r2"]


def test_two_adopters_at_once_never_pin_a_run_twice(store: Store, raw: RawDatabase) -> None:
    row = _append(store, _started(store, "r1"), "end", terminal=True)
    listed = threading.Event()
    outcome: dict[str, object] = {}

    def second_adopter() -> None:
        listed.wait(timeout=30)
        with _second_store(store) as other:
            try:
                with other.transaction() as tx:
                    rows = other.unpinned_keyless_runs_in_tx(tx)
                    outcome["listed"] = [r.run_id for r in rows]
                    other.insert_key_pins_in_tx(tx, [_pin(r, "key-b") for r in rows])
            except OncewireError as exc:
                outcome["refused"] = exc

    thread = threading.Thread(target=second_adopter)
    thread.start()
    with store.transaction() as tx:
        assert [r.run_id for r in store.unpinned_keyless_runs_in_tx(tx)] == ["r1"]
        listed.set()
        # Not a timing assertion: a moment for the other adopter to reach the lock it waits on
        # (the write lock on SQLite, the pins table's lock on PostgreSQL).
        time.sleep(0.3)
        store.insert_key_pins_in_tx(tx, [_pin(row)])
    thread.join(timeout=60)
    assert not thread.is_alive()
    # The second adopter waited for the first and found nothing left to pin, on both backends
    # (on PostgreSQL it once listed the run again and failed on the pins' primary key).
    assert outcome == {"listed": []}, outcome
    assert _stored_pins(raw) == [_pin(row)]
