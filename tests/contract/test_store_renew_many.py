"""Renewing many leases at once: each lease renewed exactly when it is still held, on every
backend.

Renewals travel as one ``{values}`` table per statement (SQLite: a chunk of rows padded with
rows that match nothing; PostgreSQL: one array per column). Whatever their number (one, a power
of two, one more, more than a chunk), a renewal extends only a lease still held by its owner
under its fence, and the count says how many did. Checked around the store (``raw``).
"""

from __future__ import annotations

import pytest

from oncewire.storage import Store
from tests.contract.conftest import T0, Arrange, RawDatabase


@pytest.mark.parametrize("count", [1, 2, 3, 128, 129, 300])
def test_each_lease_of_a_large_renewal_is_renewed_on_its_own(
    store: Store, arrange: Arrange, raw: RawDatabase, count: int
) -> None:
    for i in range(count):
        arrange.add(f"k{i:04d}")
    claims = arrange.claim(owner="w1", limit=count, lease_seconds=30.0)
    assert len(claims) == count
    stale = {i for i in range(count) if i % 5 == 2}  # a fence that has moved on: not renewed
    fences = [(c.id, c.fence + (9 if i in stale else 0)) for i, c in enumerate(claims)]
    renewed = store.renew_leases("w1", fences, T0 + 500.0, T0 + 10.0)
    assert renewed == count - len(stale)
    for i, claim in enumerate(claims):
        row = raw.effect_row(claim.key)
        assert row["state"] == "claimed" and row["lease_owner"] == "w1"
        assert row["lease_expires_at"] == (T0 + 30.0 if i in stale else T0 + 500.0)


def test_a_lease_held_by_another_owner_is_not_renewed(
    store: Store, arrange: Arrange, raw: RawDatabase
) -> None:
    arrange.add("mine")
    arrange.add("theirs")
    (mine,) = arrange.claim(owner="w1", limit=1)
    (theirs,) = arrange.claim(owner="w2", limit=1)
    fences = [(mine.id, mine.fence), (theirs.id, theirs.fence)]
    assert store.renew_leases("w1", fences, T0 + 500.0, T0 + 10.0) == 1
    assert raw.effect_row("mine")["lease_expires_at"] == T0 + 500.0
    assert raw.effect_row("theirs")["lease_expires_at"] == T0 + 30.0
    assert store.renew_leases("w1", [], T0 + 600.0, T0 + 10.0) == 0
