"""OncewireSession's ``_in_tx`` forms in the caller's transaction, beside the caller's own rows
and an accepted effect: all of it commits together, and a rollback leaves nothing (no item, no
effect, no row; a popped or cleared item back in its place). A mutation whose awaiting task is
cancelled has ended before the cancellation is delivered."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.agents import OncewireSession
from oncewire.core.errors import InvalidPayload, WrongType

ITEMS: list[Any] = [
    {"role": "user", "content": "charge the card"},
    {"type": "function_call", "call_id": "c1", "name": "charge", "arguments": '{"cents":500}'},
]


@pytest.fixture
def ledger(db_url: str) -> Iterator[Ledger]:
    with Ledger(db_url) as opened:
        with opened.transaction() as tx:
            tx.execute("CREATE TABLE run_steps (step INTEGER PRIMARY KEY, note TEXT NOT NULL)")
        yield opened


def _steps(ledger: Ledger) -> list[tuple[Any, ...]]:
    with ledger.transaction() as tx:
        return [tuple(row) for row in tx.execute("SELECT step, note FROM run_steps").fetchall()]


def test_items_commit_with_the_callers_rows_and_effects(ledger: Ledger) -> None:
    session = OncewireSession("run-1", ledger)
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO run_steps (step, note) VALUES (:s, :n)", {"s": 1, "n": "model"})
        session.add_items_in_tx(tx, ITEMS)
        tx.accept("run-1:c1", "charge", {"cents": 500})
        assert session.get_items_in_tx(tx) == ITEMS  # its own writes, before the commit
        # Another connection does not see them yet.
        assert asyncio.run(OncewireSession("run-1", ledger).get_items()) == []
    assert asyncio.run(session.get_items()) == ITEMS
    assert _steps(ledger) == [(1, "model")]
    assert ledger.effects.find("run-1:c1") is not None


def test_a_rollback_leaves_nothing(ledger: Ledger) -> None:
    session = OncewireSession("run-1", ledger)
    asyncio.run(session.add_items(ITEMS[:1]))
    with pytest.raises(RuntimeError), ledger.transaction() as tx:
        tx.execute("INSERT INTO run_steps (step, note) VALUES (:s, :n)", {"s": 1, "n": "model"})
        session.add_items_in_tx(tx, ITEMS[1:])
        tx.accept("run-1:c1", "charge", {"cents": 500})
        raise RuntimeError("the process fails before the commit")
    assert asyncio.run(session.get_items()) == ITEMS[:1]
    assert _steps(ledger) == []
    assert ledger.effects.find("run-1:c1") is None
    asyncio.run(session.add_items(ITEMS[1:]))
    with pytest.raises(RuntimeError), ledger.transaction() as tx:
        assert session.pop_item_in_tx(tx) == ITEMS[1]
        assert session.get_items_in_tx(tx) == ITEMS[:1]
        raise RuntimeError("undone")
    with pytest.raises(RuntimeError), ledger.transaction() as tx:
        session.clear_session_in_tx(tx)
        assert session.get_items_in_tx(tx) == []
        raise RuntimeError("undone")
    assert asyncio.run(session.get_items()) == ITEMS  # both back, in their places
    with ledger.transaction() as tx:
        assert session.pop_item_in_tx(tx) == ITEMS[1]
        session.clear_session_in_tx(tx)
    assert asyncio.run(session.get_items()) == []


def test_an_item_that_is_not_plain_json_is_refused_and_nothing_is_written(
    ledger: Ledger,
) -> None:
    session = OncewireSession("s", ledger)
    with pytest.raises(InvalidPayload):
        asyncio.run(session.add_items([{"ok": 1}, {"score": float("nan")}]))
    with pytest.raises(InvalidPayload), ledger.transaction() as tx:
        session.add_items_in_tx(tx, [{"when": object()}])
    with pytest.raises(WrongType):
        asyncio.run(session.get_items(limit="3"))  # type: ignore[arg-type]
    with pytest.raises(WrongType):
        OncewireSession("s", "not a ledger")  # type: ignore[arg-type]
    assert asyncio.run(session.get_items()) == []


def test_a_cancelled_mutation_has_ended_before_the_cancellation_arrives(ledger: Ledger) -> None:
    session = OncewireSession("s", ledger)

    async def main() -> None:
        adding = asyncio.ensure_future(session.add_items(ITEMS))
        await asyncio.sleep(0)  # it has handed its write to a thread
        adding.cancel()
        with pytest.raises(asyncio.CancelledError):
            await adding
        assert await session.get_items() == ITEMS  # the write ended, committed
        popping = asyncio.ensure_future(session.pop_item())
        await asyncio.sleep(0)
        popping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await popping
        assert await session.get_items() == ITEMS[:1]

    asyncio.run(main())
