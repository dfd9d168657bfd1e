"""The mcp suite's client process: ``python -m oncewire.lab.children.mcp_client run ...``.

An agent's side of the wire, with the official SDK (``ClientSession`` over ``stdio_client``):
it starts ``oncewire mcp proxy`` as a real child process in front of one of the lab's MCP
servers (:mod:`oncewire.lab.children.mcp_servers`, ``tickets`` or ``log``), calls
``create_ticket`` ``--calls`` times, each call with its own idempotency key in
``params._meta["io.oncewire/idempotency-key"]``, and retries a call with that key, through a
new proxy each time, until it is answered:

* a proxy that dies (a crash point, a kill) or a session that breaks is no answer: the call is
  made again through a new proxy;
* a dropped answer (``--drop CALL``): the answer of that call's first attempt is swallowed
  between the proxy and the session, and the client gives up on the call at once (the SDK
  sends its courtesy ``notifications/cancelled``, which reaches the proxy), then retries;
* an ``isError`` answer is final for the plain ``log`` server (an "outcome unknown" is an
  answer); where the proxy redelivers (``tickets``, which deduplicates, or ``--redeliver``),
  a call is made again until it succeeds, up to ``--max-attempts`` (then the last answer
  stands).

Faults are the suite's plan, passed in: ``--proxy-arm POINT`` arms a crash point in the first
proxy's environment (with ``--token``, it fires once in all); ``--server-arm POINT`` arms one
in the server's (the proxy strips its own armed points from its server's environment, so the
server's command carries them, through ``env``); ``--kill CALL:VICTIM:FRACTION`` SIGKILLs the
proxy, the server or both while that call's first attempt is in flight, FRACTION times a
clean call's latency (the median of calls through a proxy already warm) after it was sent.
Each process's pid comes from a pid file its ``sh -c 'echo $$ > FILE; exec ...'`` wrapper
writes.

It prints one JSON object: per call its key, every attempt (the proxy's pid, what happened,
the answer) and the final answer; the kills with their pids; the latencies of clean calls.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MODULE", "Plan", "main", "proxy_command"]

MODULE = "oncewire.lab.children.mcp_client"
SERVERS = "oncewire.lab.children.mcp_servers"
TOOL = "create_ticket"
KEY_META = "io.oncewire/idempotency-key"
WRAP = 'echo $$ > "$0"; exec "$@"'  # sh: write the pid, then become the command
ATTEMPT_SECONDS = 45.0  # one attempt's deadline: a proxy that hangs is a failure, not a wait
START_SECONDS = 60.0  # a proxy's start (two Python processes importing on a busy machine)


@dataclass
class Plan:
    """What the client is told to do."""

    folder: Path
    caller: str
    downstream: str
    server: str  # "tickets" or "log"
    calls: int
    prefix: str
    redeliver: bool = False
    proxy_arm: str | None = None
    server_arm: str | None = None
    token: Path | None = None
    drops: set[int] = field(default_factory=set)
    kills: dict[int, tuple[str, float]] = field(default_factory=dict)
    max_attempts: int = 12


def proxy_command(plan: Plan, number: int, *, armed: bool) -> tuple[list[str], dict[str, str]]:
    """The ``argv`` of the proxy's ``number``-th start and its environment."""
    folder = plan.folder
    server = [sys.executable, "-m", SERVERS, plan.server]
    if plan.server == "tickets":
        server += ["--store", plan.downstream, "--side-log", str(folder / "bodies.jsonl")]
    else:
        server += ["--log", str(folder / "calls.jsonl")]
    if armed and plan.server_arm:
        server = ["env", f"ONCEWIRE_CRASH={plan.server_arm}", *_token_env(plan), *server]
    server = ["/bin/sh", "-c", WRAP, str(folder / f"server-{number}.pid"), *server]
    proxy = [sys.executable, "-m", "oncewire", "mcp", "proxy", "--db", plan.caller]
    if plan.redeliver:
        proxy += ["--redeliver", TOOL]
    argv = ["/bin/sh", "-c", WRAP, str(folder / f"proxy-{number}.pid"), *proxy, "--", *server]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_CRASH")}
    if armed and plan.proxy_arm:
        env["ONCEWIRE_CRASH"] = plan.proxy_arm
        if plan.token is not None:
            env["ONCEWIRE_CRASH_TOKEN"] = str(plan.token)
    return argv, env


