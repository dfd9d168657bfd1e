"""Settling many claims at once: every settlement applied or refused on its own, on every backend.

SQLite writes settlements (and their attempt-history rows) one statement per chunk of them, the
list padded with rows that match nothing; PostgreSQL one statement for all. Whatever the number
of settlements (one, a power of two, one more, more than a chunk), each is applied exactly when
its effect is still claimed under its fence, and it alone writes its attempt row. Checked around
the store (``raw``).
"""

from __future__ import annotations

import pytest

from oncewire.storage.records import EffectState, Settlement
from tests.contract.conftest import T0, Arrange, RawDatabase


@pytest.mark.parametrize("count", [1, 2, 3, 64, 65, 128, 129, 300])
def test_each_settlement_of_a_large_batch_applies_on_its_own(
    arrange: Arrange, raw: RawDatabase, count: int
) -> None:
    for i in range(count):
        arrange.add(f"k{i:04d}")
    claims = arrange.claim(owner="w1", limit=count)
    assert len(claims) == count
    stale = {i for i in range(count) if i % 7 == 3}  # a fence that has moved on: refused
    settlements = [
        Settlement(
            claim.id,
            claim.fence + (5 if i in stale else 0),
            EffectState.DONE if i % 2 == 0 else EffectState.PENDING,
            result_json=f'{{"n":{i}}}' if i % 2 == 0 else None,
            last_error=None if i % 2 == 0 else f"busy {i}",
            not_before=None if i % 2 == 0 else T0 + 60 + i,
            refund_attempt=i % 2 == 1,
            attempt=claim.fence,
            outcome="done" if i % 2 == 0 else "not_sent",
            started_at=T0 + i,
            finished_at=T0 + i + 0.5,
        )
        for i, claim in enumerate(claims)
    ]
    applied = arrange.settle(*settlements, now=T0 + 1000)
    assert applied == [i not in stale for i in range(count)]
    for i, claim in enumerate(claims):
        row = raw.effect_row(claim.key)
        history = raw.query(
            "SELECT fence, owner, outcome, state, error, started_at, finished_at "
            "FROM oncewire_attempts WHERE effect_id = ?",
            (claim.id,),
        )
        if i in stale:
            assert (row["state"], row["lease_owner"], row["attempts"]) == ("claimed", "w1", 1)
            assert history == []
        elif i % 2 == 0:
            assert (row["state"], row["result"], row["attempts"]) == ("done", f'{{"n":{i}}}', 1)
            assert row["lease_owner"] is None
            assert [tuple(h) for h in history] == [
                (claim.fence, "w1", "done", "done", None, T0 + i, T0 + i + 0.5)
            ]
        else:
            assert (row["state"], row["last_error"], row["attempts"]) == ("pending", f"busy {i}", 0)
            assert row["not_before"] == T0 + 60 + i
            assert [tuple(h) for h in history] == [
                (claim.fence, "w1", "not_sent", "pending", f"busy {i}", T0 + i, T0 + i + 0.5)
            ]
    assert raw.count("oncewire_attempts") == count - len(stale)
