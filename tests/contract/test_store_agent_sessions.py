"""Store contract: the Agents SDK's sessions (oncewire_agents_sessions, oncewire_agents_items),
checked in the rows through a second connection. Items are numbered in insertion order per
session; a pop takes the newest item once, even when pops race on two stores; a clear leaves
no row; the ``_in_tx`` forms commit and roll back with the caller's transaction."""

from __future__ import annotations

import threading

import pytest

from oncewire.core.errors import ConfigurationError, InvalidState
from oncewire.storage import Store, open_store
from oncewire.storage.verbs.agents_sessions import AgentSessionItem

from .conftest import T0, RawDatabase


def _rows(raw: RawDatabase, session_id: str = "s") -> list[tuple[object, ...]]:
    return raw.query(
        "SELECT seq, item FROM oncewire_agents_items WHERE session_id = ? ORDER BY seq",
        (session_id,),
    )


def _last_seq(raw: RawDatabase, session_id: str = "s") -> list[tuple[object, ...]]:
    return raw.query(
        "SELECT last_seq FROM oncewire_agents_sessions WHERE session_id = ?", (session_id,)
    )


def test_appends_are_numbered_in_order_and_read_back_newest_last(
    store: Store, raw: RawDatabase
) -> None:
    assert store.agent_session_append_items("s", ['{"n":1}', '{"n":2}'], now=T0) == [1, 2]
    assert store.agent_session_append_items("s", ['{"n":3}'], now=T0 + 1) == [3]
    assert store.agent_session_append_items("s", [], now=T0 + 2) == []  # nothing written
    assert store.agent_session_append_items("other", ["[]"], now=T0) == [1]  # its own numbering
    assert _rows(raw) == [(1, '{"n":1}'), (2, '{"n":2}'), (3, '{"n":3}')]
    assert _last_seq(raw) == [(3,)]
    assert store.agent_session_items("s") == [
        AgentSessionItem(1, '{"n":1}', T0),
        AgentSessionItem(2, '{"n":2}', T0),
        AgentSessionItem(3, '{"n":3}', T0 + 1),
    ]
    assert [i.seq for i in store.agent_session_items("s", limit=2)] == [
        2,
        3,
    ]  # newest two, in order
    assert [i.seq for i in store.agent_session_items("s", limit=10)] == [1, 2, 3]
    assert store.agent_session_items("s", limit=0) == []
    assert store.agent_session_items("nobody") == []


def test_many_items_in_one_append_keep_their_order(store: Store, raw: RawDatabase) -> None:
    texts = [f'{{"i":{i}}}' for i in range(1300)]  # more than one statement's worth of rows
    assert store.agent_session_append_items("s", texts, now=T0) == list(range(1, 1301))
    assert [item.item_json for item in store.agent_session_items("s")] == texts
    assert raw.count("oncewire_agents_items") == 1300


def test_a_pop_takes_the_newest_item_and_its_number_is_not_given_out_again(
    store: Store, raw: RawDatabase
) -> None:
    store.agent_session_append_items("s", ["1", "2", "3"], now=T0)
    popped = store.agent_session_pop_item("s", now=T0 + 5)
    assert popped == AgentSessionItem(3, "3", T0)
    assert _rows(raw) == [(1, "1"), (2, "2")]
    assert store.agent_session_append_items("s", ["4"], now=T0) == [4]  # not 3 again
    assert [store.agent_session_pop_item("s", now=T0) for _ in range(3)] == [
        AgentSessionItem(4, "4", T0),
        AgentSessionItem(2, "2", T0),
        AgentSessionItem(1, "1", T0),
    ]
    assert store.agent_session_pop_item("s", now=T0) is None  # empty, its row still there
    assert store.agent_session_pop_item("nobody", now=T0) is None
    assert raw.count("oncewire_agents_items") == 0


def test_a_clear_removes_the_session_and_the_next_append_starts_it_afresh(
    store: Store, raw: RawDatabase
) -> None:
    store.agent_session_append_items("s", ["1", "2"], now=T0)
    store.agent_session_append_items("keep", ["1"], now=T0)
    assert store.agent_session_clear_session("s") == 2
    assert _rows(raw) == [] and _last_seq(raw) == []
    assert store.agent_session_clear_session("s") == 0
    assert store.agent_session_items("keep") == [
        AgentSessionItem(1, "1", T0)
    ]  # another session untouched
    assert store.agent_session_append_items("s", ["again"], now=T0) == [1]


def test_the_in_tx_forms_commit_with_the_caller(store: Store, raw: RawDatabase) -> None:
    with store.transaction() as tx:
        assert store.agent_session_append_items_in_tx(tx, "s", ["1", "2", "3"], now=T0) == [1, 2, 3]
        assert store.agent_session_append_items_in_tx(tx, "s", [], now=T0) == []
        assert store.agent_session_pop_item_in_tx(tx, "s", now=T0) == AgentSessionItem(3, "3", T0)
        assert [i.item_json for i in store.agent_session_items_in_tx(tx, "s")] == ["1", "2"]
        assert [i.item_json for i in store.agent_session_items_in_tx(tx, "s", limit=1)] == ["2"]
        assert store.agent_session_items_in_tx(tx, "s", limit=0) == []
        assert store.agent_session_append_items_in_tx(tx, "gone", ["x"], now=T0) == [1]
        assert store.agent_session_clear_session_in_tx(tx, "gone") == 1
    assert _rows(raw) == [(1, "1"), (2, "2")]
    assert _last_seq(raw, "gone") == []


