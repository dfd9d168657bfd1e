"""Store contract: accepting, reading and counting effects; the schema's own guarantees."""

from __future__ import annotations

import abc
from pathlib import Path

import pytest

from oncewire.core.errors import InvalidState
from oncewire.storage import Store
from oncewire.storage.records import EffectState

from .conftest import T0, Arrange, RawDatabase

# Verb families whose contract tests are still to be written, and why. An entry is a debt, not
# a waiver: the test below fails once the family is covered, so that the entry is removed.
NOT_YET_UNDER_CONTRACT: dict[type, str] = {}


def _verbs(cls: type) -> set[str]:
    return {
        name for name, member in vars(cls).items() if not name.startswith("_") and callable(member)
    }


def _called_by_contract_tests() -> str:
    here = Path(__file__).parent
    return "".join(path.read_text() for path in sorted(here.glob("*.py")))


def test_every_store_verb_is_exercised_by_the_contract_suite() -> None:
    families = [cls for cls in Store.__mro__ if cls not in (object, abc.ABC)]
    verbs = set().union(*(_verbs(cls) for cls in families if cls not in NOT_YET_UNDER_CONTRACT))
    text = _called_by_contract_tests()
    missing = sorted(verb for verb in verbs if f".{verb}(" not in text)
    assert missing == [], f"Store verbs that no contract test calls: {', '.join(missing)}"


def test_families_outside_the_contract_are_still_uncovered() -> None:
    text = _called_by_contract_tests()
    for family in NOT_YET_UNDER_CONTRACT:
        assert family in Store.__mro__, f"{family.__name__} is no longer a Store family"
        assert any(f".{verb}(" not in text for verb in _verbs(family)), (
            f"every {family.__name__} verb now has a contract test: remove it from "
            "NOT_YET_UNDER_CONTRACT"
        )


def test_a_fresh_store_is_migrated_and_empty(store: Store, raw: RawDatabase) -> None:
    assert store.schema_version() >= 1
    assert raw.count("oncewire_effects") == 0
    assert raw.count("oncewire_receipts") == 0
    assert store.list_effects() == []
    assert set(store.count_effects().values()) == {0}


def test_insert_new_returns_the_row_and_true(store: Store, raw: RawDatabase) -> None:
    with store.transaction() as tx:
        effect, created = store.insert_effect_in_tx(
            tx,
            key="order-1/charge",
            kind="charge",
            payload_json='{"cents":1999}',
            digest="a" * 64,
            max_attempts=7,
            not_before=T0 + 5,
            deadline=T0 + 60,
            now=T0,
        )
    assert created is True
    assert effect.id > 0
    assert (effect.key, effect.kind, effect.payload_json, effect.digest) == (
        "order-1/charge",
        "charge",
        '{"cents":1999}',
        "a" * 64,
    )
    assert effect.state is EffectState.PENDING
    assert (effect.attempts, effect.max_attempts, effect.fence) == (0, 7, 0)
    assert (effect.not_before, effect.deadline) == (T0 + 5, T0 + 60)
    assert (effect.lease_owner, effect.lease_expires_at) == (None, None)
    assert (effect.maybe_sent, effect.result_json, effect.last_error) == (False, None, None)
    assert effect.created_at == effect.updated_at == T0
    assert effect.payload == {"cents": 1999}
    assert store.get_effect("order-1/charge") == effect
    row = raw.effect_row("order-1/charge")
    assert (row["state"], row["maybe_sent"], row["payload"]) == ("pending", 0, '{"cents":1999}')


