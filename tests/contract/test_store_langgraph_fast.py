"""Store contract: the LangGraph checkpointer's fast verbs, checked in the rows through a second
connection. A held append continues the head its writer knew, only under its lease's fence, and
writes nothing at all (no entry, no row, no head move) when the head, the lease or a replayed
write's slots are not what the writer knew; a new thread's first append takes a lease nobody
ever held in the same transaction. The one-statement read returns a checkpoint, its writes and
the head as stored. A thread without a connection of its own borrows an idle one."""

from __future__ import annotations

import hashlib
import threading
from typing import Any

from oncewire.storage import Store
from oncewire.storage.langgraph import NewCheckpoint, NewWrite, lease_name
from oncewire.storage.verbs.langgraph import LeaseHold, Sealer, Writes

from .conftest import T0, RawDatabase


def _seal(seq: int, kind: str, prev: str, material: str) -> str:
    return hashlib.sha256(f"{seq}|{kind}|{prev}|{material}".encode()).hexdigest()


def _sealer() -> Sealer:
    return Sealer("sha256", None, "g" * 64, _seal)


def _cp(cid: str, parent: str | None = None) -> NewCheckpoint:
    return NewCheckpoint("", cid, parent, "msgpack", b"cp-" + cid.encode(), "json", b"{}", None)


def _writes(cid: str, task: str) -> Writes:
    rows = [
        NewWrite(0, "x", "msgpack", b"v0", "~__pregel_pull, a"),
        NewWrite(-1, "__error__", "msgpack", b"e", "~__pregel_pull, a"),
    ]
    return Writes("", cid, task, rows)


def _counts(raw: RawDatabase) -> tuple[int, int, int]:
    return (
        raw.count("oncewire_lg_chain"),
        raw.count("oncewire_lg_checkpoints"),
        raw.count("oncewire_lg_writes"),
    )


def _material(raw: RawDatabase) -> str:
    return str(raw.query("SELECT material FROM oncewire_lg_chain WHERE seq = 1")[0][0])


def _first(store: Store, owner: str = "me") -> tuple[LeaseHold, tuple[int, str]]:
    hold = LeaseHold(lease_name("t"), owner, 1, T0 + 30)
    entry = store.lg_append_held(
        "t", _cp("c1"), sealer=_sealer(), holder=hold, after=None, now=T0, take_lease=True
    )
    assert entry is not None
    return hold, (entry.seq, entry.hash)


def test_a_new_threads_first_append_takes_its_lease(store: Store, raw: RawDatabase) -> None:
    _, head = _first(store)
    assert head == (1, _seal(1, "checkpoint", "g" * 64, _material(raw)))
    assert raw.query("SELECT owner, fence, expires_at FROM oncewire_leases") == [("me", 1, T0 + 30)]
    assert raw.query("SELECT seq, kind, prev_hash, hash FROM oncewire_lg_chain") == [
        (1, "checkpoint", "g" * 64, head[1])
    ]
    assert raw.query("SELECT checkpoint_id, seq FROM oncewire_lg_checkpoints") == [("c1", 1)]
    assert raw.query("SELECT head_seq, head_hash FROM oncewire_lg_threads") == [head]


def test_a_held_append_continues_the_known_head(store: Store, raw: RawDatabase) -> None:
    hold, head = _first(store)
    second = store.lg_append_held(
        "t", _cp("c2", "c1"), sealer=_sealer(), holder=hold, after=head, now=T0 + 1
    )
    assert second is not None and (second.seq, second.prev_hash) == (2, head[1])
    third = store.lg_append_held(
        "t",
        _writes("c2", "task-1"),
        sealer=_sealer(),
        holder=hold,
        after=(second.seq, second.hash),
        now=T0 + 2,
    )
    assert third is not None and third.kind == "writes"
    assert raw.query("SELECT idx, seq FROM oncewire_lg_writes ORDER BY idx") == [(-1, 3), (0, 3)]
    assert raw.query("SELECT head_seq, head_hash FROM oncewire_lg_threads") == [(3, third.hash)]
    # The fence is checked, not extended: the lease is renewed apart from the appends.
    assert raw.query("SELECT expires_at FROM oncewire_leases") == [(T0 + 30,)]


def test_a_held_append_sent_twice_is_stored_once(store: Store, raw: RawDatabase) -> None:
    hold, head = _first(store)
    twice = [
        store.lg_append_held(
            "t", _cp("c2", "c1"), sealer=_sealer(), holder=hold, after=head, now=T0 + 1
        )
        for _ in range(2)
    ]
    assert twice[0] is not None and twice[0] == twice[1]  # the second finds it stored
    assert _counts(raw) == (2, 2, 0)