def test_the_in_tx_forms_leave_nothing_when_the_caller_rolls_back(
    store: Store, raw: RawDatabase
) -> None:
    store.agent_session_append_items("s", ["kept"], now=T0)
    with pytest.raises(RuntimeError), store.transaction() as tx:
        store.agent_session_append_items_in_tx(tx, "s", ["a", "b"], now=T0)
        store.agent_session_append_items_in_tx(tx, "new", ["c"], now=T0)
        store.agent_session_pop_item_in_tx(tx, "s", now=T0)
        raise RuntimeError("the caller's own failure")
    assert _rows(raw) == [(1, "kept")] and _last_seq(raw) == [(1,)]
    assert _last_seq(raw, "new") == [] and _rows(raw, "new") == []
    with pytest.raises(RuntimeError), store.transaction() as tx:
        assert store.agent_session_clear_session_in_tx(tx, "s") == 1
        raise RuntimeError("again")
    assert _rows(raw) == [(1, "kept")]


def test_an_in_tx_form_outside_an_open_transaction_is_refused(store: Store) -> None:
    with store.transaction() as tx:
        pass
    with pytest.raises(InvalidState):
        store.agent_session_append_items_in_tx(tx, "s", ["1"], now=T0)
    with pytest.raises(InvalidState):
        store.agent_session_pop_item_in_tx(tx, "s", now=T0)
    with pytest.raises(InvalidState):
        store.agent_session_clear_session_in_tx(tx, "s")
    with pytest.raises(InvalidState):
        store.agent_session_items_in_tx(tx, "s")


def test_bad_arguments_are_refused_before_anything_is_written(
    store: Store, raw: RawDatabase
) -> None:
    with pytest.raises(ConfigurationError):
        store.agent_session_append_items("", ["1"], now=T0)
    with pytest.raises(ConfigurationError):
        store.agent_session_append_items("s", ["1", 2], now=T0)  # type: ignore[list-item]
    with pytest.raises(ConfigurationError):
        store.agent_session_items("s", limit=-1)
    assert raw.count("oncewire_agents_items") == 0
    assert raw.count("oncewire_agents_sessions") == 0


def test_racing_pops_on_two_stores_never_take_the_same_item(store: Store, raw: RawDatabase) -> None:
    items = [str(i) for i in range(1, 41)]
    store.agent_session_append_items("s", items, now=T0)
    other = open_store(store.url)
    contenders = 8
    barrier = threading.Barrier(contenders)
    popped: list[list[AgentSessionItem | None]] = [[] for _ in range(contenders)]
    errors: list[BaseException] = []

    def pop(index: int) -> None:
        on = store if index % 2 else other
        try:
            barrier.wait(timeout=30)
            for _ in range(6):  # 48 pops for 40 items: the last ones find nothing
                popped[index].append(on.agent_session_pop_item("s", now=T0))
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=pop, args=(i,)) for i in range(contenders)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        other.close()
    assert not errors, errors
    taken = [item.item_json for got in popped for item in got if item is not None]
    assert sorted(taken, key=int) == items  # every item once, none twice
    for got in popped:  # each contender saw the session shrink from its newest end
        seqs = [item.seq for item in got if item is not None]
        assert seqs == sorted(seqs, reverse=True)
        assert all(item is None for item in got[len(seqs) :])  # once empty, empty
    assert raw.count("oncewire_agents_items") == 0


def test_racing_appends_interleave_whole_and_in_order(store: Store, raw: RawDatabase) -> None:
    other = open_store(store.url)
    writers, batches = 6, 5
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def append(index: int) -> None:
        on = store if index % 2 else other
        try:
            barrier.wait(timeout=30)
            for batch in range(batches):
                texts = [f'"{index}.{batch}.{k}"' for k in range(3)]
                on.agent_session_append_items("s", texts, now=T0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(i,)) for i in range(writers)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        other.close()
    assert not errors, errors
    rows = _rows(raw)
    assert [seq for seq, _ in rows] == list(range(1, writers * batches * 3 + 1))  # no gap
    texts = [str(text).strip('"') for _, text in rows]
    for start in range(0, len(texts), 3):  # each append's items are together, in order
        index, batch, _ = texts[start].split(".")
        assert texts[start : start + 3] == [f"{index}.{batch}.{k}" for k in range(3)]
    for index in range(writers):  # and each writer's appends are in the order it made them
        mine = [t.split(".")[1] for t in texts[::3] if t.startswith(f"{index}.")]
        assert mine == [str(b) for b in range(batches)]
