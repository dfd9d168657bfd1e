"""The lab's machinery: suites, scenarios, child processes and progress.

A suite is a function ``(LabContext) -> list[ScenarioResult]`` with a name: each suite module
defines ``SUITE = Suite(name, description, run)``, and :mod:`oncewire.lab.suites` lists them in
the one tuple ``SUITES``. This module imports no suite. A suite runs real child processes
through :meth:`LabContext.child` (each with a deadline, its pid and return code kept for the
evidence) and checks invariants by opening the stores itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from oncewire.lab.fixtures import Backend, StorePair, initialise

__all__ = [
    "CHILD_DEADLINE_SECONDS",
    "EFFECTS_CHILD",
    "LabContext",
    "ProcessRecord",
    "Progress",
    "ScenarioResult",
    "Suite",
    "SuiteFn",
]

CHILD_DEADLINE_SECONDS = 60.0
# The outbox suites' child process (``python -m`` module); the others name their own.
EFFECTS_CHILD = "oncewire.lab.children.effects"


@dataclass
class ProcessRecord:
    """One child process as the evidence keeps it."""

    role: str
    argv: list[str]
    pid: int
    exit_code: int | None
    response: Any
    stderr: str
    duration_seconds: float
    armed: str | None = None
    timed_out: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ScenarioResult:
    """One scenario's verdict: passed or not, the failures that say why, and the evidence kept."""

    name: str
    passed: bool = True
    summary: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    processes: list[ProcessRecord] = field(default_factory=list)
    before: Any = None
    after: Any = None
    details: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None  # why this cell does not apply (never counted as a pass)
    duration_seconds: float = 0.0

    def require(self, condition: bool, message: str) -> bool:
        """Record a failed invariant (and keep checking the others)."""
        if not condition:
            self.passed = False
            self.failures.append(message)
        return condition

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "skipped": self.skipped,
            "summary": self.summary,
            "failures": self.failures,
            "processes": [p.as_dict() for p in self.processes],
            "before_recovery": self.before,
            "after_recovery": self.after,
            "details": self.details,
            "duration_seconds": round(self.duration_seconds, 3),
        }


class Progress:
    """What the lab says while it runs, on stderr (stdout holds the table or the JSON).

    :meth:`line` is an event worth a line of its own (a suite started, a scenario's verdict);
    :meth:`update` is the running status of long work (a torture run's effects done and kills
    so far): rewritten in place on a terminal, elsewhere a line at most every ``tick_seconds``
    so that a log file shows the run moving without filling up. ``enabled`` defaults to
    whether the stream is a terminal; ``emit`` replaces the writing (``--log-format json``
    makes each line a log record, with the event's fields as attributes).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool | None = None,
        tick_seconds: float = 2.0,
        emit: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.enabled = self.tty if enabled is None else enabled
        self.tick_seconds = tick_seconds
        self._emit = emit
        self._width = 0
        self._last_tick = -float("inf")

    def update(self, text: str, **fields: Any) -> None:
        if not self.enabled:
            return
        line = text[:120]
        if self.tty and self._emit is None:
            self.stream.write("\r" + line.ljust(self._width))
            self.stream.flush()
            self._width = len(line)
            return
        now = time.monotonic()
        if now - self._last_tick >= self.tick_seconds:
            self._last_tick = now
            self.line(line, **fields)

    def line(self, text: str, **fields: Any) -> None:
        if not self.enabled:
            return
        if self._emit is not None:
            self._emit(text, fields)
            return
        if self.tty:
            self.stream.write("\r" + text.ljust(self._width) + "\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._width = 0


@dataclass
class LabContext:
    """What a suite runs in: its folder, the seed, the options and the backend's stores."""

    root: Path
    seed: int
    options: dict[str, Any] = field(default_factory=dict)
    progress: Progress = field(default_factory=Progress)
    backend: Backend = field(default_factory=Backend)
    keep: bool = False  # keep PostgreSQL schemas after the run (files are kept with the folder)
    pairs: dict[str, StorePair] = field(default_factory=dict)

    def scenario_dir(self, *parts: str) -> Path:
        folder = self.root.joinpath(*parts)
        folder.mkdir(parents=True, exist_ok=False)
        return folder

    def stores(self, *parts: str) -> StorePair:
        """Fresh, initialised caller and downstream stores for one scenario."""
        folder = self.scenario_dir(*parts)
        pair = self.backend.pair(folder)
        self.pairs["/".join(parts)] = pair
        initialise(pair)
        return pair

    def cleanup(self) -> None:
        if not self.keep:
            for pair in self.pairs.values():
                self.backend.drop(pair)

    def child(
        self,
        role: str,
        args: Sequence[str],
        *,
        arm: str | None = None,
        token: Path | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        deadline_seconds: float = CHILD_DEADLINE_SECONDS,
        module: str = EFFECTS_CHILD,
    ) -> ProcessRecord:
        """Run ``python -m MODULE ROLE ARGS`` to completion (or its deadline).

        ``arm`` arms a crash point in the child (and its own children); ``token`` makes it fire
        at most once across that process tree.
        """
        argv = [sys.executable, "-m", module, role, *args]
        child_env = dict(os.environ)
        child_env.pop("ONCEWIRE_CRASH", None)
        child_env.pop("ONCEWIRE_CRASH_TOKEN", None)
        if arm:
            child_env["ONCEWIRE_CRASH"] = arm
            if token is not None:
                child_env["ONCEWIRE_CRASH_TOKEN"] = str(token)
        if env:
            child_env.update(env)
        started = time.monotonic()
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env,
        )
        timed_out = False
        try:
            stdout, stderr = process.communicate(stdin, timeout=deadline_seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
            timed_out = True
        lines = stdout.strip().splitlines()
        try:
            response: Any = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            response = {"unparsed_stdout": stdout[-2000:]}
        return ProcessRecord(
            role=role,
            argv=argv[1:],
            pid=process.pid,
            exit_code=process.returncode,
            response=response,
            stderr=stderr[-4000:],
            duration_seconds=round(time.monotonic() - started, 4),
            armed=arm,
            timed_out=timed_out,
        )

    def spawn(
        self,
        role: str,
        args: Sequence[str],
        *,
        module: str = EFFECTS_CHILD,
        stderr_to: Path | None = None,
    ) -> subprocess.Popen[str]:
        """Start a worker without waiting (the caller kills and reaps it).

        ``stderr_to`` appends the worker's stderr to that file instead of a pipe: a worker that
        lives for minutes and logs could fill a pipe nobody reads before it exits, and stall.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_CRASH")}
        argv = [sys.executable, "-m", module, role, *args]
        if stderr_to is None:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        with stderr_to.open("a", encoding="utf-8") as log:  # the child keeps its own copy
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
            )


# A suite that yields its scenarios one by one has each verdict shown (and timed) as it
# finishes; one that returns a list has them shown when it ends.
SuiteFn = Callable[[LabContext], Iterable[ScenarioResult]]


@dataclass(frozen=True)
class Suite:
    """A named suite; ``oncewire lab --suite NAME`` runs it (the order is ``SUITES``'s).

    ``key_numbers`` names the summary fields a reader needs to judge a scenario at a glance
    (a dotted path reaches into a nested field: ``states.done``); the table and the HTML report
    show those, in that order, and a scenario that lacks one simply does not show it.
    """

    name: str
    description: str
    run: SuiteFn
    key_numbers: tuple[str, ...] = ()
