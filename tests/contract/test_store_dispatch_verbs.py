"""Store verbs the dispatcher added: ``waiting_kinds``, a settlement that gives its attempt
back (``refund_attempt``, for an attempt that sent nothing), and claims and a backlog limited
to some keys (``keys``, for a dispatcher that may perform only some of a kind's effects: the
MCP proxy). Every backend."""

from __future__ import annotations

from oncewire.storage import Store
from oncewire.storage.records import EffectState, Settlement
from tests.support.claims import settle_and_claim

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


def test_the_keys_filter_claims_only_the_keys_given_and_of_the_kinds_given(
    store: Store, arrange: Arrange
) -> None:
    for key in ("a", "b", "c"):
        arrange.add(key, kind="mail")
    arrange.add("d", kind="sms")

    def claimed(**kw: object) -> list[str]:
        _, claims = settle_and_claim(
            store,
            [],
            owner="w1",
            now=T0,
            lease_seconds=30.0,
            limit=10,
            **kw,  # type: ignore[arg-type]
        )
        return sorted(c.key for c in claims)

    assert claimed(keys=[]) == []
    assert claimed(keys=["d"], kinds=["mail"]) == []  # both filters hold
    assert claimed(keys=["a", "c", "nowhere"], kinds=["mail", "sms"]) == ["a", "c"]
    assert claimed(keys=["a", "b"]) == ["b"]  # a is claimed already
    assert claimed() == ["d"]


def test_the_keys_filter_holds_for_a_suspect_and_for_a_step_sent_together(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    for key in ("s1", "s2"):  # claimed as starting by an owner that then died: suspects
        arrange.add(key)
    store.dispatch_step([], owner="gone", now=T0, lease_seconds=30.0, limit=2, mark=2)
    assert store.release_claims(now=T0 + 1, dead_owners=["gone"]) == 2
    assert raw.effect_row("s1")["recoveries"] == raw.effect_row("s2")["recoveries"] == 1
    arrange.add("p1")
    arrange.add("p2")

    step = store.dispatch_step(
        [], owner="w1", now=T0 + 2, lease_seconds=30.0, limit=5, mark=5, keys=["s2", "p2"]
    )
    assert [c.key for c in step.claims] == ["s2"]  # a suspect due is claimed alone
    together = store.dispatch_step(
        [], owner="w1", now=T0 + 2, lease_seconds=30.0, limit=5, suspects=False, keys=["p2", "s1"]
    )
    assert [c.key for c in together.claims] == ["p2"]  # no suspect in a step sent together
    assert [raw.effect_row(k)["state"] for k in ("s1", "p1")] == ["uncertain", "pending"]


def test_the_backlog_of_some_keys(store: Store, arrange: Arrange) -> None:
    arrange.add("mine", kind="mail", not_before=T0 + 30)
    arrange.add("theirs", kind="mail", not_before=T0 + 10)
    arrange.into("busy", EffectState.CLAIMED, kind="mail")
    assert store.backlog(["mail"]).next_due == T0 + 10
    mine = store.backlog(["mail"], ["mine", "busy"])
    assert (mine.next_due, mine.claimed, mine.uncertain) == (T0 + 30, 1, 0)
    assert store.backlog(["mail"], []).next_due is None
    assert store.backlog(None, ["theirs"]).next_due == T0 + 10
