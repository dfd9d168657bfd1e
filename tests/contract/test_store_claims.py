"""Store contract: claims, leases, fences, settlement, release, deadlines, cancel and retry."""

from __future__ import annotations

import threading
import time

import pytest

from oncewire.core.errors import EffectNotFound, InvalidState
from oncewire.storage import Store
from oncewire.storage.records import EffectState, Settlement
from tests.support.claims import settle_and_claim

from .conftest import T0, Arrange, RawDatabase

S = EffectState

# -- claiming --------------------------------------------------------------------------------


def test_a_claim_bumps_fence_and_attempts_and_leases_to_the_owner(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    arrange.add("k", kind="mail", payload_json='{"to":"a"}', max_attempts=3, deadline=T0 + 500)
    (claim,) = arrange.claim(owner="w1", now=T0 + 1, lease_seconds=30.0)
    assert (claim.key, claim.kind, claim.payload_json) == ("k", "mail", '{"to":"a"}')
    assert (claim.attempt, claim.max_attempts, claim.fence) == (1, 3, 1)
    assert claim.redelivery is False
    assert claim.deadline == T0 + 500
    assert claim.lease_expires_at == T0 + 31
    effect = arrange.get("k")
    assert effect.state is S.CLAIMED
    assert (effect.attempts, effect.fence) == (1, 1)
    assert (effect.lease_owner, effect.lease_expires_at) == ("w1", T0 + 31)
    assert effect.updated_at == T0 + 1
    row = raw.effect_row("k")
    assert (row["state"], row["lease_owner"], row["fence"]) == ("claimed", "w1", 1)


def test_a_claimed_effect_is_not_claimed_again(arrange: Arrange) -> None:
    arrange.add("k")
    assert [c.key for c in arrange.claim(owner="w1")] == ["k"]
    assert arrange.claim(owner="w2") == []
    assert arrange.claim(owner="w1") == []


def test_due_effects_are_claimed_by_not_before_then_id(arrange: Arrange) -> None:
    arrange.add("late", not_before=T0 + 2)
    arrange.add("mid-first", not_before=T0 + 1)
    arrange.add("mid-second", not_before=T0 + 1)
    arrange.add("early", not_before=T0)
    order = [arrange.claim(now=T0 + 10, limit=1)[0].key for _ in range(4)]
    assert order == ["early", "mid-first", "mid-second", "late"]


def test_a_batch_respects_the_limit_and_comes_back_in_id_order(arrange: Arrange) -> None:
    for i, delay in enumerate([3, 1, 2, 0, 4]):
        arrange.add(f"k{i}", not_before=T0 + delay)
    claims = arrange.claim(now=T0 + 10, limit=3)
    assert [c.key for c in claims] == ["k1", "k2", "k3"]  # the three earliest, by id
    assert arrange.claim(now=T0 + 10, limit=0) == []


def test_effects_not_yet_due_are_not_claimed(arrange: Arrange) -> None:
    arrange.add("k", not_before=T0 + 10)
    assert arrange.claim(now=T0 + 9.5) == []
    assert [c.key for c in arrange.claim(now=T0 + 10)] == ["k"]


def test_past_deadline_effects_are_not_claimed(arrange: Arrange) -> None:
    arrange.add("expired", deadline=T0 + 5)
    arrange.add("in-time", deadline=T0 + 50)
    arrange.add("no-deadline")
    assert sorted(c.key for c in arrange.claim(now=T0 + 6)) == ["in-time", "no-deadline"]
    assert arrange.get("expired").state is S.PENDING  # expire_deadlines moves it, not a claim


def test_terminal_effects_are_never_claimed(arrange: Arrange) -> None:
    for state in (S.DONE, S.REJECTED, S.DEAD, S.CANCELLED):
        arrange.into(f"k-{state}", state, kind="send")
    assert arrange.claim(now=T0 + 1000) == []


def test_the_kinds_filter(arrange: Arrange) -> None:
    arrange.add("m", kind="mail")
    arrange.add("c", kind="charge")
    arrange.add("s", kind="sms")
    assert arrange.claim(kinds=[]) == []
    assert sorted(c.key for c in arrange.claim(kinds=["mail", "sms"])) == ["m", "s"]
    assert [c.key for c in arrange.claim(kinds=None)] == ["c"]


def test_an_uncertain_effect_is_claimed_as_a_redelivery(arrange: Arrange) -> None:
    arrange.into("k", S.UNCERTAIN)
    (claim,) = arrange.claim(now=T0 + 60, kinds=None)
    assert claim.redelivery is True
    assert (claim.attempt, claim.fence) == (2, 2)


# -- settling --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settlement", "expected"),
    [
        (
            {"state": S.DONE, "result_json": '{"id":7}'},
            {"state": "done", "result": '{"id":7}', "last_error": None, "maybe_sent": 0},
        ),
        (
            {"state": S.REJECTED, "last_error": "declined"},
            {"state": "rejected", "result": None, "last_error": "declined", "maybe_sent": 0},
        ),
        (
            {"state": S.PENDING, "last_error": "503", "not_before": T0 + 40},
            {"state": "pending", "not_before": T0 + 40, "last_error": "503", "maybe_sent": 0},
        ),
        (
            {
                "state": S.UNCERTAIN,
                "last_error": "timeout",
                "not_before": T0 + 9,
                "maybe_sent": True,
            },
            {"state": "uncertain", "not_before": T0 + 9, "maybe_sent": 1},
        ),
        (
            {"state": S.DEAD, "last_error": "out of attempts", "maybe_sent": True},
            {"state": "dead", "last_error": "out of attempts", "maybe_sent": 1},
        ),
    ],
    ids=["done", "rejected", "pending", "uncertain", "dead"],
)
def test_a_settlement_under_the_current_fence_is_applied(
    raw: RawDatabase, arrange: Arrange, settlement: dict[str, object], expected: dict[str, object]
) -> None:
    arrange.add("k")
    (claim,) = arrange.claim(now=T0)
    assert arrange.settle(Settlement(claim.id, claim.fence, **settlement), now=T0 + 3) == [True]  # type: ignore[arg-type]
    row = raw.effect_row("k")
    for column, value in expected.items():
        assert row[column] == value, column
    assert (row["lease_owner"], row["lease_expires_at"]) == (None, None)
    assert (row["fence"], row["attempts"], row["updated_at"]) == (1, 1, T0 + 3)


