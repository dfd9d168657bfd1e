"""The attempt history: one row per attempt closed, written with what closed it, on every backend.

Rows are read back both through ``list_attempts`` and around the store (``raw``), so a verb
cannot report a row it did not write.
"""

from __future__ import annotations

import pytest

from oncewire import Ledger
from oncewire.storage import Store
from oncewire.storage.records import AttemptRecord, EffectState, Settlement
from tests.contract.conftest import T0, Arrange, RawDatabase


def _raw_attempts(raw: RawDatabase, effect_id: int) -> list[tuple[object, ...]]:
    return raw.query(
        "SELECT attempt, fence, owner, outcome, state, error, started_at, finished_at "
        "FROM oncewire_attempts WHERE effect_id = ? ORDER BY fence",
        (effect_id,),
    )


def test_an_applied_settlement_writes_its_attempt_row(
    store: Store, arrange: Arrange, raw: RawDatabase
) -> None:
    effect = arrange.add("k-1")
    (claim,) = arrange.claim(owner="w1")
    settlement = Settlement(
        claim.id,
        claim.fence,
        EffectState.DONE,
        result_json='{"ok":true}',
        attempt=claim.attempt,
        redelivery=claim.redelivery,
        outcome="done",
        started_at=T0 + 1.0,
        finished_at=T0 + 1.5,
    )
    assert arrange.settle(settlement, now=T0 + 2.0) == [True]
    assert store.list_attempts(effect.id) == [
        AttemptRecord(
            effect_id=effect.id,
            attempt=1,
            fence=claim.fence,
            owner="w1",  # the claim's owner, not the settling call's
            redelivery=False,
            outcome="done",
            state=EffectState.DONE,
            error=None,
            started_at=T0 + 1.0,
            finished_at=T0 + 1.5,
        )
    ]
    assert _raw_attempts(raw, effect.id) == [
        (1, claim.fence, "w1", "done", "done", None, T0 + 1.0, T0 + 1.5)
    ]


def test_a_settlement_without_attempt_fields_uses_the_effects_own(
    store: Store, arrange: Arrange, raw: RawDatabase
) -> None:
    effect = arrange.add("k-1")
    (claim,) = arrange.claim(owner="w1")
    retry = Settlement(
        claim.id, claim.fence, EffectState.PENDING, last_error="503", not_before=T0 + 5
    )
    assert arrange.settle(retry, now=T0 + 1.0) == [True]
    (row,) = _raw_attempts(raw, effect.id)
    # attempt 0 in the settlement: the effect's attempts column; outcome from the new state;
    # finished at the settlement's time.
    assert row == (1, claim.fence, "w1", "not_sent", "pending", "503", None, T0 + 1.0)


@pytest.mark.parametrize(
    ("last_error", "note", "history_error"),
    [
        (None, "replayed: an earlier run's receipt", "replayed: an earlier run's receipt"),
        ("result not stored: set", "replayed: x", "result not stored: set; replayed: x"),
    ],
)
def test_a_settlements_note_is_in_its_attempt_row_only(
    store: Store,
    arrange: Arrange,
    raw: RawDatabase,
    last_error: str | None,
    note: str,
    history_error: str,
) -> None:
    """A replayed receipt is said in the attempt history, not in the effect's last_error."""
    effect = arrange.add("k-1")
    (claim,) = arrange.claim(owner="w1")
    done = Settlement(
        claim.id,
        claim.fence,
        EffectState.DONE,
        result_json="1",
        last_error=last_error,
        outcome="done",
        note=note,
    )
    assert arrange.settle(done, now=T0 + 1.0) == [True]
    assert _raw_attempts(raw, effect.id) == [
        (1, claim.fence, "w1", "done", "done", history_error, None, T0 + 1.0)
    ]
    assert raw.query("SELECT state, result, last_error FROM oncewire_effects") == [
        ("done", "1", last_error)
    ]
    assert [a.error for a in store.list_attempts(effect.id)] == [history_error]


def test_a_stale_settlement_writes_no_row(store: Store, arrange: Arrange, raw: RawDatabase) -> None:
    effect = arrange.add("k-1")
    (claim,) = arrange.claim(owner="w1")
    stale = Settlement(claim.id, claim.fence + 7, EffectState.DONE, result_json="1")
    assert arrange.settle(stale) == [False]
    assert raw.count("oncewire_attempts") == 0
    assert store.list_attempts(effect.id) == []


