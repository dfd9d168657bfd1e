"""OncewireSession used by the SDK's own Runner: a multi-turn conversation with a tool, scripted
with ``agents.testing.ScriptedModel``, run async, sync and streamed on both backends. What the
model is shown at each call, and what the session holds at the end, equal what the SDK's own
SQLiteSession gives on the same turns; a new process (a new Ledger on the same database)
carries the conversation on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, SQLiteSession, function_tool
from agents.memory import Session, SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call

from oncewire import Ledger
from oncewire.agents import OncewireSession

TURNS = ["hi", "add 2 and 3", "and 10 and 20?", "thanks"]
CONFIG = RunConfig(tracing_disabled=True)


@function_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _script() -> ScriptedModel:
    """Four turns: a greeting, a tool call and its answer, another tool call, a goodbye."""
    return ScriptedModel(
        [
            [assistant_message("hello", item_id="m1")],
            [function_call("add", {"a": 2, "b": 3}, call_id="c1")],
            [assistant_message("5", item_id="m2")],
            [function_call("add", {"a": 10, "b": 20}, call_id="c2")],
            [assistant_message("30", item_id="m3")],
            [assistant_message("bye", item_id="m4")],
        ]
    )


def _agent(model: ScriptedModel) -> Agent[Any]:
    return Agent(name="adder", instructions="Add numbers.", model=model, tools=[add])


async def _turn(mode: str, agent: Agent[Any], text: str, session: Session) -> Any:
    if mode == "async":
        return (await Runner.run(agent, text, session=session, run_config=CONFIG)).final_output
    if mode == "sync":  # run_sync needs a thread without a running loop
        return await asyncio.to_thread(_run_sync, agent, text, session)
    streamed = Runner.run_streamed(agent, text, session=session, run_config=CONFIG)
    async for _ in streamed.stream_events():
        pass
    return streamed.final_output


def _run_sync(agent: Agent[Any], text: str, session: Session) -> Any:
    try:
        return Runner.run_sync(agent, text, session=session, run_config=CONFIG).final_output
    finally:  # run_sync leaves the loop it set as this thread's default open
        policy = asyncio.get_event_loop_policy()
        policy.get_event_loop().close()
        policy.set_event_loop(None)


async def _conversation(mode: str, session: Session) -> tuple[list[Any], list[Any], list[Any]]:
    model = _script()
    agent = _agent(model)
    outputs = [await _turn(mode, agent, text, session) for text in TURNS]
    model.assert_complete()
    return outputs, [call.input for call in model.calls], await session.get_items()


@pytest.mark.parametrize("mode", ["async", "sync", "streamed"])
def test_the_model_sees_the_history_sqlite_session_would_show_it(db_url: str, mode: str) -> None:
    async def main() -> None:
        reference = SQLiteSession("conversation")
        try:
            expected = await _conversation(mode, reference)
        finally:
            reference.close()
        with Ledger(db_url) as ledger:
            session = OncewireSession("conversation", ledger)
            assert isinstance(session, Session)  # the SDK's runtime-checkable protocol
            got = await _conversation(mode, session)
        assert got[0] == ["hello", "5", "30", "bye"] == expected[0]
        assert got[1] == expected[1]  # every model call's input, history included
        assert got[2] == expected[2]
        assert len(got[2]) == 4 + 4 + 2 * 2  # the turns, the answers, two calls, two outputs

    asyncio.run(main())


def test_a_default_limit_trims_the_history_as_it_does_for_sqlite_session(db_url: str) -> None:
    async def main() -> None:
        settings = SessionSettings(limit=3)
        reference = SQLiteSession("conversation", session_settings=settings)
        try:
            expected = await _conversation("async", reference)
        finally:
            reference.close()
        with Ledger(db_url) as ledger:
            session = OncewireSession("conversation", ledger, session_settings={"limit": 3})
            got = await _conversation("async", session)
        assert got == expected
        assert len(got[1][-1]) <= 3 + 1  # the last call saw three items of history and the turn

    asyncio.run(main())


def test_a_new_process_carries_the_conversation_on(db_url: str) -> None:
    """Two turns, the ledger closed (the process gone), a new ledger on the same database:
    the next turns see the first two, as one SQLiteSession would across the four."""

    async def main() -> None:
        reference = SQLiteSession("conversation")
        try:
            expected = await _conversation("async", reference)
        finally:
            reference.close()
        model = _script()
        agent = _agent(model)
        outputs = []
        with Ledger(db_url) as ledger:
            first = OncewireSession("conversation", ledger)
            for text in TURNS[:2]:
                outputs.append(await _turn("async", agent, text, first))
        with Ledger(db_url) as ledger:
            second = OncewireSession("conversation", ledger)
            for text in TURNS[2:]:
                outputs.append(await _turn("async", agent, text, second))
            items = await second.get_items()
        assert (outputs, [call.input for call in model.calls], items) == expected

    asyncio.run(main())