def test_a_settlement_without_not_before_keeps_the_old_one(arrange: Arrange) -> None:
    arrange.add("k", not_before=T0 - 5)
    (claim,) = arrange.claim(now=T0)
    arrange.settle(Settlement(claim.id, claim.fence, S.PENDING, last_error="x"))
    assert arrange.get("k").not_before == T0 - 5


def test_a_stale_fence_is_refused_and_changes_nothing(raw: RawDatabase, arrange: Arrange) -> None:
    arrange.add("k")
    (old,) = arrange.claim(owner="w1", now=T0, lease_seconds=10)
    arrange.store.release_claims(now=T0 + 11)  # w1's lease ran out
    (new,) = arrange.claim(owner="w2", now=T0 + 12)
    assert new.fence == old.fence + 1
    before = raw.effect_row("k")
    stale = Settlement(old.id, old.fence, S.DONE, result_json='{"by":"w1"}')
    assert arrange.settle(stale, now=T0 + 13) == [False]
    assert raw.effect_row("k") == before
    assert arrange.settle(Settlement(new.id, new.fence, S.DONE, '{"by":"w2"}')) == [True]
    assert arrange.get("k").result == {"by": "w2"}


def test_a_settlement_for_an_effect_no_longer_claimed_is_refused(
    raw: RawDatabase, arrange: Arrange
) -> None:
    arrange.add("k")
    (claim,) = arrange.claim(now=T0, lease_seconds=10)
    arrange.store.release_claims(now=T0 + 11)  # same fence, but no longer claimed
    before = raw.effect_row("k")
    assert arrange.settle(Settlement(claim.id, claim.fence, S.DONE, "1")) == [False]
    assert raw.effect_row("k") == before
    assert before["state"] == "uncertain"


