"""OncewireSession against the SDK's own SQLiteSession: random sequences of add_items,
get_items(limit), pop_item and clear_session (over two sessions, with a default limit in
session_settings or none) applied to both, every answer compared, on both backends."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from agents import SQLiteSession
from agents.memory import Session, SessionSettings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncewire import Ledger
from oncewire.agents import OncewireSession

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_finite = st.floats(allow_nan=False, allow_infinity=False)

# Items shaped as the SDK's input items are (messages, tool calls and their outputs), with
# values of every JSON kind.
_item = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": _text}),
    st.fixed_dictionaries(
        {
            "type": st.just("message"),
            "role": st.just("assistant"),
            "id": _text,
            "status": st.just("completed"),
            "content": st.lists(
                st.fixed_dictionaries(
                    {"type": st.just("output_text"), "text": _text, "annotations": st.just([])}
                ),
                max_size=2,
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": _text,
            "name": _text,
            "arguments": _text,
        }
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": _text, "output": _text},
        optional={"score": _finite, "n": st.integers(), "ok": st.booleans(), "none": st.none()},
    ),
)
_limit = st.sampled_from([None, -3, -1, 0, 1, 2, 3, 7])
_op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 1), st.lists(_item, max_size=4)),
    st.tuples(st.just("get"), st.integers(0, 1), _limit),
    st.tuples(st.just("pop"), st.integers(0, 1)),
    st.tuples(st.just("clear"), st.integers(0, 1)),
)
_numbers = itertools.count()


async def _apply(op: tuple[Any, ...], session: Session) -> Any:
    if op[0] == "add":
        return await session.add_items(list(op[2]))
    if op[0] == "get":
        return await session.get_items(op[2])
    if op[0] == "pop":
        return await session.pop_item()
    return await session.clear_session()


async def _compare(ledger: Ledger, ops: list[tuple[Any, ...]], default_limit: int | None) -> None:
    number = next(_numbers)
    options = {"session_settings": SessionSettings(limit=default_limit)}
    ours = [OncewireSession(f"conv-{number}-{i}", ledger, **options) for i in (0, 1)]
    theirs = [SQLiteSession(f"conv-{i}", **options) for i in (0, 1)]  # in memory, shared
    try:
        for step, op in enumerate(ops):
            got = await _apply(op, ours[op[1]])
            expected = await _apply(op, theirs[op[1]])
            assert got == expected, (step, op)
        for mine, reference in zip(ours, theirs, strict=True):
            assert await mine.get_items() == await reference.get_items()
            assert await mine.get_items(limit=-1) == await reference.get_items(limit=-1)
    finally:
        for session in theirs:
            session.close()


@pytest.fixture
def ledger(db_url: str) -> Any:
    opened = Ledger(db_url)
    yield opened
    opened.close()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=st.lists(_op, max_size=25), default_limit=st.sampled_from([None, 0, 2, -1]))
def test_every_answer_is_the_one_sqlite_session_gives(
    ledger: Ledger, ops: list[tuple[Any, ...]], default_limit: int | None
) -> None:
    asyncio.run(_compare(ledger, ops, default_limit))


def test_a_long_fixed_sequence_matches_too(ledger: Ledger) -> None:
    """Past what the random sequences reach: many items, pops down to empty and past it."""
    items: list[Any] = [{"role": "user", "content": f"m{i}"} for i in range(60)]
    ops: list[tuple[Any, ...]] = [("add", 0, items[:30]), ("add", 1, items[30:])]
    ops += [("get", 0, limit) for limit in (None, 0, 1, 29, 30, 31, -1)]
    ops += [("pop", 0)] * 32 + [("get", 0, None), ("add", 0, items[:3]), ("get", 0, 2)]
    ops += [("clear", 1), ("get", 1, None), ("pop", 1), ("add", 1, items[:1]), ("get", 1, 5)]
    asyncio.run(_compare(ledger, ops, None))
    asyncio.run(_compare(ledger, ops, 4))
