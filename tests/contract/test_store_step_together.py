"""Store contract: a dispatcher step that looks for no suspect sends its statements together.

On PostgreSQL its BEGIN, attempt history, settlements, NOTIFY, claims and COMMIT are one round
trip (tests/integration/test_postgres_begin.py counts them); here, on every backend, the step is
checked to do what the step that looks for suspects does, and to be all or nothing when one of
its statements fails. Everything is read back from the rows.
"""

from __future__ import annotations

import pytest

from oncewire.core.errors import StorageError
from oncewire.storage import Store
from oncewire.storage.records import EffectState, Settlement

from .conftest import T0, Arrange, RawDatabase


def _done(claim: object, **kw: object) -> Settlement:
    args: dict[str, object] = {"attempt": 1, "outcome": "done", "finished_at": T0 + 1}
    args.update(kw)
    return Settlement(claim.id, claim.fence, EffectState.DONE, **args)  # type: ignore[attr-defined,arg-type]


@pytest.mark.parametrize("suspects", [False, True], ids=["together", "looking"])
def test_a_step_settles_records_history_and_claims_alike_either_way(
    store: Store, raw: RawDatabase, arrange: Arrange, suspects: bool
) -> None:
    for key in ("a", "b", "c", "d"):
        arrange.add(key)
    first = store.dispatch_step(
        [], owner="w1", now=T0, lease_seconds=30.0, limit=2, mark=1, suspects=suspects
    )
    assert [c.key for c in first.claims] == ["a", "b"]
    assert [c.started for c in first.claims] == [True, False]
    a, b = first.claims
    step = store.dispatch_step(
        [_done(a, result_json='{"ok":1}')],
        owner="w1",
        now=T0 + 2,
        lease_seconds=30.0,
        limit=3,
        starting=[(b.id, b.fence), (999_999, 1)],
        mark=2,
        suspects=suspects,
    )
    assert step.applied == [True]
    assert step.started == {b.id}  # the unknown claim is left out
    assert [(c.key, c.started) for c in step.claims] == [("c", True), ("d", True)]
    assert raw.effect_row("a")["state"] == "done"
    assert raw.effect_row("a")["result"] == '{"ok":1}'
    assert raw.effect_row("b")["started_fence"] == raw.effect_row("b")["fence"]
    history = raw.query("SELECT outcome, state FROM oncewire_attempts")
    assert [tuple(r) for r in history] == [("done", "done")]
    stale = store.dispatch_step(
        [_done(a)], owner="w1", now=T0 + 3, lease_seconds=30.0, limit=0, suspects=suspects
    )
    assert stale.applied == [False]  # settled already: fenced out, nothing written
    assert raw.count("oncewire_attempts") == 1


def test_a_failing_statement_leaves_the_whole_step_unwritten(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    for key in ("a", "b", "c"):
        arrange.add(key)
    a, b = store.dispatch_step(
        [], owner="w1", now=T0, lease_seconds=30.0, limit=2, mark=2, suspects=False
    ).claims
    before = {key: raw.effect_row(key) for key in ("a", "b", "c")}
    # A result on an effect that is not done breaks a CHECK: the settle fails after the
    # attempt history was sent, and the claim after it must not run either.
    broken = Settlement(
        b.id, b.fence, EffectState.UNCERTAIN, '{"no":1}', attempt=1, outcome="error"
    )
    with pytest.raises(StorageError):
        store.dispatch_step(
            [_done(a), broken],
            owner="w1",
            now=T0 + 1,
            lease_seconds=30.0,
            limit=1,
            mark=1,
            suspects=False,
        )
    assert {key: raw.effect_row(key) for key in ("a", "b", "c")} == before
    assert raw.count("oncewire_attempts") == 0
    # The store goes on: the same thread's next step commits.
    step = store.dispatch_step(
        [_done(a)], owner="w1", now=T0 + 2, lease_seconds=30.0, limit=1, mark=1, suspects=False
    )
    assert step.applied == [True]
    assert [c.key for c in step.claims] == ["c"]
    assert raw.effect_row("a")["state"] == "done"
    assert raw.count("oncewire_attempts") == 1