def test_each_settlement_in_a_batch_is_judged_alone(arrange: Arrange) -> None:
    arrange.add("a")
    arrange.add("b")
    claims = {c.key: c for c in arrange.claim(now=T0)}
    applied = arrange.settle(
        Settlement(claims["a"].id, claims["a"].fence + 7, S.DONE, "1"),
        Settlement(claims["b"].id, claims["b"].fence, S.DONE, "2"),
    )
    assert applied == [False, True]
    assert arrange.get("a").state is S.CLAIMED
    assert arrange.get("b").state is S.DONE


def test_settlements_are_applied_before_the_claim_in_the_same_call(
    store: Store, arrange: Arrange
) -> None:
    arrange.add("k")
    (first,) = arrange.claim(now=T0)
    retry_now = Settlement(first.id, first.fence, S.PENDING, last_error="503", not_before=T0 + 1)
    applied, claims = settle_and_claim(
        store, [retry_now], owner="w1", now=T0 + 1, lease_seconds=30, limit=5
    )
    assert applied == [True]
    assert [(c.key, c.attempt, c.fence, c.redelivery) for c in claims] == [("k", 2, 2, False)]


def test_maybe_sent_is_sticky_across_later_settlements(arrange: Arrange) -> None:
    arrange.add("k")
    (c1,) = arrange.claim(now=T0)
    arrange.settle(Settlement(c1.id, c1.fence, S.UNCERTAIN, None, "timeout", T0, maybe_sent=True))
    (c2,) = arrange.claim(now=T0)
    assert c2.redelivery is True
    arrange.settle(Settlement(c2.id, c2.fence, S.PENDING, None, "refused", T0, maybe_sent=False))
    assert arrange.get("k").maybe_sent is True
    (c3,) = arrange.claim(now=T0)
    assert c3.redelivery is True


# -- leases ----------------------------------------------------------------------------------


def test_renew_extends_only_the_owners_leases_under_their_fences(
    store: Store, arrange: Arrange
) -> None:
    arrange.add("a")
    arrange.add("b")
    claims = {c.key: c for c in arrange.claim(owner="w1", now=T0, lease_seconds=10)}
    a, b = claims["a"], claims["b"]
    assert store.renew_leases("w1", [(a.id, a.fence), (b.id, b.fence)], T0 + 40, T0 + 5) == 2
    assert arrange.get("a").lease_expires_at == T0 + 40
    assert arrange.get("a").updated_at == T0 + 5
    assert store.renew_leases("w2", [(a.id, a.fence)], T0 + 99, T0 + 6) == 0
    assert store.renew_leases("w1", [(a.id, a.fence + 1)], T0 + 99, T0 + 6) == 0
    assert store.renew_leases("w1", [], T0 + 99, T0 + 6) == 0
    assert arrange.get("a").lease_expires_at == T0 + 40
    arrange.settle(Settlement(b.id, b.fence, S.DONE, "1"))
    assert store.renew_leases("w1", [(b.id, b.fence)], T0 + 99, T0 + 7) == 0
    assert arrange.get("b").lease_expires_at is None


def test_lease_holders_are_the_distinct_owners_of_claims(store: Store, arrange: Arrange) -> None:
    assert store.lease_holders() == []
    for key in ("a", "b", "c"):
        arrange.add(key)
    arrange.claim(owner="w1", limit=2)
    arrange.claim(owner="w2", limit=1)
    assert sorted(store.lease_holders()) == ["w1", "w2"]
    (w2_claim,) = [c for c in store.list_effects() if c.lease_owner == "w2"]
    arrange.settle(Settlement(w2_claim.id, w2_claim.fence, S.DONE, "1"))
    assert store.lease_holders() == ["w1"]


