"""Runs inside durable runs: a guardrail's agent, agents used as tools nested and fanned out,
and the dispatchers that perform their calls. Real SDK Runner, function tools and scripted
models; a crashed run is a real child killed with SIGKILL; every check reads the stores."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    Runner,
    ToolGuardrailFunctionOutput,
    function_tool,
    output_guardrail,
    tool_input_guardrail,
)
from agents.testing import ScriptedModel, assistant_message, function_call

import oncewire
from oncewire import agents as durable
from oncewire.agents.scope import Scope, call_key, nested_key
from oncewire.agents.tools import inline_for
from oncewire.dispatch.retry import RetryPolicy
from oncewire.storage.records import EffectState
from tests.agents import nested_scenario as scenario
from tests.support.pg import fresh_schema, server_url

CHILD = "import sys\nfrom tests.agents.nested_scenario import main\nsys.exit(main(sys.argv[1:]))"
ROOT = Path(__file__).parents[2]
CHECKER_KEY = nested_key("g", "input_guardrail:check:checker", 0)


def _lines(folder: Path, name: str) -> list[str]:
    path = folder / name
    return path.read_text().split("\n")[:-1] if path.exists() else []


def _steps(db: str, run_key: str) -> list[int]:
    ledger = oncewire.Ledger(db)
    try:
        return [step.step for step in ledger.store.agent_list_steps(run_key)]
    finally:
        ledger.close()


def _effects(db: str) -> dict[str, tuple[EffectState, int]]:
    ledger = oncewire.Ledger(db)
    try:
        return {e.key: (e.state, e.attempts) for e in ledger.effects.list(limit=1000)}
    finally:
        ledger.close()


def _run(agent: Agent[Any], db: str, run_key: str, **kwargs: Any) -> Any:
    """``durable.run`` of ``agent`` on a ledger of its own, closed after."""
    ledger = oncewire.Ledger(db)
    try:
        return asyncio.run(durable.run(agent, "go", ledger=ledger, run_key=run_key, **kwargs))
    finally:
        ledger.close()


def _child(python_child: Any, child_env: Any, *args: str, **env: str) -> tuple[int, str, str]:
    child = python_child(CHILD, *args, env=child_env(**env), cwd=str(ROOT))
    out, err = child.communicate(timeout=120)
    return child.returncode, out, err


# -- guardrails --------------------------------------------------------------------------------
@pytest.mark.parametrize("instructions", [False, True], ids=["no-instructions", "instructions"])
def test_a_guardrails_agent_has_steps_of_its_own_and_the_run_answers_with_its_agent(
    tmp_path: Path, db: str, instructions: bool
) -> None:
    """The guardrail's agent runs concurrently with the main agent's first model call: each
    records under its own key, so the run ends with the main agent's answer (not the checker's,
    not RunDiverged), and a second call replays both without asking either model."""
    agent = scenario.guarded(tmp_path, instructions=instructions)
    result = _run(agent, db, "g", retry=scenario.RETRY)
    assert result.final_output == scenario.GUARDED_ANSWER
    assert result.input_guardrail_results[0].output.output_info == scenario.CHECKER_ANSWER
    assert _lines(tmp_path, "tools.log") == ["agents/g/w-1 0"]
    assert (_steps(db, "g"), _steps(db, CHECKER_KEY)) == ([0, 1], [0])
    asked = _lines(tmp_path, "calls.log")
    assert sorted(asked) == ["checker:0", "main:0", "main:1"]

    again = _run(scenario.guarded(tmp_path, instructions=instructions), db, "g")
    assert again.final_output == scenario.GUARDED_ANSWER
    assert again.input_guardrail_results[0].output.output_info == scenario.CHECKER_ANSWER
    assert _lines(tmp_path, "calls.log") == asked
    assert _lines(tmp_path, "tools.log") == ["agents/g/w-1 0"]


def test_output_and_tool_guardrails_agents_are_keyed_by_the_guardrail(tmp_path: Path) -> None:
    db = str(tmp_path / "caller.sqlite")

    def checker() -> Agent[Any]:
        return Agent(name="checker", model=scenario.scripted(tmp_path, "checker", {}, "fine"))

    @tool_input_guardrail
    async def vet(data: Any) -> ToolGuardrailFunctionOutput:
        result = await Runner.run(checker(), "vet the call")
        return ToolGuardrailFunctionOutput.allow(result.final_output)

    @output_guardrail
    async def review(ctx: Any, agent: Any, output: Any) -> GuardrailFunctionOutput:
        result = await Runner.run(checker(), str(output))
        return GuardrailFunctionOutput(output_info=result.final_output, tripwire_triggered=False)

    @function_tool(tool_input_guardrails=[vet])
    def work(n: int) -> str:
        """Work on a number."""
        return f"worked on {n}"

    def agent() -> Agent[Any]:
        calls = {0: [function_call("work", {"n": 7}, call_id="w-1")]}
        return Agent(
            name="main",
            model=scenario.scripted(tmp_path, "main", calls, "done"),
            tools=[work],
            output_guardrails=[review],
        )

    assert _run(agent(), db, "o").final_output == "done"
    keys = [
        nested_key("o", "tool_input_guardrail:vet@w-1:checker", 0),
        nested_key("o", "output_guardrail:review:checker", 0),
    ]
    assert [_steps(db, key) for key in ["o", *keys]] == [[0, 1], [0], [0]]
    asked = _lines(tmp_path, "calls.log")
    assert _run(agent(), db, "o").final_output == "done"
    assert _lines(tmp_path, "calls.log") == asked  # all three answered from the record


@pytest.mark.crash
@pytest.mark.parametrize(
    ("point", "backend"),
    [
        ("agents.step_recorded@1", "sqlite"),  # the first of the two concurrent steps
        ("agents.step_recorded@2", "postgresql"),  # the second of them
        ("agents.tool_performing", "sqlite"),  # the tool about to run, both steps recorded
    ],
)
def test_a_guarded_run_killed_and_resumed_replays_both_agents_exactly(
    tmp_path: Path, point: str, backend: str, python_child: Any, child_env: Any
) -> None:
    if backend == "sqlite":
        _guarded_killed_and_resumed(
            tmp_path, str(tmp_path / "caller.sqlite"), point, python_child, child_env
        )
        return
    with fresh_schema(server_url(), "agents") as url:
        _guarded_killed_and_resumed(tmp_path, url, point, python_child, child_env)


def _guarded_killed_and_resumed(
    folder: Path, db: str, point: str, python_child: Any, child_env: Any
) -> None:
    args = ("--folder", str(folder), "--db", db, "--agent", "guarded", "--run-key", "g")
    token = str(folder / "token")
    code, _, err = _child(
        python_child, child_env, *args, ONCEWIRE_CRASH=point, ONCEWIRE_CRASH_TOKEN=token
    )
    assert code == -signal.SIGKILL, err
    code, out, err = _child(python_child, child_env, *args)
    assert code == 0, err  # a RunDiverged would end the child with an error
    assert json.loads(out.strip().splitlines()[-1])["final_output"] == scenario.GUARDED_ANSWER
    assert (_steps(db, "g"), _steps(db, CHECKER_KEY)) == ([0, 1], [0])
    assert _effects(db)["agents/g/w-1"][0] is EffectState.DONE
    # Each step is asked at most once more than it was recorded (the one cut by the kill).
    asked = Counter(_lines(folder, "calls.log"))
    assert set(asked) == {"checker:0", "main:0", "main:1"}
    assert sum(asked.values()) <= 4
    # Resumed again: everything answered from the record, the tool not run again.
    tools = _lines(folder, "tools.log")
    code, out, err = _child(python_child, child_env, *args)
    assert code == 0, err
    assert Counter(_lines(folder, "calls.log")) == asked
    assert _lines(folder, "tools.log") == tools


def test_a_resumed_run_of_another_agent_or_with_other_tools_is_refused(tmp_path: Path) -> None:
    """The request digest covers the agent's name and its tools' names (docs/agents.md)."""
    db = str(tmp_path / "caller.sqlite")

    def agent(name: str, *tools: str) -> Agent[Any]:
        model = ScriptedModel([[assistant_message("hi")]])
        return Agent(
            name=name,
            instructions="Same.",
            model=model,
            tools=[scenario.logged_tool(tmp_path, tool) for tool in tools],
        )

    _run(agent("a", "x"), db, "r")
    for changed in (agent("b", "x"), agent("a", "x", "y"), agent("a")):
        with pytest.raises(durable.RunDiverged):
            _run(changed, db, "r")
    assert _run(agent("a", "x"), db, "r").final_output == "hi"


def test_a_step_recorded_with_the_first_digest_format_is_still_replayed(tmp_path: Path) -> None:
    """Steps recorded before the digest covered the agent and its tools (a bare sha256 of the
    instructions and the input items) replay as they did."""
    db = str(tmp_path / "caller.sqlite")
    ledger = oncewire.Ledger(db)
    try:
        asyncio.run(
            durable.run(
                Agent(
                    name="a", instructions="Old.", model=ScriptedModel([[assistant_message("old")]])
                ),
                "go",
                ledger=ledger,
                run_key="old",
            )
        )
        material = {"instructions": "Old.", "input": [{"content": "go", "role": "user"}]}
        text = json.dumps(material, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
        with ledger.store.transaction() as tx:
            tx.execute(
                "UPDATE oncewire_agent_steps SET request_digest = :d WHERE run_key = 'old'",
                {"d": hashlib.sha256(text.encode()).hexdigest()},
            )
        silent = Agent(name="renamed", instructions="Old.", model=ScriptedModel([]))
        again = asyncio.run(durable.run(silent, "go", ledger=ledger, run_key="old"))
        assert again.final_output == "old"
        changed = Agent(name="a", instructions="New.", model=ScriptedModel([]))
        with pytest.raises(durable.RunDiverged):
            asyncio.run(durable.run(changed, "go", ledger=ledger, run_key="old"))
    finally:
        ledger.close()


# -- agents as tools ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("concurrency", "width"), [(1, 2), (2, 3), (8, 9)], ids=["c1-w2", "c2-w3", "c8-w9"]
)
def test_agents_used_as_tools_nested_two_deep_and_wider_than_concurrency_finish(
    tmp_path: Path, db: str, concurrency: int, width: int
) -> None:
    """Each agent-tool holds a slot of its depth while its run's calls are performed at the
    next depth: nothing waits for a slot its parent holds, every effect ends done once."""
    agent = scenario.nested(tmp_path, width)
    result = _run(agent, db, "n", concurrency=concurrency, retry=scenario.RETRY)
    assert result.final_output == f"all {width} helped"
    helpers = [call_key("n", f"h-{n}") for n in range(width)]
    deeps = [call_key(helper, "d") for helper in helpers]
    leaves = [call_key(helper, "l") for helper in helpers] + [call_key(d, "l") for d in deeps]
    assert _effects(db) == {key: (EffectState.DONE, 1) for key in helpers + deeps + leaves}
    assert sorted(_lines(tmp_path, "tools.log")) == sorted(f"{key} 0" for key in leaves)


def test_cancelling_a_run_ends_its_wait_and_the_call_resumes_as_a_redelivery(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "caller.sqlite")
    started: list[bool] = []
    finish = False

    @function_tool
    async def hang() -> str:
        """Hang until told."""
        started.append(durable.current_attempt().redelivery)
        while not finish:
            await asyncio.sleep(0.01)
        return "finished"

    def agent() -> Agent[Any]:
        model = ScriptedModel(
            [[function_call("hang", {}, call_id="c-1")], [assistant_message("over")]]
        )
        return Agent(name="waiter", model=model, tools=[hang])

    async def bounded(ledger: oncewire.Ledger) -> None:
        await asyncio.wait_for(
            durable.run(agent(), "go", ledger=ledger, run_key="w", retry=scenario.RETRY), 1.0
        )

    ledger = oncewire.Ledger(db)
    try:
        with pytest.raises(TimeoutError):
            asyncio.run(bounded(ledger))
    finally:
        ledger.close()
    assert started == [False]
    finish = True
    result = _run(agent(), db, "w", retry=scenario.RETRY)
    assert result.final_output == "over"
    assert started == [False, True]  # the cancelled attempt may have acted: flagged
    assert _effects(db)["agents/w/c-1"] == (EffectState.DONE, 2)


# -- the dispatchers ---------------------------------------------------------------------------
def test_runs_with_other_settings_get_dispatchers_of_their_own(tmp_path: Path) -> None:
    db = str(tmp_path / "caller.sqlite")
    ledger = oncewire.Ledger(db)
    in_flight: list[int] = []
    leases: list[float] = []
    peak = 0

    @function_tool
    async def wait_for_peers(n: int, want: int) -> str:
        """Wait until ``want`` calls run at once (or give up)."""
        nonlocal peak
        effect = ledger.store.get_effect(durable.current_attempt().key)
        assert effect is not None and effect.lease_expires_at is not None
        leases.append(effect.lease_expires_at - time.time())
        in_flight.append(n)
        peak = max(peak, len(in_flight))
        for _ in range(1000):  # at most 10 s
            if len(in_flight) >= want or peak >= want:
                break
            await asyncio.sleep(0.01)
        in_flight.remove(n)
        return "ok"

    def agent(count: int) -> Agent[Any]:
        calls = [
            function_call("wait_for_peers", {"n": n, "want": count}, call_id=f"c-{n}")
            for n in range(count)
        ]
        model = ScriptedModel([calls, [assistant_message("done")]])
        return Agent(name="peers", model=model, tools=[wait_for_peers])

    try:
        asyncio.run(durable.run(agent(1), "go", ledger=ledger, run_key="first", concurrency=1))
        assert peak == 1
        asyncio.run(
            durable.run(
                agent(3), "go", ledger=ledger, run_key="second", concurrency=3, lease_seconds=300
            )
        )
        assert peak == 3  # the second run's concurrency, not the first's
        assert leases[0] < 60 < min(leases[1:])  # and its lease
        policy = RetryPolicy(base_seconds=0.01, cap_seconds=0.01)
        _, with_policy = inline_for(Scope(ledger, "third", retry=policy))
        _, same = inline_for(Scope(ledger, "fourth", retry=RetryPolicy(0.01, 0.01)))
        _, default = inline_for(Scope(ledger, "fifth"))
        assert with_policy is same and with_policy.retry is policy
        assert default is not with_policy and default.retry is None
    finally:
        ledger.close()


def test_a_crashed_runs_pending_call_is_left_for_it_while_another_run_goes_on(
    tmp_path: Path, db: str, python_child: Any, child_env: Any
) -> None:
    """The inline dispatcher claims only the calls its process's runs wait for: another run's
    pending call (its process died) is neither claimed nor charged, and its own run performs
    it when resumed, as a first delivery."""
    args = ("--folder", str(tmp_path), "--db", db, "--agent", "clerk", "--run-key", "abandoned")
    code, _, err = _child(python_child, child_env, *args, ONCEWIRE_CRASH="agents.tool_accepted")
    assert code == -signal.SIGKILL, err
    abandoned = "agents/abandoned/t-1"
    assert _effects(db)[abandoned] == (EffectState.PENDING, 0)

    live = scenario.clerk(tmp_path, "live")
    result = _run(live, db, "live", retry=scenario.RETRY)
    assert result.final_output == "live: ticket opened"
    ledger = oncewire.Ledger(db)
    try:
        left = ledger.store.get_effect(abandoned)
        assert left is not None
        assert (left.state, left.attempts, left.fence) == (EffectState.PENDING, 0, 0)
    finally:
        ledger.close()
    assert _lines(tmp_path, "tools.log") == ["agents/live/t-1 0"]

    code, out, err = _child(python_child, child_env, *args)
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["final_output"] == "abandoned: ticket opened"
    assert _lines(tmp_path, "tools.log") == ["agents/live/t-1 0", f"{abandoned} 0"]
    assert _effects(db)[abandoned] == (EffectState.DONE, 1)