def _token_env(plan: Plan) -> list[str]:
    return [f"ONCEWIRE_CRASH_TOKEN={plan.token}"] if plan.token is not None else []


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _kill(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


class Wire:
    """The streams between the SDK's transport and its session, where an answer is lost."""

    def __init__(self, read: Any, write: Any) -> None:
        import anyio

        self.read, self.write = read, write
        self.session_write, self._from_session = anyio.create_memory_object_stream[Any](0)
        self._to_session, self.session_read = anyio.create_memory_object_stream[Any](0)
        self.drop_key: str | None = None
        self.dropped = anyio.Event()
        self._drop_id: Any = None

    async def outgoing(self) -> None:
        with contextlib.suppress(Exception):  # the proxy is gone: the session finds out
            await self._outgoing()

    async def incoming(self) -> None:
        with contextlib.suppress(Exception):
            await self._incoming()

    async def _outgoing(self) -> None:
        async with self._from_session:
            async for item in self._from_session:
                data = item.message.model_dump(by_alias=True, exclude_unset=True, mode="json")
                meta = (data.get("params") or {}).get("_meta") or {}
                if data.get("method") == "tools/call" and meta.get(KEY_META) == self.drop_key:
                    self._drop_id = data.get("id")
                await self.write.send(item)

    async def _incoming(self) -> None:
        async with self._to_session:
            async for item in self.read:
                if not isinstance(item, Exception) and self._drop_id is not None:
                    data = item.message.model_dump(by_alias=True, exclude_unset=True, mode="json")
                    if "method" not in data and data.get("id") == self._drop_id:
                        self._drop_id, self.drop_key = None, None
                        self.dropped.set()
                        continue  # lost on the wire
                await self._to_session.send(item)


class Client:
    """The calls, the proxies started for them, and what happened."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.starts = 0
        self.kills: list[dict[str, Any]] = []
        self.latencies: list[float] = []
        self.errlog = (plan.folder / "proxies.stderr").open("a", encoding="utf-8")
        self.connection: tuple[int, Any, Wire] | None = None
        self.stack: contextlib.AsyncExitStack | None = None
        self.asked = 0  # calls asked through the current proxy (the first is not timed)
        # Where the proxy redelivers (a deduplicating server, --redeliver), an error answer
        # ("outcome unknown", the server gone) is asked again; elsewhere it is final.
        self.retry_errors = plan.server == "tickets" or plan.redeliver

    async def run(self) -> dict[str, Any]:
        calls = []
        try:
            for number in range(self.plan.calls):
                calls.append(await self.call(number))
        finally:
            await self._disconnect()
        return {
            "pid": os.getpid(),
            "calls": calls,
            "proxy_starts": self.starts,
            "kills": self.kills,
            "latencies": [round(x, 5) for x in self.latencies],
        }

    async def call(self, number: int) -> dict[str, Any]:
        key = f"{self.plan.prefix}/{number}"
        arguments = {"title": f"lab call {number}", "priority": "high" if number % 2 else "low"}
        attempts: list[dict[str, Any]] = []
        final: dict[str, Any] | None = None
        last: dict[str, Any] | None = None
        while final is None and len(attempts) < self.plan.max_attempts:
            first = not attempts
            attempt = await self.attempt(
                key,
                arguments,
                drop=first and number in self.plan.drops,
                kill=self.plan.kills.get(number) if first else None,
            )
            attempts.append(attempt)
            answer = attempt.get("answer")
            if answer is None:
                continue
            if answer["is_error"] and self.retry_errors:
                last = answer
                continue  # the proxy redelivers this tool: a repeat is safe, and it is made
            final = answer
        if final is None:
            final = last  # out of attempts: the last answer stands (None: never answered)
        return {
            "number": number,
            "key": key,
            "arguments": arguments,
            "attempts": attempts,
            "final": final,
        }

    async def attempt(
        self,
        key: str,
        arguments: dict[str, Any],
        *,
        drop: bool,
        kill: tuple[str, float] | None,
    ) -> dict[str, Any]:
        """One attempt, through the proxy of the last one if it still serves, else a new one."""
        import anyio

        record: dict[str, Any] = {"what": "no answer"}
        try:
            if self.connection is None:  # outside any cancel scope: it keeps task groups open
                self.connection = await self._connect()
            with anyio.fail_after(ATTEMPT_SECONDS):
                number, session, wire = self.connection
                warm, self.asked = self.asked > 0, self.asked + 1
                record["start"] = number
                record["proxy_pid"] = _pid(self.plan.folder / f"proxy-{number}.pid")
                if drop:
                    wire.drop_key = key
                await self._ask(session, wire, key, arguments, kill, number, record, warm)
        except TimeoutError:
            record["what"] = "hung"
            _kill(record.get("proxy_pid"))
        except Exception as exc:  # a broken session is no answer
            record.setdefault("error", _describe(exc))
        answered = record["what"] == "answered" and not record["answer"]["is_error"]
        if not answered:  # the next attempt goes through a new proxy
            await self._disconnect()
        record["server_pid"] = _pid(self.plan.folder / f"server-{record.get('start')}.pid")
        return record

    async def _connect(self) -> tuple[int, Any, Wire]:
        import anyio
        from mcp import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client

        number = self.starts
        self.starts += 1
        argv, env = proxy_command(self.plan, number, armed=number == 0)
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
        stack = contextlib.AsyncExitStack()
        self.stack = stack
        read, write = await stack.enter_async_context(stdio_client(params, errlog=self.errlog))
        wire = Wire(read, write)
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        tg.start_soon(wire.outgoing)
        tg.start_soon(wire.incoming)
        session = await stack.enter_async_context(
            ClientSession(wire.session_read, wire.session_write)
        )
        with anyio.fail_after(START_SECONDS):
            await session.initialize()
        return number, session, wire

    async def _disconnect(self) -> None:
        stack, self.stack, self.connection, self.asked = self.stack, None, None, 0
        if stack is not None:
            with contextlib.suppress(Exception):
                await stack.aclose()

    async def _ask(
        self,
        session: Any,
        wire: Wire,
        key: str,
        arguments: dict[str, Any],
        kill: tuple[str, float] | None,
        number: int,
        record: dict[str, Any],
        warm: bool,
    ) -> None:
        import anyio
        from mcp import MCPError

        sent = time.monotonic()
        finished = anyio.Event()
        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as scope:

                async def watch_drop() -> None:
                    await wire.dropped.wait()
                    scope.cancel()

                tg.start_soon(watch_drop)
                if kill is not None:
                    tg.start_soon(self._kill_later, kill, number, sent, finished)
                try:
                    with anyio.fail_after(ATTEMPT_SECONDS):
                        result = await session.call_tool(TOOL, arguments, meta={KEY_META: key})
                except MCPError as exc:
                    record["error"] = _describe(exc)
                else:
                    took = time.monotonic() - sent
                    record["what"] = "answered"
                    record["seconds"] = round(took, 5)
                    record["answer"] = {
                        "is_error": bool(result.is_error),
                        "text": " ".join(getattr(c, "text", "") for c in result.content),
                        "structured": result.structured_content,
                    }
                    if warm and kill is None and not result.is_error:
                        self.latencies.append(took)
                finished.set()
            if wire.dropped.is_set():
                record["what"] = "answer dropped"
            tg.cancel_scope.cancel()
        if kill is not None:  # a kill that the answer beat lands on an idle proxy
            await self._kill_later(kill, number, sent, finished)

    async def _kill_later(
        self, kill: tuple[str, float], number: int, sent: float, finished: Any
    ) -> None:
        """SIGKILL the victim ``fraction`` times a clean call's latency after ``sent`` (once)."""
        import anyio

        if any(k["call_start"] == (number, sent) for k in self.kills):
            return
        victim, fraction = kill
        latency = sorted(self.latencies)[len(self.latencies) // 2] if self.latencies else 0.05
        delay = fraction * latency
        await anyio.sleep(max(0.0, sent + delay - time.monotonic()))
        if any(k["call_start"] == (number, sent) for k in self.kills):
            return
        folder = self.plan.folder
        pids = {
            "proxy": [_pid(folder / f"proxy-{number}.pid")],
            "server": [_pid(folder / f"server-{number}.pid")],
            "both": [_pid(folder / f"server-{number}.pid"), _pid(folder / f"proxy-{number}.pid")],
        }[victim]
        self.kills.append(
            {
                "call_start": (number, sent),
                "victim": victim,
                "in_flight": not finished.is_set(),
                "delay_seconds": round(delay, 5),
                "pids": pids,
                "killed": [_kill(pid) for pid in pids],
            }
        )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"[:300]


def _kill_spec(text: str) -> tuple[int, tuple[str, float]]:
    call, victim, fraction = text.split(":")
    if victim not in ("proxy", "server", "both"):
        raise argparse.ArgumentTypeError(f"victim {victim!r}: proxy, server or both")
    return int(call), (victim, float(fraction))


def main(argv: list[str] | None = None) -> int:
    import anyio

    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("role", choices=["run"])
    parser.add_argument("--folder", required=True, type=Path)
    parser.add_argument("--caller", required=True, help="the proxy's store")
    parser.add_argument("--downstream", required=True, help="the tickets server's store")
    parser.add_argument("--server", choices=["tickets", "log"], required=True)
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--prefix", default="mcp-lab")
    parser.add_argument("--redeliver", action="store_true")
    parser.add_argument("--proxy-arm")
    parser.add_argument("--server-arm")
    parser.add_argument("--token", type=Path)
    parser.add_argument("--drop", type=int, action="append", default=[])
    parser.add_argument("--kill", type=_kill_spec, action="append", default=[])
    parser.add_argument("--max-attempts", type=int, default=12)
    args = parser.parse_args(argv)
    plan = Plan(
        folder=args.folder,
        caller=args.caller,
        downstream=args.downstream,
        server=args.server,
        calls=args.calls,
        prefix=args.prefix,
        redeliver=args.redeliver,
        proxy_arm=args.proxy_arm,
        server_arm=args.server_arm,
        token=args.token,
        drops=set(args.drop),
        kills=dict(args.kill),
        max_attempts=args.max_attempts,
    )
    client = Client(plan)
    with contextlib.closing(client.errlog):
        answer = anyio.run(client.run)
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
