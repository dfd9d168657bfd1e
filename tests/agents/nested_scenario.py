"""The agents the nesting tests run, in this process or in a child (``main``).

* ``guarded``: an agent with a tool and an input guardrail that runs an agent of its own (the
  SDK runs the guardrail concurrently with the agent's first model call);
* ``clerk``: an agent that opens one ticket with a tool, then answers;
* ``nested``: an agent fanning out to ``width`` agents used as tools, each calling a leaf tool
  and an agent used as a tool that calls the leaf tool too (agents as tools two deep).

Every model answers from its input (how many tool results it holds), so whichever order the
SDK asks concurrent runs in, each gets the same answer for the same step. Model calls and
tool attempts are appended to ``calls.log`` and ``tools.log`` in the folder, across processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    GuardrailFunctionOutput,
    Runner,
    function_tool,
    input_guardrail,
    set_tracing_disabled,
)
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

import oncewire
from oncewire import agents as durable
from oncewire.dispatch.retry import RetryPolicy

set_tracing_disabled(True)

RETRY = RetryPolicy(base_seconds=0.05, cap_seconds=0.2)
GUARDED_ANSWER = "main: worked on 7"
CHECKER_ANSWER = "checker: the input is fine"


def outputs(call: Any) -> int:
    items = call.input if isinstance(call.input, list) else []
    return sum(
        1 for item in items if isinstance(item, dict) and item.get("type") == "function_call_output"
    )


def log(folder: Path, name: str, line: str) -> None:
    with open(folder / name, "a") as file:
        file.write(line + "\n")


def scripted(folder: Path, name: str, answers: dict[int, list[Any]], final: str) -> ScriptedModel:
    """A model named ``name`` answering by how many tool results its input holds."""

    def answer(call: Any) -> Any:
        seen = outputs(call)
        log(folder, "calls.log", f"{name}:{seen}")
        return answers.get(seen, [assistant_message(final)])

    return ScriptedModel([ModelStep.respond(answer) for _ in range(64)])


def logged_tool(folder: Path, name: str) -> Any:
    @function_tool(name_override=name)
    def work(n: int) -> str:
        """Work on a number."""
        attempt = durable.current_attempt()
        log(folder, "tools.log", f"{attempt.key} {int(attempt.redelivery)}")
        return f"worked on {n}"

    return work


def guarded(folder: Path, *, instructions: bool = True) -> Agent[Any]:
    checker = Agent(
        name="checker",
        instructions="Check the input." if instructions else None,
        model=scripted(folder, "checker", {}, CHECKER_ANSWER),
    )

    @input_guardrail
    async def check(ctx: Any, agent: Any, input: Any) -> GuardrailFunctionOutput:
        result = await Runner.run(checker, input, context=ctx.context)
        return GuardrailFunctionOutput(output_info=result.final_output, tripwire_triggered=False)

    calls = {0: [function_call("work", {"n": 7}, call_id="w-1")]}
    return Agent(
        name="main",
        instructions="Do the work." if instructions else None,
        model=scripted(folder, "main", calls, GUARDED_ANSWER),
        tools=[logged_tool(folder, "work")],
        input_guardrails=[check],
    )


def clerk(folder: Path, name: str) -> Agent[Any]:
    calls = {0: [function_call("work", {"n": 1}, call_id="t-1")]}
    return Agent(
        name=name,
        instructions="Open a ticket.",
        model=scripted(folder, name, calls, f"{name}: ticket opened"),
        tools=[logged_tool(folder, "work")],
    )


def nested(folder: Path, width: int) -> Agent[Any]:
    leaf = logged_tool(folder, "leaf")
    deep = Agent(
        name="deep",
        model=scripted(folder, "deep", {0: [function_call("leaf", {"n": 2}, call_id="l")]}, "deep"),
        tools=[leaf],
    )
    helper_calls = [
        function_call("leaf", {"n": 1}, call_id="l"),
        function_call("deep", {"input": "dig"}, call_id="d"),
    ]
    helper = Agent(
        name="helper",
        model=scripted(folder, "helper", {0: helper_calls}, "helped"),
        tools=[leaf, deep.as_tool("deep", "Dig deeper")],
    )
    fan = [function_call("helper", {"input": f"job {n}"}, call_id=f"h-{n}") for n in range(width)]
    return Agent(
        name="outer",
        model=scripted(folder, "outer", {0: fan}, f"all {width} helped"),
        tools=[helper.as_tool("helper", "Help")],
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--folder", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--agent", choices=["guarded", "clerk"], required=True)
    parser.add_argument("--run-key", required=True)
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    agent = guarded(folder) if args.agent == "guarded" else clerk(folder, args.run_key)
    ledger = oncewire.Ledger(args.db)
    try:
        result = asyncio.run(
            durable.run(agent, "go", ledger=ledger, run_key=args.run_key, retry=RETRY)
        )
    finally:
        ledger.close()
    print(json.dumps({"final_output": result.final_output}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
