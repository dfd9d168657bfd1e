"""The agents suite's child process: ``python -m oncewire.lab.children.agents run ...``.

A scenario has two stores, SQLite files in its folder or PostgreSQL schemas (``--caller URL
--downstream URL``): the *caller* is the ledger (the run's recorded model steps and its tool
calls' effects), the *downstream* store is the receiver (``tickets``, ``tool_attempts`` and
receipts).

``run`` runs the agent of :func:`build_agent` once under the run key :data:`RUN_KEY`, with
``oncewire.agents.run_sync`` (``--mode sync``), ``run`` (``async``) or ``run_streamed``
(``streamed``, every event the consumer sees appended to ``events.log``), or with the SDK's own
``Runner.run_sync`` and nothing of oncewire (``plain``, the negative control: a run that died
can only be started again from its input). It prints one JSON object (the final output, and how
long the run's work took from ``--ready``, which is written once the agent is built).

The agent's model is the SDK's own ``agents.testing.ScriptedModel``, answering by how many tool
results its input holds (so a resumed run gets the answer of the step it is at): first
``open_ticket`` and ``add`` at once, then ``open_ticket`` again, then its final text. Every
model call is appended to ``model_calls.log`` (step, pid, time) before it answers: what a
model's bill would count, across processes. Every tool attempt is logged in ``tool_attempts``
(key, attempt number, redelivery, pid) in a transaction of its own before the tool acts; a
durable ``open_ticket`` writes its ticket through ``Receipts.run_once`` keyed by
``current_attempt().key``, a plain one writes it directly.

``serve`` is the suite's warm parent (:func:`oncewire.lab.forking.serve`): it imports the SDK
and oncewire once, then forks a child per start, which runs ``main``; what a child saves is the
second or so the SDK takes to import.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oncewire.core import crash

if TYPE_CHECKING:
    from agents import Agent

    from oncewire.receipts import Receipts

__all__ = [
    "FINAL",
    "RUN_KEY",
    "STEPS",
    "TICKET_CALLS",
    "TICKET_WRITTEN",
    "TOOL_CALLS",
    "Stores",
    "build_agent",
    "main",
    "model_calls",
]

MODULE = "oncewire.lab.children.agents"
RUN_KEY = "lab-run-1"
QUESTION = "Open the tickets."
MODES = ("sync", "async", "streamed", "plain")
MODEL_CALLS = "model_calls.log"
EVENTS = "events.log"

TICKET_WRITTEN = crash.register(
    "lab.agents.ticket_written",
    "the lab's open_ticket tool committed its ticket in the receiver; it has not returned",
)

# The scripted model's answers, by how many tool results its input holds.
TOOL_CALLS: dict[int, list[tuple[str, str, dict[str, Any]]]] = {
    0: [
        ("open_ticket", "call-1", {"title": "printer on fire"}),
        ("add", "call-2", {"a": 2, "b": 3}),
    ],
    2: [("open_ticket", "call-3", {"title": "follow up"})],
}
FINAL = "Opened two tickets; 2 + 3 = 5."
# The model step each count of tool results is (step n of the run's record).
STEPS = {0: 0, 2: 1, 3: 2}
TICKET_CALLS = [
    call for calls in TOOL_CALLS.values() for name, call, _ in calls if name == "open_ticket"
]
ALL_CALLS = [call for calls in TOOL_CALLS.values() for _, call, _ in calls]


@dataclass(frozen=True)
class Stores:
    """One scenario's folder and its two stores (a SQLite path or a PostgreSQL URL each)."""

    folder: Path
    caller: str
    downstream: str

    @property
    def dialect(self) -> str:
        return "postgresql" if self.caller.startswith(("postgresql:", "postgres:")) else "sqlite"

    def args(self) -> list[str]:
        return [
            "--folder",
            str(self.folder),
            "--caller",
            self.caller,
            "--downstream",
            self.downstream,
        ]


