"""Store contract: the run ledger's remaining verbs (reads in and out of a transaction, leases,
hidden runs, projections, branches, checkpoints, reverts, barriers, cursors, turns), on every
backend."""

from __future__ import annotations

from dataclasses import replace

import pytest

from oncewire.core.errors import OncewireError
from oncewire.storage import Store
from oncewire.storage.runs import (
    ActionRow,
    BarrierRow,
    BranchRow,
    CheckpointRow,
    DeliveryRow,
    EventRow,
    FindingRow,
    PhaseRow,
    RunAppend,
    RunRow,
)

from .conftest import T0, RawDatabase
from .test_store_runs import _append, _run


def _started(store: Store, run_id: str, branch: str = "b", **kw: object) -> RunRow:
    row = replace(_run(run_id, branch), **kw)  # type: ignore[arg-type]
    with store.transaction() as tx:
        assert store.insert_run_in_tx(tx, row)
    return _append(store, row, f"{run_id}:start")


def test_runs_are_read_listed_and_found_by_owner_and_turn(store: Store) -> None:
    a = _started(store, "r-a", "b1", turn="t1", owner="w1")
    _started(store, "r-b", "b2", turn=None, owner="w2")
    _started(store, "r-c", "b3", scope="other", owner=None)
    with store.transaction() as tx:
        assert store.get_run_in_tx(tx, "r-a") == a
        assert store.get_run_in_tx(tx, "nope") is None
        assert [r.run_id for r in store.runs_for_turn_in_tx(tx, "s", "b1", "t1")] == ["r-a"]
        assert [r.run_id for r in store.runs_for_turn_in_tx(tx, "s", "b2", None)] == ["r-b"]
        assert store.runs_for_turn_in_tx(tx, "s", "b1", None) == []
        assert [r.run_id for r in store.branch_runs_in_tx(tx, "s", "b2")] == ["r-b"]
    assert [r.run_id for r in store.list_runs()] == ["r-a", "r-b", "r-c"]
    assert [r.run_id for r in store.list_runs(scope="other")] == ["r-c"]
    assert [r.run_id for r in store.list_runs(statuses=["done"])] == []
    assert [r.run_id for r in store.list_runs(statuses=["running"], limit=1)] == ["r-a"]
    assert [r.run_id for r in store.list_runs(after_run_id="r-a")] == ["r-b", "r-c"]
    assert store.active_run_owners() in (["w1", "w2"], ["w2", "w1"])
    expired = store.expired_runs(now=T0, limit=10, dead_owners=["w2"])
    assert [r.run_id for r in expired] == ["r-b"]


def test_a_lease_is_moved_and_runs_are_hidden_in_place(store: Store) -> None:
    _started(store, "r1")
    _started(store, "r2", "b2")
    with store.transaction() as tx:
        store.update_run_lease_in_tx(
            tx, "r1", owner="w9", fence=2, lease_expires_at=T0 + 99, now=T0 + 1
        )
        store.set_runs_hidden_in_tx(tx, {"r1": True, "r2": False})
    moved = store.get_run("r1")
    assert moved is not None
    assert (moved.owner, moved.fence, moved.lease_expires_at, moved.updated_at) == (
        "w9",
        2,
        T0 + 99,
        T0 + 1,
    )
    assert moved.hidden and moved.head_seq == 1  # the lease is not history
    assert store.get_run("r2").hidden is False  # type: ignore[union-attr]


def test_a_command_reads_its_context_in_one_call(store: Store) -> None:
    row = _started(store, "r1")
    with store.transaction() as tx:
        context = store.command_context_in_tx(tx, "r1", "r1:start")
        assert store.command_context_in_tx(tx, "nope", "k") is None
        fresh = store.command_context_in_tx(tx, "r1", "unused-key")
    assert context is not None and context.run == row
    assert context.head is not None and context.head.seq == 1 and context.head.hash == row.head_hash
    assert context.prior == context.head and context.barrier is None
    assert fresh is not None and fresh.prior is None
    assert [e.seq for e in store.run_events("r1")] == [1]
    assert store.orphan_event_runs() == []


