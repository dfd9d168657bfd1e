"""Settle and claim in one call, for tests that drive the dispatcher's transaction by hand.

The dispatcher records a claim as starting in the claim itself (``mark``); a test that plays
the dispatcher wants the same, so every claim this returns may have its sink called at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oncewire.storage import Store
from oncewire.storage.records import Claim, Settlement


def settle_and_claim(
    store: Store,
    settlements: Sequence[Settlement],
    *,
    owner: str,
    now: float,
    lease_seconds: float,
    limit: int,
    **options: Any,
) -> tuple[list[bool], list[Claim]]:
    """:meth:`Store.dispatch_step` with every claim recorded as starting: which settlements
    applied, and the claims."""
    step = store.dispatch_step(
        settlements,
        owner=owner,
        now=now,
        lease_seconds=lease_seconds,
        limit=limit,
        mark=limit,
        **options,
    )
    return step.applied, step.claims
