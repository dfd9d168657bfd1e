"""Durable runs against the real SDK: its Runner, function_tool and ScriptedModel, on both
backends. An uninterrupted run ends as the plain SDK's does; a run started again with its
run_key calls no model and runs no tool; handoffs and agents used as tools stay durable."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, function_tool
from agents.items import ModelResponse
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.usage import Usage

import oncewire
from oncewire import agents as durable
from oncewire.agents.responses import decode_response, encode_response
from oncewire.storage.records import EffectState

from . import scenario


@pytest.mark.parametrize("mode", ["sync", "async", "streamed"])
def test_an_uninterrupted_run_ends_as_the_plain_sdk_run_and_a_second_call_replays_it(
    tmp_path: Path, db: str, mode: str
) -> None:
    plain_folder = tmp_path / "plain"
    plain_folder.mkdir()
    plain = asyncio.run(Runner.run(scenario.build(plain_folder), "go")).final_output
    output = scenario.run(tmp_path, db, mode)
    assert output == plain == "done after 3 tool results"
    again = scenario.run(tmp_path, db, mode)
    assert again == output
    # Three model calls in all: the second run was answered from the record.
    assert (tmp_path / "calls.log").read_text().split() == ["0", "2", "3"]
    ledger = oncewire.Ledger(db)
    try:
        assert [s.step for s in ledger.store.agent_list_steps("run-1")] == [0, 1, 2]
        effects = {e.key: e.state for e in ledger.effects.list(limit=1000)}
        assert effects == {
            "agents/run-1/call-1": EffectState.DONE,
            "agents/run-1/call-2": EffectState.DONE,
            "agents/run-1/call-3": EffectState.DONE,
        }
    finally:
        ledger.close()
    tickets = scenario.receiver(tmp_path)
    with tickets.store.transaction() as tx:
        rows = tx.execute("SELECT key, COUNT(*) FROM tickets GROUP BY key ORDER BY key").fetchall()
    assert [tuple(r) for r in rows] == [("agents/run-1/call-1", 1), ("agents/run-1/call-3", 1)]


def test_a_recorded_response_is_given_back_as_an_equal_object() -> None:
    response = ModelResponse(
        output=[
            function_call("add", {"a": 1}, call_id="c1"),
            assistant_message("hello", item_id="m1"),
        ],
        usage=Usage(requests=1, input_tokens=12, output_tokens=5, total_tokens=17),
        response_id="resp-1",
        request_id="req-9",
    )
    assert decode_response(encode_response(response)) == response


def test_a_tool_that_keeps_raising_is_told_to_the_model_as_an_unknown_outcome(db: str) -> None:
    attempts: list[tuple[str, bool]] = []

    @function_tool
    def charge(amount: int) -> str:
        """Charge a card."""
        attempt = durable.current_attempt()
        attempts.append((attempt.key, attempt.redelivery))
        raise ConnectionError("the card network hung up")

    model = ScriptedModel(
        [[function_call("charge", {"amount": 5}, call_id="c1")], [assistant_message("sorry")]]
    )
    ledger = oncewire.Ledger(db)
    try:
        agent = Agent(name="cashier", model=model, tools=[charge])
        result = durable.run_sync(
            agent, "pay", ledger=ledger, run_key="pay-1", max_attempts=2, retry=scenario.RETRY
        )
        assert result.final_output == "sorry"
        assert attempts == [("agents/pay-1/c1", False), ("agents/pay-1/c1", True)]
        told = [i for i in model.calls[1].input if i.get("type") == "function_call_output"]
        assert told[0]["output"].startswith(oncewire.toolcalls.UNKNOWN_OUTCOME)
        assert ledger.effects.get("agents/pay-1/c1").state is EffectState.DEAD
    finally:
        ledger.close()


def test_a_tool_that_refuses_is_rejected_and_not_retried(db: str) -> None:
    runs: list[int] = []

    @function_tool
    def transfer(amount: int) -> str:
        """Transfer money."""
        runs.append(amount)
        raise durable.ToolRefused("over the daily limit")

    model = ScriptedModel(
        [[function_call("transfer", {"amount": 10**6}, call_id="c1")], [assistant_message("no")]]
    )
    ledger = oncewire.Ledger(db)
    try:
        agent = Agent(name="bank", model=model, tools=[transfer])
        durable.run_sync(agent, "send", ledger=ledger, run_key="t-1", retry=scenario.RETRY)
        assert runs == [10**6]
        told = [i for i in model.calls[1].input if i.get("type") == "function_call_output"]
        assert told[0]["output"] == "error: the tool refused the call: over the daily limit"
        assert ledger.effects.get("agents/t-1/c1").state is EffectState.REJECTED
    finally:
        ledger.close()


def test_a_handoff_and_an_agent_used_as_a_tool_are_durable_and_replayed(db: str) -> None:
    runs: list[str] = []

    @function_tool
    def lookup(word: str) -> str:
        """Look a word up."""
        runs.append(durable.current_attempt().key)
        return f"{word}: a greeting"

    def models() -> tuple[ScriptedModel, ScriptedModel, ScriptedModel]:
        inner = ScriptedModel(
            [
                [function_call("lookup", {"word": "hello"}, call_id="in-1")],
                [assistant_message("hello is a greeting")],
            ]
        )
        specialist = ScriptedModel(
            [
                [function_call("dictionary", {"input": "hello"}, call_id="sp-1")],
                [assistant_message("the specialist says: hello is a greeting")],
            ]
        )
        triage = ScriptedModel([[function_call("transfer_to_specialist", {}, call_id="h-1")]])
        return inner, specialist, triage

    def build(inner: Any, specialist: Any, triage: Any) -> Agent[Any]:
        dictionary = Agent(name="dictionary", model=inner, tools=[lookup])
        expert = Agent(
            name="specialist",
            model=specialist,
            tools=[dictionary.as_tool("dictionary", "Look words up")],
        )
        return Agent(name="triage", model=triage, handoffs=[expert])

    plain = asyncio.run(Runner.run(build(*models()), "what is hello?")).final_output
    runs.clear()
    ledger = oncewire.Ledger(db)
    try:
        first = asyncio.run(
            durable.run(build(*models()), "what is hello?", ledger=ledger, run_key="h")
        )
        assert first.final_output == plain == "the specialist says: hello is a greeting"
        assert first.last_agent.name == "specialist"
        outer = "agents/h/sp-1"
        assert runs == [f"agents/{outer.replace('/', '%2F')}/in-1"]
        # The nested run's steps are recorded under the tool call's effect key.
        assert [s.step for s in ledger.store.agent_list_steps(outer)] == [0, 1]
        assert [s.step for s in ledger.store.agent_list_steps("h")] == [0, 1, 2]
        # Started again: every model call is answered from the record, no tool runs.
        silent = [ScriptedModel([]) for _ in range(3)]
        again = asyncio.run(
            durable.run(build(*silent), "what is hello?", ledger=ledger, run_key="h")
        )
        assert again.final_output == plain
        assert [len(model.calls) for model in silent] == [0, 0, 0]
        assert len(runs) == 1
    finally:
        ledger.close()


def test_current_attempt_outside_a_durable_tool_says_there_is_no_key() -> None:
    with pytest.raises(oncewire.errors.InvalidState, match=r"oncewire\.agents\.run"):
        durable.current_attempt()
