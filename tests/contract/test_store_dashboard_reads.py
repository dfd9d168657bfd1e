"""Store contract: the readers the dashboard (``oncewire ui``) draws from, on every backend.

``recent_attempts`` reads every effect's attempt history from a time on; ``list_branches`` and
``list_checkpoints`` read a scope's forks and checkpoints. Each is compared with the rows read
around the store (``raw``), so a reader cannot return rows that are not there or miss some.
"""

from __future__ import annotations

from oncewire.storage import Store
from oncewire.storage.records import EffectState, Settlement
from oncewire.storage.runs import BranchRow, CheckpointRow

from .conftest import T0, Arrange, RawDatabase


def _settle_one(arrange: Arrange, key: str, outcome: str, finished_at: float) -> None:
    arrange.add(key, kind=f"k.{key}")
    (claim,) = arrange.claim(kinds=[f"k.{key}"], now=finished_at - 1)
    state = EffectState.DONE if outcome == "done" else EffectState.UNCERTAIN
    settlement = Settlement(
        claim.id,
        claim.fence,
        state,
        result_json='{"ok":true}' if outcome == "done" else None,
        maybe_sent=outcome != "done",
        attempt=claim.attempt,
        redelivery=claim.redelivery,
        outcome=outcome,
        started_at=finished_at - 0.5,
        finished_at=finished_at,
    )
    assert arrange.settle(settlement, now=finished_at) == [True]


def test_recent_attempts_reads_every_effect_from_a_time_on(
    store: Store, arrange: Arrange, raw: RawDatabase
) -> None:
    _settle_one(arrange, "old", "done", T0 + 10)
    _settle_one(arrange, "mid", "maybe_sent", T0 + 20)
    _settle_one(arrange, "new", "done", T0 + 30)

    recent = store.recent_attempts(since=T0 + 15)
    assert [(a.outcome, a.finished_at) for a in recent] == [
        ("maybe_sent", T0 + 20),
        ("done", T0 + 30),
    ]
    stored = raw.query(
        "SELECT effect_id, fence, outcome FROM oncewire_attempts WHERE finished_at >= ? "
        "ORDER BY finished_at",
        (T0 + 15,),
    )
    assert [(a.effect_id, a.fence, a.outcome) for a in recent] == [tuple(r) for r in stored]
    assert len(store.recent_attempts(since=T0)) == 3 == raw.count("oncewire_attempts")
    assert [a.finished_at for a in store.recent_attempts(since=T0, limit=2)] == [
        T0 + 10,
        T0 + 20,
    ]
    assert store.recent_attempts(since=T0 + 31) == []


def test_branches_and_checkpoints_are_listed_per_scope(store: Store, raw: RawDatabase) -> None:
    main = BranchRow("s", "main", None, '[["main",0,null]]', T0)
    fork = BranchRow("s", "try", "main", '[["main",0,3],["try",3,null]]', T0 + 1)
    other = BranchRow("s2", "main", None, '[["main",0,null]]', T0)
    late = CheckpointRow("cp2", "s", "try", 7, '[["try",3,7]]', "after", "{}", T0 + 2)
    early = CheckpointRow("cp1", "s", "main", 3, '[["main",0,3]]', "before", '{"n":1}', T0)
    elsewhere = CheckpointRow("cp3", "s2", "main", 1, '[["main",0,1]]', "x", "{}", T0)
    with store.transaction() as tx:
        for branch in (fork, main, other):
            store.put_branch_in_tx(tx, branch)
        for checkpoint in (late, early, elsewhere):
            assert store.insert_checkpoint_in_tx(tx, checkpoint)

    assert store.list_branches("s") == [main, fork]
    assert store.list_checkpoints("s") == [early, late]
    assert store.list_checkpoints("s", limit=1) == [early]
    assert store.list_branches("nope") == [] and store.list_checkpoints("nope") == []
    assert raw.query(
        "SELECT branch, parent FROM oncewire_run_branches WHERE scope = ? ORDER BY created_at",
        ("s",),
    ) == [("main", None), ("try", "main")]
    assert raw.count("oncewire_run_checkpoints") == 3
