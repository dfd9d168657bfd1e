"""A two-turn conversation kept in a session, in this process or in a child
(``python -m tests.agents.session_scenario``).

Each user turn is one durable run (``run_key`` ``chat-1``, ``chat-2``) on the same
``OncewireSession``. The scripted model answers from what its input holds since the last user
message, so a resumed run is given the same answer for the same step: the first turn asks for
two tools at once, then one more, then answers; the second asks for one tool, then answers
(counting the user turns it was shown, so a history read wrong shows in the answer). Every
model call is appended to ``calls.log``; ``ticket`` opens each ticket under a receipt keyed by
its attempt and logs every attempt beside it (``receiver.sqlite``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

import oncewire
from oncewire import agents as durable
from oncewire.dispatch.retry import RetryPolicy
from tests.agents.scenario import receiver

set_tracing_disabled(True)

RETRY = RetryPolicy(base_seconds=0.05, cap_seconds=0.2)
TURNS = ["go", "again"]
SESSION_ID = "conversation-1"


def _since_last_user(call: Any) -> tuple[str, int, int]:
    """(the last user text, tool outputs after it, user messages in all)."""
    items = call.input if isinstance(call.input, list) else []
    text, outputs, users = "", 0, 0
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("role") == "user":
            content = item.get("content")
            text, outputs, users = str(content), 0, users + 1
        elif item.get("type") == "function_call_output":
            outputs += 1
    return text, outputs, users


def scripted(folder: Path) -> ScriptedModel:
    def answer(call: Any) -> Any:
        text, seen, users = _since_last_user(call)
        with open(folder / "calls.log", "a") as log:
            log.write(f"{text}:{seen}\n")
        if text == "go" and seen == 0:
            return [
                function_call("ticket", {"title": "a"}, call_id="go-1"),
                function_call("add", {"a": 1, "b": 2}, call_id="go-2"),
            ]
        if text == "go" and seen == 2:
            return [function_call("ticket", {"title": "b"}, call_id="go-3")]
        if text == "again" and seen == 0:
            return [function_call("ticket", {"title": "c"}, call_id="again-1")]
        return [assistant_message(f"{text}: {seen} tool results, {users} user turns seen")]

    return ScriptedModel([ModelStep.respond(answer) for _ in range(40)])


def build(folder: Path, *, receipts: bool = True) -> Agent[Any]:
    """The agent; ``receipts=False``: tools that need no durable run (for the plain SDK)."""
    store = receiver(folder) if receipts else None

    @function_tool
    def ticket(title: str) -> str:
        """Open a ticket."""
        if store is None:
            return f"ticket {title} opened"
        attempt = durable.current_attempt()
        with store.store.transaction() as tx:
            tx.execute(
                "INSERT INTO attempts (key, redelivery) VALUES (:k, :r)",
                {"k": attempt.key, "r": int(attempt.redelivery)},
            )

        def work(tx: Any) -> str:
            tx.execute(
                "INSERT INTO tickets (key, title) VALUES (:k, :t)", {"k": attempt.key, "t": title}
            )
            return f"ticket {title} opened"

        return store.run_once(attempt.key, {"title": title}, work).result

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    return Agent(
        name="clerk", instructions="Open tickets.", model=scripted(folder), tools=[ticket, add]
    )


async def _streamed(agent: Agent[Any], text: str, **kwargs: Any) -> Any:
    result = durable.run_streamed(agent, text, **kwargs)
    async for _ in result.stream_events():
        pass
    return result.final_output


def converse(folder: Path, db: str, mode: str) -> list[Any]:
    """Both turns, each a durable run in ``mode``; the final outputs."""
    ledger = oncewire.Ledger(db)
    try:
        agent = build(folder)
        session = durable.OncewireSession(SESSION_ID, ledger)
        outputs = []
        for number, text in enumerate(TURNS, start=1):
            kwargs: dict[str, Any] = {
                "ledger": ledger,
                "run_key": f"chat-{number}",
                "retry": RETRY,
                "session": session,
            }
            if mode == "sync":
                outputs.append(durable.run_sync(agent, text, **kwargs).final_output)
            elif mode == "async":
                outputs.append(asyncio.run(durable.run(agent, text, **kwargs)).final_output)
            else:
                outputs.append(asyncio.run(_streamed(agent, text, **kwargs)))
        return outputs
    finally:
        ledger.close()


async def plain(folder: Path) -> tuple[list[Any], list[Any]]:
    """Both turns through the SDK's own Runner and SQLiteSession: (outputs, history)."""
    agent = build(folder, receipts=False)
    session = SQLiteSession(SESSION_ID, str(folder / "plain.sqlite"))
    try:
        outputs = [(await Runner.run(agent, text, session=session)).final_output for text in TURNS]
        return outputs, await session.get_items()
    finally:
        session.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--folder", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--mode", default="sync")
    args = parser.parse_args(argv)
    outputs = converse(Path(args.folder), args.db, args.mode)
    print(json.dumps({"final_outputs": outputs}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
