"""Store verbs the dispatcher added: ``waiting_kinds`` and a settlement that gives its attempt
back (``refund_attempt``, for an attempt that sent nothing). Every backend."""

from __future__ import annotations

from oncewire.storage import Store
from oncewire.storage.records import EffectState, Settlement

from .conftest import T0, Arrange, RawDatabase


def test_waiting_kinds_counts_pending_and_uncertain_per_kind_with_the_oldest(
    store: Store, arrange: Arrange
) -> None:
    arrange.add("a1", kind="email", now=T0 + 5)
    arrange.add("a2", kind="email", now=T0 + 1)
    arrange.into("u1", EffectState.UNCERTAIN, kind="sms", now=T0 + 2)
    arrange.into("d1", EffectState.DONE, kind="sms", now=T0)  # finished: not waiting
    arrange.into("c1", EffectState.CLAIMED, kind="fax", now=T0)  # in flight: not waiting
    arrange.into("x1", EffectState.DEAD, kind="telex", now=T0)
    assert store.waiting_kinds() == {"email": (2, T0 + 1), "sms": (1, T0 + 2)}


def test_waiting_kinds_of_an_empty_store_is_empty(store: Store) -> None:
    assert store.waiting_kinds() == {}


def test_a_refunded_settlement_gives_the_attempt_back(raw: RawDatabase, arrange: Arrange) -> None:
    arrange.add("k", max_attempts=1)
    (claim,) = arrange.claim(now=T0)
    assert (claim.attempt, claim.fence) == (1, 1)
    item = Settlement(
        claim.id,
        claim.fence,
        EffectState.PENDING,
        last_error="429",
        not_before=T0 + 1,
        refund_attempt=True,
    )
    assert arrange.settle(item, now=T0) == [True]
    row = raw.effect_row("k")
    assert (row["state"], row["attempts"], row["fence"]) == ("pending", 0, 1)
    (again,) = arrange.claim(now=T0 + 1)
    assert (again.attempt, again.fence, again.redelivery) == (1, 2, False)


def test_a_refund_under_a_stale_fence_changes_nothing(raw: RawDatabase, arrange: Arrange) -> None:
    arrange.add("k")
    (claim,) = arrange.claim(now=T0)
    item = Settlement(claim.id, claim.fence + 1, EffectState.PENDING, refund_attempt=True)
    assert arrange.settle(item) == [False]
    assert raw.effect_row("k")["attempts"] == 1


def test_a_claimed_then_refunded_effect_still_counts_as_retrying(
    store: Store, arrange: Arrange
) -> None:
    # until_idle must wait for a NotSent retry although its attempt was given back.
    arrange.add("k")
    (claim,) = arrange.claim(now=T0)
    item = Settlement(
        claim.id, claim.fence, EffectState.PENDING, not_before=T0 + 60, refund_attempt=True
    )
    assert arrange.settle(item) == [True]
    backlog = store.backlog()
    assert (backlog.retrying, backlog.next_due) == (1, T0 + 60)
    assert backlog.next_retry == T0 + 60


def test_next_retry_is_the_earliest_retry_of_the_kinds_asked_about(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    """What a drain's horizon is measured against: an uncertain effect's next attempt, or a
    pending one already attempted; never an effect whose first attempt is scheduled later."""
    arrange.add("fresh", not_before=T0 + 5)  # delay_seconds: not a retry
    assert (store.backlog().next_due, store.backlog().next_retry) == (T0 + 5, None)
    arrange.into("u1", EffectState.UNCERTAIN, kind="sms")
    arrange.into("p1", EffectState.PENDING, kind="fax")
    raw.execute("UPDATE oncewire_effects SET not_before = ? WHERE key = ?", (T0 + 900, "u1"))
    raw.execute(
        "UPDATE oncewire_effects SET fence = 1, not_before = ? WHERE key = ?", (T0 + 600, "p1")
    )
    assert store.backlog().next_retry == T0 + 600
    assert store.backlog(["sms"]).next_retry == T0 + 900
    assert store.backlog(["send"]).next_retry is None
