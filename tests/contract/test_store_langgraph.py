"""Store contract: the LangGraph checkpointer's verbs, checked in the rows through a second
connection. A thread's chain grows by one entry per item, linked by hashes the caller gives;
an append whose lease fence moved writes nothing; erasures remove rows only with an entry that
names them; runs are recorded before they start and end once."""

from __future__ import annotations

import pytest

from oncewire.core.errors import ConfigurationError, ThreadLeaseLost
from oncewire.storage import Store
from oncewire.storage.langgraph import NewCheckpoint, NewWrite, lease_name
from oncewire.storage.verbs.langgraph import Erase, LeaseHold, Sealer, Writes

from .conftest import T0, RawDatabase


def _sealer(chain: str = "sha256") -> Sealer:
    return Sealer(chain, None, "g" * 64, lambda seq, kind, prev, material: f"{seq}:{prev[:8]}")


def _cp(cid: str, parent: str | None = None, run_id: str | None = None) -> NewCheckpoint:
    return NewCheckpoint("", cid, parent, "msgpack", b"cp-" + cid.encode(), "json", b"{}", run_id)


def _writes(cid: str, task: str = "task") -> Writes:
    rows = [
        NewWrite(0, "x", "msgpack", b"v0", "~__pregel_pull, a"),
        NewWrite(-1, "__error__", "msgpack", b"e", "~__pregel_pull, a"),
    ]
    return Writes("", cid, task, rows)


def test_append_chains_entries_and_moves_the_head(store: Store, raw: RawDatabase) -> None:
    done = store.lg_append("t", [_cp("c1"), _writes("c1")], sealer=_sealer(), holder=None, now=T0)
    assert done is not None and (done.from_seq, done.head.head_seq) == (0, 2)
    assert raw.query("SELECT seq, kind, prev_hash, hash FROM oncewire_lg_chain ORDER BY seq") == [
        (1, "checkpoint", "g" * 64, "1:gggggggg"),
        (2, "writes", "1:gggggggg", "2:1:gggggg"),
    ]
    assert store.lg_head("t") == done.head
    assert store.lg_thread_ids() == ["t"]
    # The same writes again: the regular slot is kept, the special one replaced (entry 3).
    again = store.lg_append("t", [_writes("c1")], sealer=_sealer(), holder=None, now=T0)
    assert again is not None and again.head.head_seq == 3
    assert raw.query("SELECT idx, seq FROM oncewire_lg_writes ORDER BY idx") == [(-1, 3), (0, 2)]
    row, writes, head = store.lg_read_checkpoint("t", "", None)
    assert row is not None
    assert (row.checkpoint_id, row.checkpoint, row.entry.seq if row.entry else None) == (
        "c1",
        b"cp-c1",
        1,
    )
    assert [(w.idx, w.seq) for w in writes] == [(-1, 3), (0, 2)] and head == again.head
    assert [e.seq for e in store.lg_chain_after("t", 1)] == [2, 3]
    head_, chain, cps, ws = store.lg_thread("t")
    assert (head_, len(chain), len(cps), len(ws)) == (again.head, 3, 1, 2)


def test_an_append_under_a_moved_fence_writes_nothing(store: Store, raw: RawDatabase) -> None:
    mine = store.acquire_lease(lease_name("t"), owner="me", lease_seconds=5, now=T0)
    assert mine is not None
    hold = LeaseHold(mine.name, "me", mine.fence, T0 + 10)
    store.lg_append("t", [_cp("c1")], sealer=_sealer(), holder=hold, now=T0)
    assert raw.query("SELECT expires_at FROM oncewire_leases")[0][0] == T0 + 10  # extended
    taken = store.acquire_lease(lease_name("t"), owner="you", lease_seconds=5, now=T0 + 11)
    assert taken is not None and taken.fence == mine.fence + 1
    before = raw.count("oncewire_lg_chain")
    with pytest.raises(ThreadLeaseLost):
        store.lg_append("t", [_cp("c2", "c1")], sealer=_sealer(), holder=hold, now=T0 + 12)
    assert raw.count("oncewire_lg_chain") == before
    assert raw.count("oncewire_lg_checkpoints") == 1


def test_append_in_tx_commits_with_the_caller(store: Store, raw: RawDatabase) -> None:
    with pytest.raises(RuntimeError), store.transaction() as tx:
        store.lg_append_in_tx(tx, "t", [_cp("c1")], sealer=_sealer(), holder=None, now=T0)
        raise RuntimeError("rolled back")
    assert raw.count("oncewire_lg_checkpoints") == 0 and raw.count("oncewire_lg_threads") == 0
    with store.transaction() as tx:
        store.lg_append_in_tx(tx, "t", [_cp("c1")], sealer=_sealer(), holder=None, now=T0)
    assert raw.count("oncewire_lg_checkpoints") == 1


