"""Store contract: the run ledger's verbs and the invariants the schema must hold."""

from __future__ import annotations

from dataclasses import replace

import pytest

from oncewire.core.errors import OncewireError
from oncewire.storage import Store
from oncewire.storage.runs import DeliveryRow, EventRow, ReportRow, RunAppend, RunRow

from .conftest import T0, RawDatabase


def _run(run_id: str, branch: str = "b", lease: float | None = T0 + 30) -> RunRow:
    return RunRow(
        run_id=run_id,
        scope="s",
        branch=branch,
        turn=None,
        workflow="review",
        chain="sha256",
        status="new",
        terminal_reason=None,
        state_json="{}",
        head_seq=0,
        head_hash=f"genesis-{run_id}",
        owner="w",
        fence=1,
        lease_expires_at=lease,
        created_at=T0,
        updated_at=T0,
        finished_at=None,
        abandoned_at=None,
        abandon_reason=None,
        hidden=False,
    )


def _append(store: Store, row: RunRow, key: str, *, terminal: bool = False) -> RunRow:
    seq = row.head_seq + 1
    event = EventRow(
        0, row.run_id, row.scope, row.branch, seq, "run_terminated" if terminal else "e",
        key, "d", terminal, "{}", row.head_hash, f"h{seq}-{row.run_id}", T0,
    )  # fmt: skip
    after = replace(
        row,
        head_seq=seq,
        head_hash=event.hash,
        status="done" if terminal else "running",
        terminal_reason="r" if terminal else None,
        finished_at=T0 if terminal else None,
    )
    with store.transaction() as tx:
        stored = store.append_run_event_in_tx(tx, RunAppend(event, after))
    assert stored.id > 0
    return after


def test_one_active_run_per_branch_and_one_row_per_id(store: Store) -> None:
    with store.transaction() as tx:
        assert store.insert_run_in_tx(tx, _run("r1"))
        assert not store.insert_run_in_tx(tx, _run("r1", branch="other"))
        assert not store.insert_run_in_tx(tx, _run("r2"))
        assert store.insert_run_in_tx(tx, _run("r3", branch="other"))
        busy = store.active_run_on_branch_in_tx(tx, "s", "b")
    assert busy is not None and busy.run_id == "r1"


def test_the_chain_grows_only_at_its_head_and_ends_once(store: Store, raw: RawDatabase) -> None:
    with store.transaction() as tx:
        store.insert_run_in_tx(tx, _run("r1"))
    row = _append(store, _run("r1"), "k1")
    with pytest.raises(OncewireError):  # prev_hash is not the head's hash
        _append(store, replace(row, head_hash="forged"), "k2")
    row = _append(store, row, "k2", terminal=True)
    with pytest.raises(OncewireError):  # a second terminal
        _append(store, replace(row, finished_at=None), "k3", terminal=True)
    assert [r[1] for r in store.run_chain("r1")] == [1, 2]
    with store.transaction() as tx:
        found = store.event_by_key_in_tx(tx, "r1", "k2")
        assert found is not None and found.terminal and found.seq == 2
        head = store.event_at_in_tx(tx, "r1", 2)
    assert head == found
    with pytest.raises(raw.integrity_errors):
        raw.execute("UPDATE oncewire_run_events SET payload = ? WHERE seq = ?", ("{}", 1))
    with pytest.raises(raw.integrity_errors):
        raw.execute("DELETE FROM oncewire_run_events WHERE seq = ?", (1,))


def test_expired_runs_and_abandonment(store: Store) -> None:
    with store.transaction() as tx:
        store.insert_run_in_tx(tx, _run("live", branch="b1", lease=T0 + 100))
        store.insert_run_in_tx(tx, _run("dead", branch="b2", lease=T0 + 1))
    assert [r.run_id for r in store.expired_runs(now=T0 + 10, limit=10)] == ["dead"]
    with store.transaction() as tx:
        assert store.abandon_run_in_tx(tx, "dead", reason="x", now=T0 + 10)
        assert not store.abandon_run_in_tx(tx, "dead", reason="x", now=T0 + 11)
    assert store.expired_runs(now=T0 + 10, limit=10) == []
    dead = store.get_run("dead")
    assert dead is not None and dead.abandoned_at == T0 + 10 and not dead.active


def test_a_delivery_is_committed_once_and_settled_once_without_its_bytes(
    store: Store, raw: RawDatabase
) -> None:
    row = DeliveryRow(
        "d1", "key-1", "digest", "s", "b", "t", None, "hello", "sha", "{}", "msha",
        "candidate", "committed", None, "w", T0 + 30, T0, None,
    )  # fmt: skip
    with store.transaction() as tx:
        assert store.insert_delivery_in_tx(tx, row).delivery_id == "d1"
        again = store.insert_delivery_in_tx(tx, replace(row, delivery_id="d2"))
    assert again.delivery_id == "d1"
    assert [d.delivery_id for d in store.committed_deliveries(now=T0 + 31, limit=5)] == ["d1"]
    assert store.committed_deliveries(now=T0 + 1, limit=5) == []
    with store.transaction() as tx:
        assert store.settle_delivery_in_tx(
            tx, "d1", review_status="review_unavailable", recovery_json="{}", published_at=T0 + 40
        )
        assert not store.settle_delivery_in_tx(
            tx, "d1", review_status="verified", recovery_json=None, published_at=T0 + 50
        )
    settled = store.get_delivery("d1")
    assert settled is not None
    assert (settled.status, settled.review_status, settled.published_at) == (
        "published",
        "review_unavailable",
        T0 + 40,
    )
    with pytest.raises(raw.integrity_errors):
        raw.execute(
            "UPDATE oncewire_run_deliveries SET content = ? WHERE delivery_id = ?", ("x", "d1")
        )


def test_reports_are_listed_newest_first(store: Store) -> None:
    with store.transaction() as tx:
        for i in range(3):
            store.insert_report_in_tx(
                tx,
                ReportRow(0, "p", "run", f"r{i}", f"r{i}", "o", "terminal", None, None, None, T0),
            )
    assert [r.subject_id for r in store.list_reports(limit=2)] == ["r2", "r1"]
    assert [r.subject_id for r in store.list_reports(subject_id="r0")] == ["r0"]