def model_calls(folder: Path) -> list[dict[str, Any]]:
    """Every model call of the scenario, in order: ``{"step", "pid", "at"}``."""
    path = folder / MODEL_CALLS
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def _append(path: Path, line: str) -> None:
    """One ``write`` of an append-only file: in the kernel's hands at once, a SIGKILL loses none."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _scripted(folder: Path) -> Any:
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    def answer(call: Any) -> Any:
        items = call.input if isinstance(call.input, list) else []
        seen = sum(
            1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
        )
        step = STEPS.get(seen, -1)
        _append(
            folder / MODEL_CALLS, json.dumps({"step": step, "pid": os.getpid(), "at": time.time()})
        )
        if seen in TOOL_CALLS:
            return [
                function_call(name, args, call_id=call) for name, call, args in TOOL_CALLS[seen]
            ]
        return [assistant_message(FINAL)]

    return ScriptedModel([ModelStep.respond(answer) for _ in range(20)])


def initialise(stores: Stores) -> None:
    """The receiver's tables (its receipts come with ``Receipts``) and an empty ledger."""
    from oncewire.ledger import Ledger
    from oncewire.receipts import Receipts

    with Ledger(stores.caller):
        pass
    serial = "BIGSERIAL" if stores.dialect == "postgresql" else "INTEGER"
    with (
        Receipts(stores.downstream, retention_seconds=None) as receipts,
        receipts.store.transaction() as tx,
    ):
        tx.execute(
            f"CREATE TABLE tickets (id {serial} PRIMARY KEY, key TEXT NOT NULL, "
            "title TEXT NOT NULL, pid INTEGER NOT NULL)"
        )
        tx.execute(
            f"CREATE TABLE tool_attempts (id {serial} PRIMARY KEY, key TEXT NOT NULL, "
            "tool TEXT NOT NULL, number INTEGER NOT NULL, redelivery INTEGER NOT NULL, "
            "pid INTEGER NOT NULL)"
        )


def call_key(call_id: str) -> str:
    """The key a call's ticket and attempts are kept under: its effect key in a durable run."""
    from oncewire.agents.scope import call_key as effect_key

    return effect_key(RUN_KEY, call_id)


def build_agent(folder: Path, receipts: Receipts, durable: bool) -> Agent[Any]:
    """The scenario's agent (see the module docstring)."""
    from agents import Agent, function_tool
    from agents.tool_context import ToolContext

    from oncewire.agents import current_attempt

    def log_attempt(ctx: ToolContext[Any], tool: str) -> tuple[str, bool]:
        number, redelivery, key = 1, False, call_key(ctx.tool_call_id)
        if durable:
            attempt = current_attempt()
            number, redelivery, key = attempt.number, attempt.redelivery, attempt.key
        with receipts.store.transaction() as tx:
            tx.execute(
                "INSERT INTO tool_attempts (key, tool, number, redelivery, pid) "
                "VALUES (:key, :tool, :number, :redelivery, :pid)",
                {
                    "key": key,
                    "tool": tool,
                    "number": number,
                    "redelivery": int(redelivery),
                    "pid": os.getpid(),
                },
            )
        return key, redelivery

    def insert(tx: Any, key: str, title: str) -> str:
        tx.execute(
            "INSERT INTO tickets (key, title, pid) VALUES (:key, :title, :pid)",
            {"key": key, "title": title, "pid": os.getpid()},
        )
        return f"ticket {title!r} opened"

    def open_ticket(ctx: ToolContext[Any], title: str) -> str:
        """Open a ticket in the help desk."""
        key, _ = log_attempt(ctx, "open_ticket")
        if durable:
            answer = receipts.run_once(key, {"title": title}, lambda tx: insert(tx, key, title))
            text = str(answer.result)
        else:
            with receipts.store.transaction() as tx:
                text = insert(tx, key, title)
        TICKET_WRITTEN.hit()
        return text

    def add(ctx: ToolContext[Any], a: int, b: int) -> int:
        """Add two numbers."""
        log_attempt(ctx, "add")
        return a + b

    # The annotations as objects, not the strings this module's annotations are: the SDK
    # reads them to find the injected context, and the names are local to this function.
    open_ticket.__annotations__ = {"ctx": ToolContext[Any], "title": str, "return": str}
    add.__annotations__ = {"ctx": ToolContext[Any], "a": int, "b": int, "return": int}
    return Agent(
        name="clerk",
        instructions="Open the tickets asked for.",
        model=_scripted(folder),
        tools=[function_tool(open_ticket), function_tool(add)],
    )