def test_another_chain_algorithm_is_refused(store: Store) -> None:
    store.lg_append("t", [_cp("c1")], sealer=_sealer(), holder=None, now=T0)
    with pytest.raises(ConfigurationError):
        store.lg_append("t", [_cp("c2")], sealer=_sealer("hmac-sha256"), holder=None, now=T0)


def test_listing_erasing_and_deleting(store: Store, raw: RawDatabase) -> None:
    seal = _sealer()
    store.lg_append(
        "t",
        [_cp("c1", run_id="r1"), _cp("c2", "c1", run_id="r2"), _writes("c1")],
        sealer=seal,
        holder=None,
        now=T0,
    )
    listed = store.lg_list_checkpoints(thread_id="t", checkpoint_ns="", before=None, limit=None)
    assert [(c.checkpoint_id, len(w)) for c, w in listed] == [("c2", 0), ("c1", 2)]
    assert [
        c.checkpoint_id
        for c, _ in store.lg_list_checkpoints(
            thread_id=None, checkpoint_ns=None, before="c2", limit=1
        )
    ] == ["c1"]
    assert store.lg_checkpoints_of_runs(["r1", "nobody"]) == [("t", "", "c1")]
    assert store.lg_checkpoints_of_runs([]) == []
    assert store.lg_checkpoint_keys("t") == [("", "c2"), ("", "c1")]
    erased = store.lg_append("t", [Erase([("", "c1")], "test")], sealer=seal, holder=None, now=T0)
    assert erased is not None
    assert raw.query("SELECT kind, material FROM oncewire_lg_chain WHERE seq = 4") == [
        ("erase", '{"k":"erase","seqs":[1,3],"why":"test"}')
    ]
    assert raw.count("oncewire_lg_writes") == 0 and raw.count("oncewire_lg_checkpoints") == 1
    nothing = store.lg_append("t", [Erase([("", "c1")], "again")], sealer=seal, holder=None, now=T0)
    assert nothing is None  # nothing left to erase: no entry
    store.lg_start_run(
        "t", graph="m:g", input_type="json", input_blob=b"{}", config_json="{}", owner="me", now=T0
    )
    store.lg_delete_thread("t")
    for table in (
        "oncewire_lg_chain",
        "oncewire_lg_checkpoints",
        "oncewire_lg_threads",
        "oncewire_lg_runs",
    ):
        assert raw.count(table) == 0, table


def test_runs_are_recorded_resumed_and_ended_once(store: Store, raw: RawDatabase) -> None:
    store.lg_start_run(
        "t",
        graph=None,
        input_type="msgpack",
        input_blob=b"in",
        config_json='{"configurable":{}}',
        owner="a",
        now=T0,
    )
    assert [r.thread_id for r in store.lg_running_runs()] == ["t"]
    assert store.lg_resume_run("t", owner="b", now=T0 + 1) is True
    run = store.lg_get_run("t")
    assert run is not None and (run.owner, run.attempts, run.input) == ("b", 2, b"in")
    assert store.lg_end_run("t", owner="a", state="done", error=None, now=T0 + 2) is False
    assert store.lg_end_run("t", owner="b", state="failed", error="boom", now=T0 + 2) is True
    assert store.lg_running_runs() == [] and store.lg_resume_run("t", owner="c", now=T0) is False
    assert raw.query("SELECT state, error FROM oncewire_lg_runs") == [("failed", "boom")]
    assert store.lg_get_run("nobody") is None


def test_a_thread_page_lists_heads_counts_and_leases_by_id(store: Store) -> None:
    for thread in ("b", "a", "c"):
        store.lg_append(
            thread,
            [_cp(f"{thread}1"), _cp(f"{thread}2", parent=f"{thread}1")],
            sealer=_sealer(),
            holder=None,
            now=T0,
        )
    first = store.lg_thread_page(after="", limit=2)
    assert [s.head.thread_id for s in first] == ["a", "b"]
    assert [(s.checkpoints, s.head_checkpoint) for s in first] == [(2, "a2"), (2, "b2")]
    assert all(s.owner is None and s.fence is None for s in first)
    rest = store.lg_thread_page(after="b", limit=2)
    assert [s.head.thread_id for s in rest] == ["c"]
    assert store.lg_thread_page(after="c", limit=2) == []