def test_insert_existing_returns_the_stored_row_unchanged_and_false(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    first = arrange.add("k", kind="charge", payload_json='{"a":1}', digest="a" * 64)
    with store.transaction() as tx:
        again, created = store.insert_effect_in_tx(
            tx,
            key="k",
            kind="other",
            payload_json='{"a":2}',
            digest="b" * 64,
            max_attempts=1,
            not_before=T0 + 99,
            deadline=T0 + 100,
            now=T0 + 50,
        )
    assert created is False
    assert again == first  # the store does not compare digests; the ledger does
    assert raw.count("oncewire_effects") == 1
    assert raw.effect_row("k")["digest"] == "a" * 64


def test_an_insert_rolls_back_with_its_transaction(store: Store, raw: RawDatabase) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), store.transaction() as tx:
        store.insert_effect_in_tx(
            tx,
            key="k",
            kind="send",
            payload_json="{}",
            digest="d" * 64,
            max_attempts=1,
            not_before=T0,
            deadline=None,
            now=T0,
        )
        raise Boom
    assert store.get_effect("k") is None
    assert raw.count("oncewire_effects") == 0


def _alone(
    store: Store, key: str, *, digest: str = "a" * 64, hit: list[int] | None = None
) -> tuple:
    return store.insert_effect_alone(
        key=key,
        kind="charge",
        payload_json='{"cents":1999}',
        digest=digest,
        max_attempts=3,
        not_before=T0,
        deadline=None,
        now=T0,
        before_commit=(lambda: None) if hit is None else (lambda: hit.append(1)),
    )


def test_an_insert_alone_commits_before_it_returns(store: Store, raw: RawDatabase) -> None:
    hits: list[int] = []
    effect, created = _alone(store, "alone-1", hit=hits)
    assert created is True and hits == [1]
    assert effect == store.get_effect("alone-1")
    row = raw.effect_row("alone-1")  # another connection: committed
    assert (row["state"], row["digest"], row["attempts"]) == ("pending", "a" * 64, 0)


def test_an_insert_alone_of_an_existing_key_returns_it_unchanged(
    store: Store, raw: RawDatabase, arrange: Arrange
) -> None:
    first = arrange.add("k", kind="charge", payload_json='{"a":1}', digest="b" * 64)
    again, created = _alone(store, "k", digest="c" * 64)
    assert created is False and again == first  # the store does not compare digests
    assert raw.count("oncewire_effects") == 1
    assert raw.effect_row("k")["digest"] == "b" * 64


def test_an_insert_alone_that_fails_before_its_commit_leaves_nothing(
    store: Store, raw: RawDatabase
) -> None:
    class Boom(Exception):
        pass

    def boom() -> None:
        raise Boom

    with pytest.raises(Boom):
        store.insert_effect_alone(
            key="never",
            kind="charge",
            payload_json="{}",
            digest="d" * 64,
            max_attempts=1,
            not_before=T0,
            deadline=None,
            now=T0,
            before_commit=boom,
        )
    assert raw.count("oncewire_effects") == 0


def test_an_insert_alone_inside_an_open_transaction_is_refused(
    store: Store, raw: RawDatabase
) -> None:
    with store.transaction(), pytest.raises(InvalidState, match="already open"):
        _alone(store, "inside")
    assert raw.count("oncewire_effects") == 0


def test_a_nested_transaction_on_one_thread_is_refused(store: Store) -> None:
    with store.transaction(), pytest.raises(InvalidState), store.transaction():
        pass


