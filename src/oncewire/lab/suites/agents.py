"""Suite ``agents``: an OpenAI Agents SDK run under SIGKILL, resumed with its run key.

Each scenario runs the agent of :mod:`oncewire.lab.children.agents` (the SDK's own
``ScriptedModel``; an ``open_ticket`` tool that writes tickets into a receiver in another store,
under receipts keyed by ``current_attempt().key``, and an ``add`` tool) on stores of its own,
kills the process, and starts it again with the same ``run_key`` until the run ends. The durable
scenarios run ``oncewire.agents.run_sync``, ``run`` or ``run_streamed`` (the *mode*) on the
lab's backend (SQLite files, or PostgreSQL schemas with ``--backend postgresql``):

* ``MODE/uninterrupted``: the run without a crash; its final output is the reference;
* ``MODE/armed[POINT]``: each crash point of the run's path (:data:`POINTS`: the run's own
  ``agents.*`` windows; the ledger's ``effects.accept_before_commit``, in the transaction that
  records a step and accepts its tool calls; the dispatcher's ``dispatch.after_claim``,
  ``dispatch.after_sink_before_record`` and ``dispatch.after_record``; the receiver's
  ``receipts.after_work_before_commit`` and ``receipts.after_commit_before_reply``, and the
  lab's ``lab.agents.ticket_written``, inside the tool once its ticket is committed) armed in
  turn and fired once in the scenario's processes, at its first hit and again at the hit of
  the run's last step (``POINT@N``, :data:`LAST_HIT`: the tools of the first step settled, no race
  between two tools of one step);
* ``MODE/random_kills``: the process killed from outside after seeded random delays (``--kills``
  of them at most), each drawn within the first 60% of how long the uninterrupted run's work
  took, from when the child says it is ready;
* ``plain/sdk_runner_reruns_tool`` (the negative control): the same agent on the SDK's own
  ``Runner.run_sync`` with nothing of oncewire, killed once the first ticket is written and
  started again from its input, as nothing else is there to resume it: the model is asked the
  first step again and the receiver holds two tickets for one call, neither flagged. It passes
  when the lab sees that duplicate; the durable scenarios pass when it is never there.

The verdicts are :mod:`oncewire.lab.suites.agents_checks`'s, read from the stores and from the
model's call log. Every scenario is a row of :func:`scenarios` with an outcome class; the
tests run one scenario per class and backend (:func:`run_scenario`), ``make soak`` and the lab
all of them.

The runs are forked from one warm parent per suite (the child's ``serve`` role), so that each
start pays for the SDK's import once per suite, not once per start: a forked child is still a
process of its own, killed with SIGKILL, its connections and its lease owner (pid and start
time) its own. Without the ``agents`` extra the suite is one scenario reported not applicable.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oncewire.core import extras
from oncewire.core.errors import MissingExtra
from oncewire.lab.forking import Forker
from oncewire.lab.forking import record as forked_record
from oncewire.lab.framework import (
    CHILD_DEADLINE_SECONDS,
    LabContext,
    ProcessRecord,
    ScenarioResult,
    Suite,
)

__all__ = [
    "CHILD",
    "DEFAULT_CELLS",
    "MAY_ASK_AGAIN",
    "POINTS",
    "SUITE",
    "Scenario",
    "run_agents",
    "run_scenario",
    "scenarios",
]

CHILD = "oncewire.lab.children.agents"
KILLED = -signal.SIGKILL
MAX_RUNS = 8  # starts of one scenario's run before the lab calls it stuck
RANDOM_KILLS = 4
RANDOM_WORK_SECONDS = 1.0
# A random kill lands within this share of the uninterrupted run's work: a run a little faster
# than the reference is still killed, most of the time.
RANDOM_SHARE = 0.6
READY_DEADLINE_SECONDS = 60.0
MODES = ("sync", "async", "streamed")
# The points on the run's path, and the hit of each at the run's last step (the third tool
# call; the second model step, recorded after the first's tools; the second ticket; the
# dispatcher's second wave, the last step's call or the first step's second).
POINTS: dict[str, int] = {
    "agents.step_recorded": 2,
    "agents.tool_accepted": 3,
    "agents.tool_performing": 3,
    "agents.tool_returned": 3,
    "agents.tool_settled": 3,
    "effects.accept_before_commit": 2,  # once per step that asks for tools: the second's
    "dispatch.after_claim": 2,  # once per batch claimed: the first step's is one or two
    "dispatch.after_sink_before_record": 2,  # once per wave: the first step's is one or two
    "dispatch.after_record": 2,  # once per wave recorded
    "receipts.after_work_before_commit": 2,  # once per ticket: the second's
    "receipts.after_commit_before_reply": 2,
    "lab.agents.ticket_written": 2,
}
# The points a kill at which may find a model call made and its record not committed, so that
# the resumed run asks the model for that step once more: the transaction recording a step,
# before its commit; and the dispatcher's thread once it recorded a call's end, which the run's
# thread may already have read and gone on to the next model call with.
MAY_ASK_AGAIN = frozenset({"effects.accept_before_commit", "dispatch.after_record"})
# What the resumed run meets after a kill at a point's last-step hit.
LAST_HIT = {
    "agents.step_recorded": "replayed",
    "agents.tool_accepted": "replayed",
    "agents.tool_performing": "redelivered",
    "agents.tool_returned": "redelivered",
    "agents.tool_settled": "answered",
    "effects.accept_before_commit": "answered",
    "dispatch.after_claim": "replayed",
    "dispatch.after_sink_before_record": "redelivered",
    "dispatch.after_record": "answered",
    "receipts.after_work_before_commit": "redelivered",
    "receipts.after_commit_before_reply": "redelivered",
    "lab.agents.ticket_written": "redelivered",
}


@dataclass(frozen=True)
class Scenario:
    """One row of the matrix: how the run is started and killed, and what the resume meets."""

    mode: str  # sync, async, streamed, or plain (the negative control)
    kind: str  # uninterrupted, armed, random, control
    point: str | None = None  # the armed crash point (``name`` or ``name@hit``)
    outcome: str | None = None  # replayed, redelivered, answered; None: not one class

    @property
    def name(self) -> str:
        if self.kind == "armed":
            return f"{self.mode}/armed[{self.point}]"
        if self.kind == "control":
            return f"{self.mode}/sdk_runner_reruns_tool"
        return (
            f"{self.mode}/{self.kind}_kills"
            if self.kind == "random"
            else f"{self.mode}/{self.kind}"
        )


def scenarios() -> list[Scenario]:
    """The whole matrix, in the order the suite runs it."""
    matrix = [Scenario(mode, "uninterrupted") for mode in MODES]
    for mode in MODES:
        for point, hit in POINTS.items():
            matrix.append(Scenario(mode, "armed", point))
            matrix.append(Scenario(mode, "armed", f"{point}@{hit}", LAST_HIT[point]))
    matrix += [Scenario(mode, "random") for mode in MODES]
    matrix.append(Scenario("plain", "control", "lab.agents.ticket_written"))
    return matrix


# One scenario per outcome class (and the control), spread over the three modes: the tests'
# default run (``make test``); ``make soak`` and ``oncewire lab`` run :func:`scenarios`.
DEFAULT_CELLS = (
    "streamed/armed[agents.step_recorded@2]",
    "sync/armed[agents.tool_returned@3]",
    "async/armed[agents.tool_settled@3]",
    "plain/sdk_runner_reruns_tool",
)


def missing_agents_extra(feature: str) -> MissingExtra | None:
    missing = extras.missing("agents")
    return MissingExtra(feature, "agents", missing) if missing else None


def _stores(ctx: LabContext, scenario: Scenario) -> Any:
    from oncewire.lab.children.agents import Stores

    folder = ctx.scenario_dir("agents", scenario.name.replace("/", "-"))
    if ctx.backend.name == "sqlite":
        return Stores(folder, str(folder / "caller.sqlite"), str(folder / "downstream.sqlite"))
    pair = ctx.backend.pair(folder)
    ctx.pairs[f"agents/{scenario.name}"] = pair
    return Stores(folder, pair.caller, pair.downstream)


class _Runs:
    """One scenario's stores and the starts of its run."""

    def __init__(self, ctx: LabContext, forker: Forker, result: ScenarioResult, scenario: Scenario):
        from oncewire.lab.children.agents import initialise

        self.forker = forker
        self.result = result
        self.mode = scenario.mode
        self.stores = _stores(ctx, scenario)
        self.folder: Path = self.stores.folder
        self.token = self.folder / "crash.token"
        self.killed: list[ProcessRecord] = []
        self.last: ProcessRecord | None = None
        initialise(self.stores)

    def _args(self) -> list[str]:
        return ["run", *self.stores.args(), "--mode", self.mode]

    def _start(self, arm: str | None, ready: Path | None = None) -> tuple[int, Path, Path, float]:
        number = len(self.result.processes)
        out, err = self.folder / f"run-{number}.out", self.folder / f"run-{number}.err"
        env = {"ONCEWIRE_CRASH": arm, "ONCEWIRE_CRASH_TOKEN": str(self.token)} if arm else {}
        args = self._args() + (["--ready", str(ready)] if ready is not None else [])
        return self.forker.start(args, env, out, err), out, err, time.monotonic()

    def _record(
        self, pid: int, code: int | None, out: Path, err: Path, began: float, arm: str | None
    ) -> ProcessRecord:
        record = forked_record(
            "run", [CHILD, *self._args()], pid, code, out, err, began, arm, code is None
        )
        self.result.processes.append(record)
        if code == KILLED:
            self.killed.append(record)
        return record

    def _finish(self, pid: int) -> int:
        code = self.forker.wait(pid, CHILD_DEADLINE_SECONDS)
        if code is None:  # stuck: killed, and reported as stuck
            os.kill(pid, signal.SIGKILL)
            self.forker.wait(pid, None)
            self.result.require(False, f"a run did not end within {CHILD_DEADLINE_SECONDS}s")
            return KILLED
        return code

    def until_done(self, arm: str | None = None) -> ProcessRecord | None:
        """Start the run until it ends (``arm`` armed in each start, fired once in all)."""
        for _ in range(MAX_RUNS):
            pid, out, err, began = self._start(arm)
            code = self._finish(pid)
            record = self._record(pid, code, out, err, began, arm)
            if code == KILLED:
                continue
            self.result.require(code == 0, f"a run failed: {record.stderr[-600:]}")
            self.last = record
            return record
        self.result.require(False, f"the run did not end after {MAX_RUNS} starts")
        return None

    def killed_at_random(self, rng: random.Random, kills: int, work_seconds: float) -> None:
        """SIGKILL the run from outside, ``kills`` times at most, each a random delay after the
        child said it was ready (within :data:`RANDOM_SHARE` of ``work_seconds``), then let it
        finish."""
        for number in range(kills):
            ready = self.folder / f"ready-{number}"
            pid, out, err, began = self._start(None, ready)
            waited = time.monotonic()
            while not ready.exists() and time.monotonic() - waited < READY_DEADLINE_SECONDS:
                time.sleep(0.005)
            code = self.forker.wait(pid, rng.uniform(0.0, RANDOM_SHARE * work_seconds))
            if code is None:  # still running: the kill lands
                os.kill(pid, signal.SIGKILL)
                code = self._finish(pid)
            record = self._record(pid, code, out, err, began, None)
            if code == 0:
                self.last = record
                return
            if code != KILLED:
                self.result.require(False, f"a run failed: {record.stderr[-600:]}")
        self.until_done()

    def output(self) -> Any:
        response = self.last.response if self.last is not None else None
        return response.get("final_output") if isinstance(response, dict) else None