def test_a_held_append_writes_nothing_unless_all_is_as_known(
    store: Store, raw: RawDatabase
) -> None:
    hold, head = _first(store)
    written = store.lg_append_held(
        "t", _writes("c1", "task-1"), sealer=_sealer(), holder=hold, after=head, now=T0
    )
    assert written is not None
    now_head = (written.seq, written.hash)
    before = _counts(raw)
    seal = _sealer()
    # Another head than the one stored.
    stale = store.lg_append_held("t", _cp("c2"), sealer=seal, holder=hold, after=head, now=T0)
    assert stale is None
    # The same task's writes again: its regular slot is stored (the general append decides).
    assert (
        store.lg_append_held(
            "t", _writes("c1", "task-1"), sealer=seal, holder=hold, after=now_head, now=T0
        )
        is None
    )
    # Another owner took the lease: the old fence writes nothing.
    taken = store.acquire_lease(lease_name("t"), owner="you", lease_seconds=5, now=T0 + 31)
    assert taken is not None and taken.fence == 2
    assert (
        store.lg_append_held("t", _cp("c2"), sealer=seal, holder=hold, after=now_head, now=T0)
        is None
    )
    assert _counts(raw) == before
    assert raw.query("SELECT head_seq FROM oncewire_lg_threads") == [(2,)]


def test_taking_a_lease_someone_holds_writes_nothing(store: Store, raw: RawDatabase) -> None:
    assert store.acquire_lease(lease_name("t"), owner="you", lease_seconds=5, now=T0) is not None
    hold = LeaseHold(lease_name("t"), "me", 1, T0 + 30)
    entry = store.lg_append_held(
        "t", _cp("c1"), sealer=_sealer(), holder=hold, after=None, now=T0, take_lease=True
    )
    assert entry is None and _counts(raw) == (0, 0, 0)
    assert raw.query("SELECT owner, fence FROM oncewire_leases") == [("you", 1)]
    # And a thread that exists is not started again, lease or not.
    _first_of(store, "u")
    again = store.lg_append_held(
        "u",
        _cp("c9"),
        sealer=_sealer(),
        holder=LeaseHold(lease_name("u"), "me", 1, T0 + 30),
        after=None,
        now=T0,
    )
    assert again is None and raw.query("SELECT head_seq FROM oncewire_lg_threads") == [(1,)]


def _first_of(store: Store, thread_id: str) -> tuple[LeaseHold, tuple[int, str]]:
    hold = LeaseHold(lease_name(thread_id), "me", 1, T0 + 30)
    entry = store.lg_append_held(
        thread_id, _cp("c1"), sealer=_sealer(), holder=hold, after=None, now=T0, take_lease=True
    )
    assert entry is not None
    return hold, (entry.seq, entry.hash)


def test_a_checkpoint_its_writes_and_the_head_are_read_in_one(store: Store) -> None:
    assert store.lg_read_checkpoint("t", "", None) == (None, [], None)
    hold, head = _first(store)
    second = store.lg_append_held(
        "t", _cp("c2", "c1"), sealer=_sealer(), holder=hold, after=head, now=T0
    )
    assert second is not None
    third = store.lg_append_held(
        "t", _writes("c2", "task-1"), sealer=_sealer(), holder=hold, after=(2, second.hash), now=T0
    )
    assert third is not None
    row, writes, stored = store.lg_read_checkpoint("t", "", None)
    assert row is not None and (row.checkpoint_id, row.parent_checkpoint_id, row.seq) == (
        "c2",
        "c1",
        2,
    )
    assert row.entry == second and row.checkpoint == b"cp-c2" and row.metadata == b"{}"
    assert sorted((w.checkpoint_id, w.task_id, w.idx, w.value, w.seq) for w in writes) == [
        ("c2", "task-1", -1, b"e", 3),
        ("c2", "task-1", 0, b"v0", 3),
    ]
    assert all(w.entry == third for w in writes)
    assert stored is not None and (stored.head_seq, stored.head_hash) == (3, third.hash)
    older, none, _ = store.lg_read_checkpoint("t", "", "c1")
    assert older is not None and older.checkpoint_id == "c1" and none == []
    missing, nothing, head_only = store.lg_read_checkpoint("t", "other-ns", None)
    assert (missing, nothing, head_only) == (None, [], stored)


def test_a_thread_without_a_connection_borrows_an_idle_one(store: Store) -> None:
    seen: list[Any] = []

    def job() -> None:
        with store.borrowed_connection():
            store.lg_head("t")
            seen.append(store.db.own_conn())
        seen.append(store.db.own_conn())  # given back: this thread holds none

    for _ in range(2):  # one after another, as an executor's threads made for each run
        worker = threading.Thread(target=job)
        worker.start()
        worker.join()
    assert seen[0] is not None and seen[1] is None and seen[2] is seen[0] and seen[3] is None
