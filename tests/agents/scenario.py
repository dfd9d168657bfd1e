"""The agent the in-process tests run (the crash tests run the lab's: oncewire.lab.suites.agents).

A scripted model (the SDK's own ``ScriptedModel``, answering by how many tool results its input
holds, so a resumed run gets the same answer for the same step) asks for two tools at once,
then a third call, then answers. ``ticket`` writes a ticket into a receiver store under a
receipt keyed by ``current_attempt().key`` and logs every attempt (key, redelivery) beside it;
``add`` computes. Every model call is appended to ``calls.log`` in the folder (what a model's
bill would count), across processes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agents import Agent, function_tool, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

import oncewire
from oncewire import agents as durable
from oncewire.dispatch.retry import RetryPolicy

set_tracing_disabled(True)

RETRY = RetryPolicy(base_seconds=0.05, cap_seconds=0.2)


def _outputs(call: Any) -> int:
    items = call.input if isinstance(call.input, list) else []
    return sum(
        1 for item in items if isinstance(item, dict) and item.get("type") == "function_call_output"
    )


def scripted(folder: Path) -> ScriptedModel:
    def answer(call: Any) -> Any:
        seen = _outputs(call)
        with open(folder / "calls.log", "a") as log:
            log.write(f"{seen}\n")
        if seen == 0:
            return [
                function_call("ticket", {"title": "a"}, call_id="call-1"),
                function_call("add", {"a": 1, "b": 2}, call_id="call-2"),
            ]
        if seen == 2:
            return [function_call("ticket", {"title": "b"}, call_id="call-3")]
        return [assistant_message(f"done after {seen} tool results")]

    return ScriptedModel([ModelStep.respond(answer) for _ in range(20)])


def receiver(folder: Path) -> oncewire.Receipts:
    receipts = oncewire.Receipts(str(folder / "receiver.sqlite"))
    with receipts.store.transaction() as tx:
        tx.execute("CREATE TABLE IF NOT EXISTS tickets (key TEXT, title TEXT)")
        tx.execute("CREATE TABLE IF NOT EXISTS attempts (key TEXT, redelivery INTEGER)")
    return receipts


def build(folder: Path) -> Agent[Any]:
    receipts = receiver(folder)

    @function_tool
    def ticket(title: str) -> str:
        """Open a ticket."""
        attempt = durable.current_attempt()
        with receipts.store.transaction() as tx:
            tx.execute(
                "INSERT INTO attempts (key, redelivery) VALUES (:k, :r)",
                {"k": attempt.key, "r": int(attempt.redelivery)},
            )

        def work(tx: Any) -> str:
            tx.execute(
                "INSERT INTO tickets (key, title) VALUES (:k, :t)", {"k": attempt.key, "t": title}
            )
            return f"ticket {title} opened"

        return receipts.run_once(attempt.key, {"title": title}, work).result

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    return Agent(
        name="clerk", instructions="Open tickets.", model=scripted(folder), tools=[ticket, add]
    )


async def _streamed(agent: Agent[Any], ledger: oncewire.Ledger, run_key: str, folder: Path) -> Any:
    result = durable.run_streamed(agent, "go", ledger=ledger, run_key=run_key, retry=RETRY)
    with open(folder / "events.log", "a") as log:
        async for event in result.stream_events():
            kind = event.type
            if kind == "raw_response_event":
                kind += ":" + str(event.data.type)
            elif kind == "run_item_stream_event":
                kind += ":" + event.name
            log.write(kind + "\n")
            log.flush()
    return result.final_output


def run(folder: Path, db: str, mode: str, run_key: str = "run-1") -> Any:
    ledger = oncewire.Ledger(db)
    try:
        agent = build(folder)
        if mode == "sync":
            return durable.run_sync(
                agent, "go", ledger=ledger, run_key=run_key, retry=RETRY
            ).final_output
        if mode == "async":
            return asyncio.run(
                durable.run(agent, "go", ledger=ledger, run_key=run_key, retry=RETRY)
            ).final_output
        return asyncio.run(_streamed(agent, ledger, run_key, folder))
    finally:
        ledger.close()
