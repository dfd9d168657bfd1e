"""A durable Agents SDK run whose one tool is an MCP server's, as a process of its own.

``python -m tests.agents.mcp_agent FOLDER LEDGER (--proxy-db URL | --direct)``: a scripted
model asks for ``create_ticket`` once, then answers. The tool is the lab's ``tickets`` server
(``oncewire.mcp.once`` over ``Receipts`` in ``FOLDER/receiver.db``, its body logging every run
to ``FOLDER/side.log``), reached through ``oncewire mcp proxy --db URL`` started by the SDK's
``MCPServerStdio``, or with ``--direct`` started by it alone. The server is given
``oncewire.agents.mcp_meta`` as its ``tool_meta_resolver``, wrapped to append what it returned to
``FOLDER/meta.log``; ``--no-meta`` gives it none (the SDK as it comes).

``--proxy-crash POINT`` arms a crash point in the proxy, ``--server-crash POINT`` in the server,
each with a token file of its own (``FOLDER/proxy.crash``, ``FOLDER/server.crash``); this
process's own point is armed by the caller (``ONCEWIRE_CRASH``). Every model call appends the
number of tool results it was given to ``FOLDER/calls.log``. The run's final output and the
tool output items are printed on stdout as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from agents import Agent, set_tracing_disabled
from agents.mcp import MCPServerStdio
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

import oncewire
from oncewire import agents as durable
from oncewire.core.crash import ENV_POINTS, ENV_TOKEN
from oncewire.dispatch.retry import RetryPolicy

set_tracing_disabled(True)

RUN_KEY = "ticket-42"
CALL_ID = "call-1"
SERVERS = "oncewire.lab.children.mcp_servers"


def scripted(folder: Path) -> ScriptedModel:
    """Asks for the ticket while no tool result is in its input, then answers: a resumed run,
    whose first step is replayed from the record, gets the same answer for the same step."""

    def answer(call: Any) -> Any:
        items = call.input if isinstance(call.input, list) else []
        seen = sum(
            1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
        )
        with open(folder / "calls.log", "a") as log:
            log.write(f"{seen}\n")
        if seen == 0:
            return [function_call("create_ticket", {"title": "printer on fire"}, call_id=CALL_ID)]
        return [assistant_message("Ticket opened.")]

    return ScriptedModel([ModelStep.respond(answer) for _ in range(10)])


def _env(crash: str | None, token: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
    if crash:
        env[ENV_POINTS] = crash
        env[ENV_TOKEN] = str(token)
    return env


def server_params(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    server = [sys.executable, "-m", SERVERS, "tickets", "--store", str(folder / "receiver.db")]
    server += ["--side-log", str(folder / "side.log")]
    if args.direct:
        env = _env(args.server_crash, folder / "server.crash")
        return {"command": server[0], "args": server[1:], "env": env}
    proxy = ["-m", "oncewire", "mcp", "proxy", "--db", args.proxy_db, "--", *server]
    env = _env(args.proxy_crash, folder / "proxy.crash")
    return {"command": sys.executable, "args": proxy, "env": env}


def resolver(folder: Path) -> Any:
    def logged(context: Any) -> dict[str, Any] | None:
        meta = durable.mcp_meta(context)
        with open(folder / "meta.log", "a") as log:
            log.write(json.dumps({"tool": context.tool_name, "meta": meta}) + "\n")
        return meta

    return logged


async def main(args: argparse.Namespace) -> None:
    folder = Path(args.folder)
    ledger = oncewire.Ledger(args.ledger)
    try:
        async with MCPServerStdio(
            params=server_params(folder, args),
            tool_meta_resolver=None if args.no_meta else resolver(folder),
            client_session_timeout_seconds=60,
        ) as server:
            agent = Agent(
                name="clerk",
                instructions="Open tickets.",
                model=scripted(folder),
                mcp_servers=[server],
            )
            result = await durable.run(
                agent,
                "the printer is on fire",
                ledger=ledger,
                run_key=RUN_KEY,
                retry=RetryPolicy(base_seconds=0.05, cap_seconds=0.2),
            )
    finally:
        ledger.close()
    outputs = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    print(json.dumps({"final": result.final_output, "outputs": outputs}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("ledger")
    parser.add_argument("--proxy-db")
    parser.add_argument("--direct", action="store_true")
    parser.add_argument("--no-meta", action="store_true")
    parser.add_argument("--proxy-crash")
    parser.add_argument("--server-crash")
    asyncio.run(main(parser.parse_args()))
