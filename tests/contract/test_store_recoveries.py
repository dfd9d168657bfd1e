"""Store contract: a released claim counts only if its sink was recorded as starting.

A dispatcher records a claim as starting (``started_fence``) before it calls the claim's sink,
in the claim itself or in a later ``dispatch_step``. A release (owner dead, lease expired) then
tells a claim whose sink may have run (uncertain, a redelivery next, one more recovery, bounded
by ``max_recoveries``) from one whose sink never ran (given back as it was: no attempt, no
redelivery flag). Every state is read back from the store's rows.
"""

from __future__ import annotations

from oncewire.storage import Store
from oncewire.storage.records import EffectState, Settlement

from .conftest import T0, Arrange, RawDatabase

S = EffectState


def _step(store: Store, **kw: object) -> object:
    args: dict[str, object] = {"owner": "w1", "now": T0, "lease_seconds": 30.0, "limit": 0}
    args.update(kw)
    return store.dispatch_step([], **args)  # type: ignore[arg-type]


def test_a_claim_records_only_its_first_mark_claims_as_starting(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    for key in ("a", "b", "c"):
        arrange.add(key)
    step = store.dispatch_step([], owner="w1", now=T0, lease_seconds=30.0, limit=3, mark=1)
    assert [(c.key, c.started) for c in step.claims] == [("a", True), ("b", False), ("c", False)]
    assert [raw.effect_row(k)["started_fence"] for k in ("a", "b", "c")] == [1, 0, 0]
    assert all(raw.effect_row(k)["fence"] == 1 for k in ("a", "b", "c"))


def test_a_dead_owners_unstarted_claims_go_back_uncharged_and_unflagged(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    for key in ("a", "b", "c"):
        arrange.add(key)
    store.dispatch_step([], owner="w1", now=T0, lease_seconds=600.0, limit=3, mark=1)
    assert store.release_claims(now=T0 + 1, dead_owners=["w1"]) == 3
    started = raw.effect_row("a")
    assert (started["state"], started["maybe_sent"], started["attempts"]) == ("uncertain", 1, 0)
    assert started["recoveries"] == 1
    assert started["last_error"] == "owner w1 died during attempt 1"
    for key in ("b", "c"):
        row = raw.effect_row(key)
        assert (row["state"], row["maybe_sent"], row["attempts"], row["recoveries"]) == (
            "pending",
            0,
            0,
            0,
        )
        assert row["last_error"] == (
            "the claim of w1 was released before its sink was called; not an attempt"
        )
        (history,) = store.list_attempts(row["id"])
        assert (history.outcome, history.redelivery, history.state) == (
            "not_started",
            False,
            S.PENDING,
        )
    (died,) = store.list_attempts(started["id"])
    assert (died.outcome, died.state) == ("owner_died", S.UNCERTAIN)


def test_an_unstarted_claim_of_an_uncertain_effect_stays_uncertain(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    arrange.into("k", S.UNCERTAIN, now=T0 - 100)  # an earlier attempt may have landed
    before = raw.effect_row("k")
    step = store.dispatch_step(
        [], owner="w1", now=T0, lease_seconds=10.0, limit=1, mark=0, kinds=["arranged.k"]
    )
    (claim,) = step.claims
    assert (claim.started, claim.redelivery) == (False, True)
    assert store.release_claims(now=T0 + 11) == 1
    row = raw.effect_row("k")
    assert (row["state"], row["maybe_sent"], row["recoveries"]) == ("uncertain", 1, 0)
    assert row["attempts"] == before["attempts"]  # the claim's charge given back


def test_dispatch_step_records_held_claims_as_starting_unless_they_were_released(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    for key in ("a", "b"):
        arrange.add(key)
    first = store.dispatch_step([], owner="w1", now=T0, lease_seconds=10.0, limit=2, mark=0)
    a, b = first.claims
    # b's lease runs out and another worker takes it; a is still w1's.
    assert store.release_claims(now=T0 + 11) == 2
    a_again, b_again = arrange.claim(owner="w2", now=T0 + 11, lease_seconds=100.0)
    assert not a_again.redelivery and not b_again.redelivery  # nothing was ever sent
    step = store.dispatch_step(
        [], owner="w1", now=T0 + 12, lease_seconds=10.0, limit=0, starting=[(a.id, a.fence)]
    )
    assert step.started == set()  # fenced: w1 must not call a's sink
    step = store.dispatch_step(
        [], owner="w2", now=T0 + 12, lease_seconds=10.0, limit=0, starting=[(b.id, b_again.fence)]
    )
    assert step.started == {b.id}
    assert raw.effect_row("b")["started_fence"] == b_again.fence


def test_an_effect_an_owner_died_on_is_claimed_alone_first(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    arrange.add("suspect")
    arrange.add("y", not_before=T0 + 1)
    arrange.add("z", not_before=T0 + 1)
    first = store.dispatch_step([], owner="w2", now=T0 + 5, lease_seconds=600.0, limit=2, mark=1)
    assert [(c.key, c.started) for c in first.claims] == [("suspect", True), ("y", False)]
    suspect = first.claims[0]
    # w2 dies while the suspect's sink runs; y's never ran.
    assert store.release_claims(now=T0 + 6, dead_owners=["w2"]) == 2
    assert raw.effect_row("y")["state"] == "pending"
    step = store.dispatch_step([], owner="w3", now=T0 + 6, lease_seconds=30.0, limit=10, mark=0)
    assert [(c.key, c.started, c.recoveries, c.redelivery) for c in step.claims] == [
        ("suspect", True, 1, True)
    ]
    assert suspect.fence < step.claims[0].fence
    # Once it is settled, everything else is claimed as usual.
    done = Settlement(step.claims[0].id, step.claims[0].fence, S.DONE, result_json="1")
    after = store.dispatch_step(
        [done], owner="w3", now=T0 + 7, lease_seconds=30.0, limit=10, mark=10
    )
    assert after.applied == [True]
    assert sorted(c.key for c in after.claims) == ["y", "z"]


def test_a_batch_never_takes_an_effect_an_owner_died_on(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    """A dispatcher that does not look for suspects in a step (it looks at least once a
    second, and whenever it finds nothing else) claims the rest and leaves the suspect alone,
    even when the suspect is due first."""
    arrange.add("suspect")
    arrange.add("y", not_before=T0 + 1)
    first = store.dispatch_step([], owner="w2", now=T0 + 5, lease_seconds=600.0, limit=1, mark=1)
    assert [c.key for c in first.claims] == ["suspect"]
    assert store.release_claims(now=T0 + 6, dead_owners=["w2"]) == 1  # it died in the sink
    arrange.add("z", not_before=T0 + 2)
    step = store.dispatch_step(
        [], owner="w3", now=T0 + 6, lease_seconds=30.0, limit=10, mark=10, suspects=False
    )
    assert sorted(c.key for c in step.claims) == ["y", "z"]
    assert raw.effect_row("suspect")["state"] == "uncertain"
    alone = store.dispatch_step([], owner="w3", now=T0 + 6, lease_seconds=30.0, limit=10)
    assert [(c.key, c.recoveries) for c in alone.claims] == [("suspect", 1)]


def test_an_operators_retry_gives_the_recoveries_back(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    arrange.add("k")
    arrange.claim(owner="w1", now=T0, lease_seconds=600.0)
    assert store.release_claims(now=T0 + 1, dead_owners=["w1"], max_recoveries=1) == 1
    dead = arrange.get("k")
    assert (dead.state, dead.recoveries) == (S.DEAD, 1)
    assert dead.as_dict()["recoveries"] == 1
    retried = store.retry_effect("k", now=T0 + 2)
    assert (retried.state, retried.recoveries, retried.attempts) == (S.PENDING, 0, 0)
    assert raw.effect_row("k")["recoveries"] == 0


def test_cancelling_a_claim_whose_sink_never_started_does_not_flag_it(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    arrange.add("running")  # first in line: the claim records it as starting
    arrange.add("held")
    store.dispatch_step([], owner="w1", now=T0, lease_seconds=30.0, limit=2, mark=1)
    store.cancel_effect("held", now=T0 + 1, reason="not wanted")
    store.cancel_effect("running", now=T0 + 1, reason="not wanted")
    held, running = raw.effect_row("held"), raw.effect_row("running")
    assert (held["state"], held["maybe_sent"]) == ("cancelled", 0)
    assert store.list_attempts(held["id"]) == []
    assert (running["state"], running["maybe_sent"]) == ("cancelled", 1)
    assert running["last_error"].endswith("it may have landed)")