def test_ids_grow_in_insertion_order(arrange: Arrange) -> None:
    ids = [arrange.add(f"k{i}").id for i in range(5)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 5


def test_get_unknown_is_none(store: Store) -> None:
    assert store.get_effect("nope") is None


def test_list_filters_by_state_and_kind_in_id_order(store: Store, arrange: Arrange) -> None:
    arrange.into("p1", EffectState.PENDING, kind="mail")
    arrange.into("d1", EffectState.DONE)
    arrange.into("p2", EffectState.PENDING, kind="charge")
    arrange.into("r1", EffectState.REJECTED)
    arrange.into("p3", EffectState.PENDING, kind="mail")

    assert [e.key for e in store.list_effects()] == ["p1", "d1", "p2", "r1", "p3"]
    pending = store.list_effects(states=[EffectState.PENDING])
    assert [e.key for e in pending] == ["p1", "p2", "p3"]
    finished = store.list_effects(states=[EffectState.DONE, EffectState.REJECTED])
    assert [e.key for e in finished] == ["d1", "r1"]
    assert [e.key for e in store.list_effects(kind="mail")] == ["p1", "p3"]
    assert store.list_effects(states=[EffectState.DONE], kind="mail") == []
    assert [e.key for e in store.list_effects(limit=2)] == ["p1", "d1"]


def test_list_pages_with_after_id(store: Store, arrange: Arrange) -> None:
    for i in range(7):
        arrange.add(f"k{i}")
    seen: list[str] = []
    after = 0
    while page := store.list_effects(limit=3, after_id=after):
        seen.extend(e.key for e in page)
        after = page[-1].id
    assert seen == [f"k{i}" for i in range(7)]
    assert store.list_effects(states=[EffectState.CLAIMED], after_id=0) == []


def test_count_reports_every_state(store: Store, arrange: Arrange) -> None:
    for state in EffectState:
        arrange.into(f"one-{state}", state)
    arrange.into("two-pending", EffectState.PENDING)
    counts = store.count_effects()
    assert set(counts) == set(EffectState)
    assert counts == {state: 2 if state is EffectState.PENDING else 1 for state in EffectState}


def test_effect_records_serialise(arrange: Arrange) -> None:
    effect = arrange.into("k", EffectState.DONE, payload_json='{"to":"zoë"}')
    data = effect.as_dict()
    assert data["state"] == "done"
    assert data["payload"] == {"to": "zoë"}
    assert data["result"] == {"ok": True}
    assert effect.terminal is True


# -- the schema holds the invariants even against a writer that goes around the store --------

VIOLATIONS = {
    "claimed without a lease": "UPDATE oncewire_effects SET state = 'claimed'",
    "a lease while not claimed": (
        "UPDATE oncewire_effects SET lease_owner = 'w', lease_expires_at = 1.0"
    ),
    "a result on a pending effect": "UPDATE oncewire_effects SET result = '1'",
    "an unknown state": "UPDATE oncewire_effects SET state = 'lost'",
    "negative attempts": "UPDATE oncewire_effects SET attempts = -1",
    "zero max_attempts": "UPDATE oncewire_effects SET max_attempts = 0",
    "negative fence": "UPDATE oncewire_effects SET fence = -1",
    "maybe_sent not boolean": "UPDATE oncewire_effects SET maybe_sent = 2",
    "a duplicate key": (
        "INSERT INTO oncewire_effects (key, kind, payload, digest, max_attempts, not_before, "
        "created_at, updated_at) SELECT key, kind, payload, digest, 1, 0, 0, 0 "
        "FROM oncewire_effects"
    ),
}


@pytest.mark.parametrize("sql", VIOLATIONS.values(), ids=VIOLATIONS.keys())
def test_the_schema_refuses_rows_that_break_the_effect_invariants(
    raw: RawDatabase, arrange: Arrange, sql: str
) -> None:
    arrange.add("k")
    before = raw.effect_row("k")
    with pytest.raises(raw.integrity_errors):
        raw.execute(sql)
    assert raw.effect_row("k") == before
    assert raw.count("oncewire_effects") == 1


def test_the_schema_refuses_a_duplicate_receipt_key(store: Store, raw: RawDatabase) -> None:
    with store.transaction() as tx:
        store.reserve_receipt_in_tx(
            tx, key="r", digest="a" * 64, payload_json="{}", now=T0, expires_at=None
        )
    with pytest.raises(raw.integrity_errors):
        raw.execute(
            "INSERT INTO oncewire_receipts (key, digest, payload, created_at) "
            "VALUES ('r', 'x', '{}', 0)"
        )
    assert raw.count("oncewire_receipts") == 1