async def _streamed(agent: Agent[Any], ledger: Any, folder: Path) -> Any:
    from agents.stream_events import RawResponsesStreamEvent, RunItemStreamEvent

    from oncewire import agents as durable

    result = durable.run_streamed(agent, QUESTION, ledger=ledger, run_key=RUN_KEY, retry=_retry())
    _append(folder / EVENTS, json.dumps({"pid": os.getpid(), "event": "start"}))
    async for event in result.stream_events():
        kind: str = event.type
        if isinstance(event, RawResponsesStreamEvent):
            kind += ":" + str(event.data.type)
        elif isinstance(event, RunItemStreamEvent):
            kind += ":" + event.name
        _append(folder / EVENTS, json.dumps({"pid": os.getpid(), "event": kind}))
    return result.final_output


def _retry() -> Any:
    from oncewire.dispatch.retry import RetryPolicy

    return RetryPolicy(base_seconds=0.02, cap_seconds=0.25)


def run(stores: Stores, mode: str, ready: Path | None = None) -> dict[str, Any]:
    from agents import Runner, set_tracing_disabled

    from oncewire import agents as durable
    from oncewire.ledger import Ledger
    from oncewire.receipts import Receipts

    set_tracing_disabled(True)
    with ExitStack() as stack:
        receipts = stack.enter_context(Receipts(stores.downstream, retention_seconds=None))
        agent = build_agent(stores.folder, receipts, mode != "plain")
        ledger = stack.enter_context(Ledger(stores.caller)) if mode != "plain" else None
        if ready is not None:
            ready.write_text(str(os.getpid()), encoding="utf-8")
        began = time.monotonic()
        output: Any
        if ledger is None:
            output = Runner.run_sync(agent, QUESTION).final_output
        elif mode == "sync":
            output = durable.run_sync(
                agent, QUESTION, ledger=ledger, run_key=RUN_KEY, retry=_retry()
            ).final_output
        elif mode == "async":
            output = asyncio.run(
                durable.run(agent, QUESTION, ledger=ledger, run_key=RUN_KEY, retry=_retry())
            ).final_output
        else:
            output = asyncio.run(_streamed(agent, ledger, stores.folder))
        work = time.monotonic() - began
    return {"pid": os.getpid(), "final_output": output, "work_seconds": round(work, 4)}


def _arm_points() -> None:
    """Import what declares the points the suite arms, and refuse an unknown one."""
    import oncewire.agents.scope
    import oncewire.agents.tools
    import oncewire.dispatch.dispatcher
    import oncewire.effects.outbox
    import oncewire.receipts  # noqa: F401  (they declare the points the suite arms)

    crash.check_armed()


def _warm() -> None:
    """What every forked child would import: the SDK, the durable runner, the receiver."""
    import agents  # noqa: F401  (the import each child is spared)

    import oncewire.agents.runner
    import oncewire.ledger
    import oncewire.receipts  # noqa: F401

    _arm_points()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=MODULE)
    parser.add_argument("role", choices=["init", "run", "serve"])
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--caller", help="the ledger's store (default: caller.sqlite there)")
    parser.add_argument("--downstream", help="the receiver (default: downstream.sqlite there)")
    parser.add_argument("--mode", choices=MODES, default="sync")
    parser.add_argument("--ready", type=Path, help="written once the agent is built")
    args = parser.parse_args(argv)
    if args.role == "serve":
        from oncewire.lab.forking import serve

        return serve(main, _warm)
    if args.folder is None:
        parser.error("--folder is required")
    stores = Stores(
        args.folder,
        args.caller or str(args.folder / "caller.sqlite"),
        args.downstream or str(args.folder / "downstream.sqlite"),
    )
    if crash.armed():
        _arm_points()
    if args.role == "init":
        initialise(stores)
        answer: dict[str, Any] = {"initialised": str(args.folder)}
    else:
        answer = run(stores, args.mode, args.ready)
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