def test_projections_are_written_with_their_event(store: Store, raw: RawDatabase) -> None:
    row = _started(store, "r1")
    phase = PhaseRow("r1", "p1", "review", "open", None, "c1", "{}", None, False, 2, None, T0, None)
    action = ActionRow(
        "r1", "a1", "p1", "shell", "{}", "d", "external", "[]", None, "proposed", None, 2, None
    )
    event = EventRow(
        0, "r1", "s", "b", 2, "review_started", "k2", "d", False, "{}", row.head_hash, "h2", T0
    )
    after = replace(row, head_seq=2, head_hash="h2")
    with store.transaction() as tx:
        store.append_run_event_in_tx(tx, RunAppend(event, after, [phase], [], [action]))
    closed = replace(phase, status="passed", verdict="pass", result_json="{}", closed_seq=3,
                     closed_at=T0 + 1)  # fmt: skip
    finding = FindingRow("r1", "f1", "p1", "c1", "minor", "{}")
    resolved = replace(action, status="succeeded", result_json="{}", resolved_seq=3)
    event = replace(event, seq=3, type="review_completed", idempotency_key="k3",
                    prev_hash="h2", hash="h3")  # fmt: skip
    with store.transaction() as tx:
        store.append_run_event_in_tx(
            tx, RunAppend(event, replace(after, head_seq=3, head_hash="h3"), [closed], [finding],
                          [resolved]),
        )  # fmt: skip
    phases, findings, actions = store.run_projections("r1")
    assert phases == [closed]
    assert [(p.status, p.verdict, p.closed_seq) for p in phases] == [("passed", "pass", 3)]
    assert findings == [finding]
    assert [(a.status, a.resolved_seq) for a in actions] == [("succeeded", 3)]
    assert raw.count("oncewire_run_events") == 3


def test_branches_checkpoints_reverts_and_cursors(store: Store, raw: RawDatabase) -> None:
    with store.transaction() as tx:
        assert store.get_branch_in_tx(tx, "s", "b") is None
        store.put_branch_in_tx(tx, BranchRow("s", "b", None, '[["b",0,null]]', T0))
    _started(store, "r1")
    _started(store, "r2", "elsewhere", scope="s2")
    with store.transaction() as tx:
        cursor = store.scope_cursor_in_tx(tx, "s")
        assert cursor >= 1 and store.max_cursor_in_tx(tx) > cursor
        assert store.scope_cursor_in_tx(tx, "empty") == 0
        checkpoint = CheckpointRow("cp1", "s", "b", cursor, '[["b",0,1]]', "r", "{}", T0)
        assert store.insert_checkpoint_in_tx(tx, checkpoint)
        assert not store.insert_checkpoint_in_tx(tx, replace(checkpoint, cursor=0))
        assert store.get_checkpoint_in_tx(tx, "cp1") == checkpoint
        assert store.get_checkpoint_in_tx(tx, "nope") is None
        store.put_branch_in_tx(tx, BranchRow("s", "b", None, '[["b",0,9]]', T0 + 1))
        store.insert_revert_in_tx(
            tx, scope="s", branch="b", checkpoint_id="cp1", hidden_after=cursor,
            hidden_upto=cursor + 1, abandoned=["r1"], now=T0,
        )  # fmt: skip
        view = store.get_branch_in_tx(tx, "s", "b")
    assert view is not None and view.view_json == '[["b",0,9]]' and view.created_at == T0
    assert store.get_branch("s", "b") == view and store.get_branch("s", "nope") is None
    assert raw.count("oncewire_run_reverts") == 1
    latest = store.latest_event_in_view("s", [("b", 0, None)], None)
    assert latest is not None and latest.run_id == "r1"
    assert store.latest_event_in_view("s", [("b", cursor, None)], None) is None
    assert store.latest_event_in_view("s", [("b", 0, None)], 0) is None


def test_one_barrier_is_held_per_scope_and_it_holds_appends(store: Store) -> None:
    row = _started(store, "r1")
    held = BarrierRow("s", "op-1", "b", "reverting", T0, T0)
    with store.transaction() as tx:
        assert store.held_barrier_in_tx(tx, "s") is None
        assert store.get_barrier_in_tx(tx, "s", "op-1") is None
        store.put_barrier_in_tx(tx, held)
        assert store.held_barrier_in_tx(tx, "s") == held
    with pytest.raises(OncewireError), store.transaction() as tx:  # one held per scope
        store.put_barrier_in_tx(tx, replace(held, operation_id="op-2"))
    with pytest.raises(OncewireError):  # a new command while it is held
        _append(store, row, "blocked")
    with store.transaction() as tx:
        context = store.command_context_in_tx(tx, "r1", "k")
        assert context is not None and context.barrier == held
        store.put_barrier_in_tx(tx, replace(held, state="resolved", updated_at=T0 + 1))
        assert store.get_barrier_in_tx(tx, "s", "op-1").state == "resolved"  # type: ignore[union-attr]
        assert store.held_barrier_in_tx(tx, "s") is None
    _append(store, row, "admitted")


def test_a_delivery_is_read_in_a_transaction(store: Store) -> None:
    row = DeliveryRow(
        "d1", "key-1", "digest", "s", "b", None, None, "hi", "sha", "{}", "msha",
        "candidate", "committed", None, None, None, T0, None,
    )  # fmt: skip
    with store.transaction() as tx:
        store.insert_delivery_in_tx(tx, row)
        assert store.get_delivery_in_tx(tx, "d1") == row
        assert store.get_delivery_in_tx(tx, "nope") is None