def test_history_is_oldest_first_and_marks_redeliveries(
    store: Store, arrange: Arrange, raw: RawDatabase
) -> None:
    effect = arrange.add("k-1")
    (first,) = arrange.claim(owner="w1")
    maybe = Settlement(
        first.id,
        first.fence,
        EffectState.UNCERTAIN,
        last_error="timeout",
        not_before=T0,
        maybe_sent=True,
        attempt=first.attempt,
        outcome="timeout",
    )
    assert arrange.settle(maybe, now=T0 + 1) == [True]
    (second,) = arrange.claim(owner="w2", now=T0 + 2)
    assert second.redelivery
    done = Settlement(second.id, second.fence, EffectState.DONE, result_json="1")
    assert arrange.settle(done, now=T0 + 3) == [True]
    history = store.list_attempts(effect.id)
    assert [(a.attempt, a.owner, a.redelivery, a.outcome, a.state) for a in history] == [
        (1, "w1", False, "timeout", EffectState.UNCERTAIN),
        (2, "w2", True, "done", EffectState.DONE),
    ]
    assert history[0].fence < history[1].fence
    assert raw.count("oncewire_attempts") == 2


def test_released_claims_write_lease_expired_and_owner_died_rows(
    store: Store, arrange: Arrange, raw: RawDatabase
) -> None:
    expired = arrange.into("expired", EffectState.CLAIMED)  # leased by w1 for 30 s
    arrange.add("died", kind="other", max_attempts=1)
    (claim,) = arrange.claim(owner="w9", kinds=["other"], lease_seconds=3600)
    died = arrange.get("died")
    assert store.release_claims(now=T0 + 60, dead_owners=["w9"]) == 2
    expired_after = arrange.get("expired")
    died_after = arrange.get("died")
    (lease_row,) = store.list_attempts(expired.id)
    assert (lease_row.outcome, lease_row.owner, lease_row.state) == (
        "lease_expired",
        "w1",
        EffectState.UNCERTAIN,
    )
    assert lease_row.error == expired_after.last_error
    assert (lease_row.started_at, lease_row.finished_at) == (None, T0 + 60)
    (died_row,) = store.list_attempts(died.id)
    assert (died_row.outcome, died_row.owner, died_row.state, died_row.fence) == (
        "owner_died",
        "w9",
        EffectState.UNCERTAIN,  # a recovery, not one of its max_attempts=1
        claim.fence,
    )
    assert (died_after.attempts, died_after.recoveries) == (0, 1)
    assert died_row.error == died_after.last_error
    assert raw.count("oncewire_attempts") == 2
    assert store.release_claims(now=T0 + 120, dead_owners=["w9"]) == 0
    assert raw.count("oncewire_attempts") == 2


def test_cancelling_a_claimed_effect_closes_its_attempt(
    store: Store, arrange: Arrange, raw: RawDatabase
) -> None:
    claimed = arrange.into("claimed", EffectState.CLAIMED)
    pending = arrange.into("pending", EffectState.PENDING)
    store.cancel_effect("claimed", now=T0 + 5, reason="operator")
    store.cancel_effect("pending", now=T0 + 5, reason="operator")
    (row,) = store.list_attempts(claimed.id)
    assert (row.outcome, row.state, row.owner, row.fence, row.finished_at) == (
        "cancelled",
        EffectState.CANCELLED,
        "w1",
        claimed.fence,
        T0 + 5,
    )
    assert store.list_attempts(pending.id) == []
    assert raw.count("oncewire_attempts") == 1


def test_the_schema_keeps_one_row_per_effect_and_fence(
    store: Store, arrange: Arrange, raw: RawDatabase
) -> None:
    effect = arrange.into("k-1", EffectState.DONE)
    assert raw.count("oncewire_attempts") == 1
    with pytest.raises(raw.integrity_errors):
        raw.execute(
            "INSERT INTO oncewire_attempts (effect_id, attempt, fence, outcome, state, "
            "finished_at) VALUES (?, 1, ?, 'done', 'done', 0)",
            (effect.id, 1),
        )


def test_the_ledger_reads_an_effects_attempts_by_key(store: Store, arrange: Arrange) -> None:
    arrange.into("k-1", EffectState.DONE)
    ledger = Ledger(store)
    (row,) = ledger.effects.attempts("k-1")
    assert row.as_dict()["state"] == "done"
    assert row.duration_ms is None