def run_scenario(
    ctx: LabContext,
    forker: Forker,
    scenario: Scenario,
    reference: Any = None,
    work_seconds: float = RANDOM_WORK_SECONDS,
) -> ScenarioResult:
    """Run one row of :func:`scenarios` and judge it; ``reference`` is the uninterrupted
    run's final output (the script's final text is required in any case)."""
    from oncewire.lab.suites import agents_checks as checks

    started = time.monotonic()
    result = ScenarioResult(scenario.name)
    runs = _Runs(ctx, forker, result, scenario)
    if scenario.kind == "control":
        runs.until_done(scenario.point)
        result.require(len(runs.killed) == 1, f"{len(runs.killed)} kills, not one")
        result.summary = {"mode": "plain", **checks.check_control(result, runs.stores, 1)}
        result.duration_seconds = time.monotonic() - started
        return result
    if scenario.kind == "random":
        kills = int(ctx.options.get("kills") or RANDOM_KILLS)
        rng = random.Random(f"agents/{scenario.mode}/{ctx.seed}")
        runs.killed_at_random(rng, kills, work_seconds)
    else:
        runs.until_done(scenario.point)
    if scenario.kind == "armed" and not runs.token.exists():
        result.skipped = f"{scenario.point} is not reached on the {scenario.mode} run's path"
        result.duration_seconds = time.monotonic() - started
        return result
    if scenario.kind == "armed":
        result.require(len(runs.killed) == 1, f"{len(runs.killed)} kills, not one")
    if scenario.kind == "uninterrupted":
        result.require(not runs.killed, "the uninterrupted run was killed")
    summary = checks.check_durable(
        result,
        runs.stores,
        output=runs.output(),
        reference=reference,
        kills=len(runs.killed),
        armed=scenario.kind == "armed",
        outcome=scenario.outcome,
        may_ask_again=(scenario.point or "").partition("@")[0] in MAY_ASK_AGAIN,
    )
    if scenario.mode == "streamed" and runs.last is not None:
        summary.update(checks.check_stream(result, runs.folder, runs.last.pid))
    resumes = [p.duration_seconds for p in result.processes[1:] if p.exit_code == 0]
    result.summary = {
        "mode": scenario.mode,
        "point": scenario.point,
        "outcome": scenario.outcome,
        "starts": len(result.processes),
        **summary,
        "resume_seconds": resumes[-1] if resumes else None,
    }
    result.details = {"final_output": runs.output()}
    result.duration_seconds = time.monotonic() - started
    return result


