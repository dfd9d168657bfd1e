"""Store contract: a dispatcher step and a backlog limited to the keys given.

An inline dispatcher of durable agent runs can perform only the calls its own process holds;
it names their keys, and every other effect of its kind stays as it is (not claimed, not
charged, not counted in its backlog) for the process that holds it. Every backend.
"""

from __future__ import annotations

import pytest

from oncewire.storage import Store
from oncewire.storage.records import EffectState

from .conftest import T0, Arrange, RawDatabase


@pytest.mark.parametrize("suspects", [False, True], ids=["together", "looking"])
def test_a_step_limited_to_keys_claims_only_those(
    store: Store, raw: RawDatabase, arrange: Arrange, suspects: bool
) -> None:
    for key in ("mine-1", "theirs", "mine-2", "other-kind"):
        arrange.add(key, kind="other" if key == "other-kind" else "agents.tool")
    step = store.dispatch_step(
        [],
        owner="w1",
        now=T0,
        lease_seconds=30.0,
        limit=10,
        kinds=["agents.tool"],
        keys=["mine-1", "mine-2", "other-kind"],
        mark=10,
        suspects=suspects,
    )
    assert sorted(claim.key for claim in step.claims) == ["mine-1", "mine-2"]
    assert raw.effect_row("theirs")["state"] == "pending"
    assert (raw.effect_row("theirs")["attempts"], raw.effect_row("theirs")["fence"]) == (0, 0)
    assert raw.effect_row("other-kind")["state"] == "pending"


def test_an_empty_key_list_claims_nothing_and_none_claims_any(
    store: Store, arrange: Arrange
) -> None:
    arrange.add("a")
    arrange.add("b")
    nothing = store.dispatch_step([], owner="w1", now=T0, lease_seconds=30.0, limit=5, keys=[])
    assert nothing.claims == []
    anything = store.dispatch_step([], owner="w1", now=T0, lease_seconds=30.0, limit=5)
    assert sorted(claim.key for claim in anything.claims) == ["a", "b"]


def test_a_suspect_of_another_key_is_not_claimed(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    arrange.add("suspect")
    arrange.add("mine")
    raw.execute("UPDATE oncewire_effects SET recoveries = 1 WHERE key = ?", ("suspect",))
    step = store.dispatch_step(
        [], owner="w1", now=T0, lease_seconds=30.0, limit=5, keys=["mine"], suspects=True
    )
    assert [claim.key for claim in step.claims] == ["mine"]
    assert raw.effect_row("suspect")["state"] == "pending"
    alone = store.dispatch_step(
        [], owner="w1", now=T0, lease_seconds=30.0, limit=5, keys=["suspect"], suspects=True
    )
    assert [(claim.key, claim.started) for claim in alone.claims] == [("suspect", True)]


def test_a_backlog_limited_to_keys_counts_only_those(store: Store, arrange: Arrange) -> None:
    arrange.add("mine", not_before=T0 + 30)
    arrange.add("theirs", not_before=T0 + 1)
    arrange.into("uncertain", EffectState.UNCERTAIN)
    arrange.into("claimed", EffectState.CLAIMED)
    mine = store.backlog(keys=["mine", "claimed"])
    assert (mine.next_due, mine.uncertain, mine.claimed) == (T0 + 30, 0, 1)
    assert store.backlog(keys=[]).next_due is None
    everything = store.backlog()
    assert (everything.next_due, everything.uncertain, everything.claimed) == (T0 + 1, 1, 1)
