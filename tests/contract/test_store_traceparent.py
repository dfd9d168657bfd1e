"""Store contract: an effect's trace context (migration 0008) is stored on accept and handed back
with every claim of the effect, a redelivery's included; without one the column stays NULL."""

from __future__ import annotations

from oncewire.storage import Store
from oncewire.storage.records import EffectState, Settlement

from .conftest import T0, Arrange, RawDatabase

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _accept(store: Store, key: str, traceparent: str | None) -> bool:
    with store.transaction() as tx:
        _, created = store.insert_effect_in_tx(
            tx,
            key=key,
            kind="send",
            payload_json="{}",
            digest="d" * 64,
            max_attempts=3,
            not_before=T0,
            deadline=None,
            now=T0,
            traceparent=traceparent,
        )
    return created


def test_the_traceparent_is_stored_and_returned_by_each_claim(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    assert _accept(store, "traced", TRACEPARENT)
    assert _accept(store, "plain", None)
    rows = raw.query("SELECT key, traceparent FROM oncewire_effects ORDER BY key")
    assert rows == [("plain", None), ("traced", TRACEPARENT)]

    first = {claim.key: claim for claim in arrange.claim(owner="w1", now=T0 + 1)}
    assert first["traced"].traceparent == TRACEPARENT
    assert first["plain"].traceparent is None

    # The claim is released as if its owner died: the redelivery carries the same context.
    assert store.release_claims(now=T0 + 2, dead_owners=["w1"]) == 2
    again = {claim.key: claim for claim in arrange.claim(owner="w2", now=T0 + 3)}
    assert again["traced"].redelivery is True
    assert again["traced"].traceparent == TRACEPARENT
    assert again["traced"].fence == first["traced"].fence + 1


def test_a_repeated_accept_keeps_the_first_traceparent(store: Store, raw: RawDatabase) -> None:
    assert _accept(store, "k", TRACEPARENT)
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    assert not _accept(store, "k", other)
    assert raw.query("SELECT traceparent FROM oncewire_effects WHERE key = ?", ("k",)) == [
        (TRACEPARENT,)
    ]


def test_settling_leaves_the_traceparent(store: Store, raw: RawDatabase, arrange: Arrange) -> None:
    assert _accept(store, "k", TRACEPARENT)
    (claim,) = arrange.claim(owner="w1", now=T0 + 1)
    assert arrange.settle(Settlement(claim.id, claim.fence, EffectState.DONE, "null"), now=T0 + 2)
    assert raw.query("SELECT state, traceparent FROM oncewire_effects") == [("done", TRACEPARENT)]