def run_agents(ctx: LabContext) -> Iterator[ScenarioResult]:
    missing = missing_agents_extra("the agents suite")
    if missing is not None:
        result = ScenarioResult("agents")
        result.skipped = str(missing)
        yield result
        return
    (ctx.root / "agents").mkdir(parents=True, exist_ok=True)
    forker = Forker(CHILD, ctx.root / "agents" / "forker.log")
    try:
        references: dict[str, Any] = {}
        work: dict[str, float] = {}
        for scenario in scenarios():
            ctx.progress.update(f"agents: {scenario.name}")
            result = run_scenario(
                ctx,
                forker,
                scenario,
                references.get(scenario.mode),
                work.get(scenario.mode, RANDOM_WORK_SECONDS),
            )
            if scenario.kind == "uninterrupted" and result.passed:
                last = result.processes[-1].response or {}
                references[scenario.mode] = last.get("final_output")
                work[scenario.mode] = max(0.2, float(last.get("work_seconds") or 0.0))
            yield result
    finally:
        forker.close()


SUITE = Suite(
    "agents",
    "an OpenAI Agents SDK run (sync, async, streamed) SIGKILLed at every crash point and at "
    "random, resumed by its run_key, with the plain Runner's duplicate as the negative control",
    run_agents,
    key_numbers=(
        "backend",
        "starts",
        "kills",
        "outcome",
        "model_calls",
        "tool_attempts",
        "tickets",
        "duplicates",
        "redeliveries",
        "resume_seconds",
    ),
)
