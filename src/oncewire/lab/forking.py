"""A warm parent for a suite's children: import once, fork a child per start.

A suite whose child imports a framework (LangGraph, the Agents SDK) pays a second or more of
imports per start, and a crash scenario starts its child again and again. Such a child module
gets a ``serve`` role that calls :func:`serve`: it imports what the children need once, says
it is serving, then for each request on its stdin (one JSON line: the child's arguments, the
environment to add, where to write its stdout and stderr) forks a child that runs the module's
``main`` with them and exits, and answers with the child's pid as it starts and its exit code
as it ends (``-9`` after a SIGKILL). The suite's side is :class:`Forker`.

A forked child is a process of its own: its pid, its connections, its death. It is armed from
its own environment (:func:`oncewire.core.crash.rearm`); the parent holds no connection and
runs no thread when it forks. What the child saves is only the imports.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from oncewire.core import crash
from oncewire.lab.framework import ProcessRecord

__all__ = ["Forker", "record", "serve"]


def serve(main: Callable[[list[str]], int], warm: Callable[[], None]) -> int:
    """The warm parent: ``warm()`` imports, then one forked ``main(args)`` per request line."""
    warm()
    sys.stdout.write(json.dumps({"serving": os.getpid()}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the loop
            code = 1
            try:
                with (
                    open(os.devnull, "rb") as nothing,
                    open(request["stdout"], "ab") as out,
                    open(request["stderr"], "ab") as err,
                ):
                    os.dup2(nothing.fileno(), 0)  # the requests are the parent's to read
                    os.dup2(out.fileno(), 1)
                    os.dup2(err.fileno(), 2)
                for name in [n for n in os.environ if n.startswith("ONCEWIRE_CRASH")]:
                    del os.environ[name]
                os.environ.update(request.get("env") or {})
                crash.rearm()
                code = main(request["args"])
            except BaseException:
                traceback.print_exc()
            finally:
                # A normal exit's handlers (executors joined, dispatchers closed), then none
                # of the interpreter's teardown of the parent's modules.
                atexit._run_exitfuncs()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        sys.stdout.write(json.dumps({"started": pid}) + "\n")
        sys.stdout.flush()
        _, status = os.waitpid(pid, 0)
        exit_code = os.waitstatus_to_exitcode(status)
        sys.stdout.write(json.dumps({"pid": pid, "exit_code": exit_code}) + "\n")
        sys.stdout.flush()
    return 0


class Forker:
    """The suite's side of a warm parent (``python -m MODULE serve``): :meth:`start` a child,
    :meth:`wait` for its exit code. One child at a time."""

    def __init__(self, module: str, log: Path) -> None:
        self.module = module
        env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_CRASH")}
        with log.open("a", encoding="utf-8") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, "serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                bufsize=0,
            )
        self._buffer = b""
        ready = self._line(120.0)
        if ready is None or "serving" not in ready:
            self.close()
            raise RuntimeError(f"the warm parent of {module} did not start serving (see {log})")

    def _line(self, timeout: float | None) -> dict[str, Any] | None:
        """The next line the parent writes, or None after ``timeout`` seconds."""
        assert self.process.stdout is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self.process.stdout], [], [], left)
            if not readable:
                return None
            chunk = os.read(self.process.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"the warm parent of {self.module} exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def start(self, args: list[str], env: Mapping[str, str], out: Path, err: Path) -> int:
        """Fork a child running ``main(args)`` with ``env`` added; its pid."""
        assert self.process.stdin is not None
        request = {"args": args, "env": dict(env), "stdout": str(out), "stderr": str(err)}
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        self.process.stdin.flush()
        started = self._line(60.0)
        if started is None:
            raise RuntimeError(f"the warm parent of {self.module} did not fork")
        return int(started["started"])

    def wait(self, pid: int, timeout: float | None) -> int | None:
        """The child's exit code, or None if it still runs after ``timeout``."""
        ended = self._line(timeout)
        if ended is None:
            return None
        assert ended["pid"] == pid, ended
        return int(ended["exit_code"])

    def run(
        self,
        role: str,
        args: list[str],
        folder: Path,
        *,
        arm: str | None = None,
        token: Path | None = None,
        deadline_seconds: float,
    ) -> ProcessRecord:
        """Fork ``main([role, *args])`` and wait for it (SIGKILLed at ``deadline_seconds``,
        and recorded as timed out); its record, the response its last stdout line."""
        number = len(list(folder.glob("child-*.out")))
        out, err = folder / f"child-{number}.out", folder / f"child-{number}.err"
        env: dict[str, str] = {}
        if arm:
            env["ONCEWIRE_CRASH"] = arm
            if token is not None:
                env["ONCEWIRE_CRASH_TOKEN"] = str(token)
        began = time.monotonic()
        pid = self.start([role, *args], env, out, err)
        code = self.wait(pid, deadline_seconds)
        timed_out = code is None
        if code is None:
            os.kill(pid, signal.SIGKILL)
            code = self.wait(pid, None)
        return record(role, [self.module, role, *args], pid, code, out, err, began, arm, timed_out)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def record(
    role: str,
    argv: list[str],
    pid: int,
    code: int | None,
    out: Path,
    err: Path,
    began: float,
    arm: str | None = None,
    timed_out: bool = False,
) -> ProcessRecord:
    """A forked child's record: its response is the last line of its stdout file."""
    lines = out.read_text(encoding="utf-8").strip().splitlines() if out.exists() else []
    try:
        response: Any = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        response = {"unparsed_stdout": lines[-1][-2000:]}
    return ProcessRecord(
        role=role,
        argv=["-m", *argv],
        pid=pid,
        exit_code=code,
        response=response,
        stderr=err.read_text(encoding="utf-8")[-4000:] if err.exists() else "",
        duration_seconds=round(time.monotonic() - began, 4),
        armed=arm,
        timed_out=timed_out,
    )