def test_an_expired_lease_is_released_as_uncertain(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    arrange.add("expired")
    arrange.add("alive")
    arrange.claim(owner="w1", now=T0, lease_seconds=10, limit=1)
    arrange.claim(owner="w2", now=T0, lease_seconds=100, limit=1)
    assert store.release_claims(now=T0 + 10) == 0  # not before the lease has run out
    assert store.release_claims(now=T0 + 11) == 1
    row = raw.effect_row("expired")
    assert row["state"] == "uncertain"
    assert row["maybe_sent"] == 1  # the attempt may have reached the receiver
    assert row["last_error"] == "lease of w1 expired during attempt 1"
    assert (row["lease_owner"], row["lease_expires_at"]) == (None, None)
    # It keeps its place in line: due since T0, it is claimed before later arrivals.
    assert (row["not_before"], row["updated_at"]) == (T0, T0 + 11)
    assert raw.effect_row("alive")["state"] == "claimed"
    # A recovery, not an attempt: the next claim is attempt 1 again, a redelivery, alone.
    assert (row["attempts"], row["recoveries"]) == (0, 1)
    (again,) = arrange.claim(owner="w3", now=T0 + 11, kinds=None)
    assert (again.key, again.redelivery, again.attempt, again.recoveries) == (
        "expired",
        True,
        1,
        1,
    )


def test_a_dead_owners_claims_are_released_before_their_lease_ends(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    arrange.add("a")
    arrange.add("b")
    arrange.claim(owner="dead-worker", now=T0, lease_seconds=600, limit=1)
    arrange.claim(owner="live-worker", now=T0, lease_seconds=600, limit=1)
    assert store.release_claims(now=T0 + 1, dead_owners=["dead-worker", "ghost"]) == 1
    row = raw.effect_row("a")
    assert row["state"] == "uncertain"
    assert row["last_error"] == "owner dead-worker died during attempt 1"
    assert raw.effect_row("b")["state"] == "claimed"


def test_a_released_claim_without_recoveries_left_is_dead(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    arrange.add("k", max_attempts=1)
    arrange.claim(now=T0, lease_seconds=10)
    assert store.release_claims(now=T0 + 11, max_recoveries=2) == 1
    assert raw.effect_row("k")["state"] == "uncertain"  # max_attempts=1 does not bound it
    arrange.claim(now=T0 + 11, lease_seconds=10)
    assert store.release_claims(now=T0 + 22, max_recoveries=2) == 1
    row = raw.effect_row("k")
    assert row["state"] == "dead"
    assert row["maybe_sent"] == 1
    assert (row["attempts"], row["recoveries"]) == (0, 2)
    assert row["last_error"] == (
        "its dispatcher died or lost its lease while its sink ran, 2 times; the outcome of the "
        "last attempt is unknown"
    )


def test_a_released_claim_past_its_deadline_is_dead(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    arrange.add("k", deadline=T0 + 20)
    arrange.claim(now=T0, lease_seconds=30)
    assert store.release_claims(now=T0 + 31) == 1
    row = raw.effect_row("k")
    assert row["state"] == "dead"
    assert row["last_error"] == "deadline passed; the outcome of the last attempt is unknown"


# -- deadlines and the backlog ---------------------------------------------------------------


def test_expire_deadlines_kills_only_waiting_effects_past_their_deadline(
    store: Store, arrange: Arrange
) -> None:
    arrange.add("never-sent", deadline=T0 + 5)
    arrange.into("maybe-sent", S.UNCERTAIN, deadline=T0 + 5)
    arrange.add("in-time", deadline=T0 + 50)
    arrange.add("no-deadline")
    arrange.into("claimed", S.CLAIMED, deadline=T0 + 5)
    arrange.into("done", S.DONE, deadline=T0 + 5)
    assert store.expire_deadlines(T0 + 5) == 0  # "past" means strictly after
    assert store.expire_deadlines(T0 + 6) == 2
    never = arrange.get("never-sent")
    assert (never.state, never.last_error) == (S.DEAD, "deadline passed before delivery")
    maybe = arrange.get("maybe-sent")
    assert (maybe.state, maybe.last_error) == (
        S.DEAD,
        "deadline passed; an earlier attempt may have landed",
    )
    assert maybe.updated_at == T0 + 6
    states = {key: arrange.get(key).state for key in ("in-time", "no-deadline", "claimed", "done")}
    assert states == {
        "in-time": S.PENDING,
        "no-deadline": S.PENDING,
        "claimed": S.CLAIMED,
        "done": S.DONE,
    }
    assert store.expire_deadlines(T0 + 6) == 0


def test_the_backlog_of_an_empty_store(store: Store) -> None:
    backlog = store.backlog()
    assert (backlog.next_due, backlog.uncertain, backlog.claimed, backlog.retrying) == (
        None,
        0,
        0,
        0,
    )


def test_the_backlog_counts_what_a_dispatcher_still_has_to_do(
    store: Store, arrange: Arrange
) -> None:
    arrange.add("later", kind="mail", not_before=T0 + 30)
    arrange.add("sooner", kind="sms", not_before=T0 + 20)
    arrange.into("unsure", S.UNCERTAIN, kind="mail", now=T0 - 100)  # not_before T0 - 40
    arrange.into("busy", S.CLAIMED, kind="sms", now=T0 - 100)
    arrange.into("finished", S.DONE, kind="mail", now=T0 - 200)
    retried = arrange.into("retried", S.CLAIMED, kind="sms", now=T0 - 300)
    arrange.settle(Settlement(retried.id, retried.fence, S.PENDING, None, "503", T0 + 25))

    everything = store.backlog()
    assert everything.next_due == T0 - 40
    assert (everything.uncertain, everything.claimed, everything.retrying) == (1, 1, 1)
    sms = store.backlog(["sms"])
    assert sms.next_due == T0 + 20
    assert (sms.uncertain, sms.claimed, sms.retrying) == (0, 1, 1)
    mail = store.backlog(["mail"])
    assert (mail.next_due, mail.uncertain, mail.claimed, mail.retrying) == (T0 - 40, 1, 0, 0)
    nothing = store.backlog([])
    assert (nothing.next_due, nothing.uncertain, nothing.claimed) == (None, 0, 0)


def test_a_subscription_is_woken_by_an_accept_and_never_once_stopped(
    store: Store, arrange: Arrange
) -> None:
    woken = threading.Event()
    stop = store.subscribe(woken.set)
    try:
        time.sleep(0.1)  # PostgreSQL: the listener's LISTEN is in place
        arrange.add("while-subscribed")
        assert woken.wait(timeout=20), "an accepted effect woke nobody"
    finally:
        stop()
    woken.clear()
    arrange.add("after-stop")
    time.sleep(0.1)
    assert not woken.is_set()
    assert store.backlog().next_due == T0  # and the store still works


def test_a_settled_subscription_is_woken_by_a_settlement(store: Store, arrange: Arrange) -> None:
    arrange.add("k")
    (claim,) = arrange.claim(owner="w1", now=T0)
    woken = threading.Event()
    stop = store.subscribe_settled(woken.set)
    try:
        time.sleep(0.1)
        arrange.settle(Settlement(claim.id, claim.fence, S.DONE, result_json="{}"), now=T0 + 1)
        assert woken.wait(timeout=20), "a settlement woke nobody"
    finally:
        stop()
    assert arrange.get("k").state is S.DONE


# -- cancel and retry ------------------------------------------------------------------------


@pytest.mark.parametrize("state", [S.PENDING, S.UNCERTAIN])
def test_cancel_a_waiting_effect(store: Store, arrange: Arrange, state: EffectState) -> None:
    arrange.into("k", state)
    effect = store.cancel_effect("k", now=T0 + 1, reason="customer withdrew")
    assert effect.state is S.CANCELLED
    assert effect.last_error == "customer withdrew"
    assert effect.updated_at == T0 + 1
    assert effect == arrange.get("k")
    assert arrange.claim(now=T0 + 1000, kinds=None) == []


def test_cancel_a_claimed_effect_takes_its_lease_and_refuses_its_outcome(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    arrange.add("k")
    (claim,) = arrange.claim(owner="w1", now=T0)
    effect = store.cancel_effect("k", now=T0 + 1, reason="stop")
    assert effect.state is S.CANCELLED
    assert (effect.lease_owner, effect.lease_expires_at) == (None, None)
    assert effect.fence == claim.fence + 1
    assert effect.last_error == "stop (while attempt 1 was in flight: it may have landed)"
    assert store.renew_leases("w1", [(claim.id, claim.fence)], T0 + 99, T0 + 2) == 0
    before = raw.effect_row("k")
    assert arrange.settle(Settlement(claim.id, claim.fence, S.DONE, "1")) == [False]
    assert raw.effect_row("k") == before
    assert store.lease_holders() == []


def test_an_attempt_cancelled_in_flight_makes_a_later_retry_a_redelivery(
    store: Store, arrange: Arrange
) -> None:
    # Regression: the cancelled attempt may have landed, yet a retry after the cancel used to
    # go out unflagged, a silent duplicate for the receiver.
    arrange.add("k")
    arrange.claim(owner="w1", now=T0)
    assert store.cancel_effect("k", now=T0 + 1, reason="stop").maybe_sent is True
    store.retry_effect("k", now=T0 + 2)
    (again,) = arrange.claim(owner="w2", now=T0 + 2)
    assert again.redelivery is True


def test_cancelling_a_waiting_effect_does_not_invent_a_delivery(
    store: Store, arrange: Arrange
) -> None:
    arrange.add("k")
    assert store.cancel_effect("k", now=T0 + 1, reason="stop").maybe_sent is False
    store.retry_effect("k", now=T0 + 2)
    (again,) = arrange.claim(now=T0 + 2)
    assert again.redelivery is False


@pytest.mark.parametrize("state", [S.DONE, S.REJECTED, S.DEAD, S.CANCELLED])
def test_cancel_refuses_a_terminal_effect(
    store: Store, raw: RawDatabase, arrange: Arrange, state: EffectState
) -> None:
    arrange.into("k", state)
    before = raw.effect_row("k")
    with pytest.raises(InvalidState) as caught:
        store.cancel_effect("k", now=T0 + 1, reason="too late")
    assert caught.value.fields == {"key": "k", "state": str(state)}
    assert raw.effect_row("k") == before


@pytest.mark.parametrize("state", [S.DEAD, S.REJECTED, S.CANCELLED])
def test_retry_sends_a_failed_effect_back_with_fresh_attempts(
    store: Store, arrange: Arrange, state: EffectState
) -> None:
    arrange.into("k", state, max_attempts=3)
    effect = store.retry_effect("k", now=T0 + 7)
    assert effect.state is S.PENDING
    assert (effect.attempts, effect.not_before, effect.last_error) == (0, T0 + 7, None)
    assert effect.updated_at == T0 + 7
    (claim,) = arrange.claim(now=T0 + 7, kinds=None)
    assert claim.attempt == 1
    assert claim.fence > 1  # fences only grow: an old worker stays refused


def test_retry_keeps_maybe_sent_so_the_next_attempt_is_a_redelivery(
    store: Store, arrange: Arrange
) -> None:
    arrange.add("k", max_attempts=1)
    (claim,) = arrange.claim(now=T0)
    arrange.settle(Settlement(claim.id, claim.fence, S.DEAD, None, "unknown", maybe_sent=True))
    effect = store.retry_effect("k", now=T0 + 1)
    assert effect.maybe_sent is True
    (again,) = arrange.claim(now=T0 + 1)
    assert again.redelivery is True


@pytest.mark.parametrize("state", [S.PENDING, S.CLAIMED, S.UNCERTAIN, S.DONE])
def test_retry_refuses_other_states(
    store: Store, raw: RawDatabase, arrange: Arrange, state: EffectState
) -> None:
    arrange.into("k", state)
    before = raw.effect_row("k")
    with pytest.raises(InvalidState):
        store.retry_effect("k", now=T0 + 1)
    assert raw.effect_row("k") == before


def test_cancel_and_retry_of_an_unknown_key(store: Store) -> None:
    with pytest.raises(EffectNotFound):
        store.cancel_effect("nope", now=T0, reason="x")
    with pytest.raises(EffectNotFound):
        store.retry_effect("nope", now=T0)


def test_retry_lifts_a_deadline_that_has_passed_and_keeps_one_ahead(
    store: Store, arrange: Arrange
) -> None:
    arrange.add("late", deadline=T0 + 10)
    arrange.add("early", deadline=T0 + 1000)
    assert store.expire_deadlines(T0 + 20) == 1
    store.cancel_effect("early", now=T0 + 20, reason="operator")
    late = store.retry_effect("late", now=T0 + 30)
    early = store.retry_effect("early", now=T0 + 30)
    assert late.state is EffectState.PENDING and late.deadline is None
    assert early.deadline == T0 + 1000
    (claim,) = arrange.claim(now=T0 + 31, kinds=["send"], limit=1)
    assert claim.key in ("late", "early")
