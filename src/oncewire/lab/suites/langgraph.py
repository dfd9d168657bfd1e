"""Suite ``langgraph``: a LangGraph agent's tools and checkpoints under SIGKILL, in real processes.

Each scenario runs the child of :mod:`oncewire.lab.children.langgraph` (an agent graph with a
scripted model, whose ``open_ticket`` tool writes tickets into a receiver in another store) on
stores of its own, SIGKILLs it, and starts it again on the same stores until the graph is
done. The durable scenarios run ``DurableToolNode`` with ``OncewireSaver`` on the caller's
store, through ``durable_invoke``, on the lab's backend (SQLite files, or PostgreSQL schemas
with ``--backend postgresql``). Every verdict is read from the stores: the ledger's effects,
the checkpoint tables, the run table, the receiver's tickets, receipts and tool attempt log.

* ``uninterrupted``: the run without a crash; its final messages are the reference;
* ``armed[POINT]``: every registered crash point of the durable graph's path (``langgraph.*``;
  the lab's ``lab.langgraph.ticket_written``, inside the tool, and
  ``lab.langgraph.before_first_checkpoint``, a run recorded by ``durable_invoke`` whose
  first checkpoint is not stored; and the ``effects.``, ``dispatch.`` and ``receipts.``
  points it crosses) armed in turn, fired once in the scenario's process tree; a point the
  run does not reach is reported as not applicable. After a kill at one of the saver's own
  points (``langgraph.put_before_commit``, ``put_after_commit``, ``writes_before_commit``,
  ``writes_after_commit``), and before the run is resumed, the tables must show it landed in
  the point's window (:func:`~oncewire.lab.suites.langgraph_checks.check_window`): the call
  the killed process never returned from is not stored, or is stored as the chain's head.
  These four are armed a second time at their third hit (``armed[POINT@3]``), in a thread
  already written to;
* ``random_kills``: the child killed from outside after seeded random delays, again and again,
  until a run finishes; each delay starts when the child says it is ready (imported, its
  graph built), and is drawn within how long the uninterrupted run's work took, so that kills
  land in the graph's work, not in the imports;
* ``upstream_tool_node_reruns_tool`` (the negative control, LangGraph issues #7417 and #7213):
  the same graph on LangGraph's ``ToolNode`` and ``SqliteSaver``, killed once the first ticket
  is written: the resumed graph runs that tool again and the receiver holds two tickets for one
  call (for both, when the other call had written its ticket too), neither flagged. It
  passes when the lab sees that duplicate; the durable scenarios pass when it is never there.

The durable invariants: every tool call has exactly one effect, ``done``; each
``open_ticket`` call wrote exactly one ticket and one receipt under its key; every attempt of
a call after its first was flagged a redelivery; the thread's checkpoint history verifies
(``OncewireSaver``'s own verification of the hash chain, and the tables read directly: the
chain's entries numbered 1..head without a gap, each linked to the one before, the head where
the thread says, every checkpoint and write pointing at an entry of its kind, every parent
checkpoint stored); the final messages equal the uninterrupted run's; and no run was lost (the
thread's run is recorded ``done``, no run is left pending, the last checkpoint has nothing
left to do).

The negative control runs on SQLite files whatever ``--backend`` says (it is LangGraph's own
``SqliteSaver``). Without the ``langgraph`` extra the suite is one scenario reported not
applicable, in one line.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from oncewire.core import crash, extras
from oncewire.core.errors import MissingExtra
from oncewire.lab.fixtures import rows
from oncewire.lab.forking import Forker
from oncewire.lab.forking import record as forked_record
from oncewire.lab.framework import (
    CHILD_DEADLINE_SECONDS,
    LabContext,
    ProcessRecord,
    ScenarioResult,
    Suite,
)
from oncewire.lab.suites.langgraph_checks import WINDOWS, check_checkpoints, check_window

__all__ = [
    "CHILD",
    "DEFAULT_POINTS",
    "SUITE",
    "all_points",
    "langgraph_points",
    "missing_langgraph_extra",
    "run_langgraph",
    "run_points",
]

CHILD = "oncewire.lab.children.langgraph"
KILLED = -signal.SIGKILL
MAX_RUNS = 8  # starts of one scenario's graph before the lab calls it stuck
POINT_PREFIXES = ("langgraph.", "lab.langgraph.", "effects.", "dispatch.", "receipts.")
RANDOM_KILLS = 4
# The saver's own points are armed once more at this hit of the first process: a checkpoint
# with a parent, writes of a later step, in a thread already written to.
LATER_HIT = 3
# A random kill lands this long after the child said it was ready, at most (when the
# uninterrupted run did not say how long its work took).
RANDOM_WORK_SECONDS = 1.0
READY_DEADLINE_SECONDS = 120.0


def missing_langgraph_extra(feature: str) -> MissingExtra | None:
    """What ``feature`` would raise for the ``langgraph`` extra's missing modules (and the
    SQLite saver the suite checkpoints with); None when all are installed."""
    missing = extras.missing("langgraph") + extras.missing(
        "langgraph", ("langgraph.checkpoint.sqlite",)
    )
    return MissingExtra(feature, "langgraph", missing) if missing else None


def _stores(ctx: LabContext, name: str, mode: str) -> Any:
    """A scenario's stores: the lab's backend for the durable mode, files for the control."""
    from oncewire.lab.children.langgraph import Stores

    folder = ctx.scenario_dir("langgraph", name)
    if mode != "durable" or ctx.backend.name == "sqlite":
        return Stores.in_folder(folder)
    pair = ctx.backend.pair(folder)
    ctx.pairs[f"langgraph/{name}"] = pair
    return Stores(folder, pair.caller, pair.downstream)


def langgraph_points() -> list[str]:
    """The registered crash points on the durable graph's path."""
    import oncewire.dispatch.dispatcher
    import oncewire.effects.outbox
    import oncewire.lab.children.langgraph
    import oncewire.langgraph.saver
    import oncewire.langgraph.saver_runs
    import oncewire.langgraph.tools
    import oncewire.receipts  # noqa: F401  (importing registers their points)

    return [name for name in crash.registry() if name.startswith(POINT_PREFIXES)]


class _Scenario:
    """One scenario's folder and the runs of its child."""

    def __init__(
        self, ctx: LabContext, forker: Forker, result: ScenarioResult, name: str, mode: str
    ) -> None:
        self.ctx = ctx
        self.forker = forker
        self.result = result
        self.mode = mode
        self.stores = _stores(ctx, name, mode)
        self.folder = self.stores.folder
        self.dialect = self.stores.dialect
        self.token = self.folder / "crash.token"
        self.killed: list[ProcessRecord] = []
        init = self._child("init")
        result.require(init.exit_code == 0, f"init failed: {init.stderr[-400:]}")

    def _args(self) -> list[str]:
        return [*self.stores.args(), "--mode", self.mode]

    def _child(self, role: str, arm: str | None = None) -> ProcessRecord:
        record = self.forker.run(
            role,
            self._args(),
            self.folder,
            arm=arm,
            token=self.token,
            deadline_seconds=CHILD_DEADLINE_SECONDS,
        )
        self.result.processes.append(record)
        self.result.require(not record.timed_out, f"a {role} did not end in time")
        return record

    def until_done(
        self,
        arm: str | None = None,
        after_kill: Callable[[ProcessRecord], None] | None = None,
    ) -> ProcessRecord | None:
        """Start the graph until a run ends it (a crash point armed in each start, fired at
        most once in all; ``after_kill`` looks at the stores after each kill, before the next
        start); the last run, or None if none finished."""
        for _ in range(MAX_RUNS):
            record = self._child("run", arm)
            if record.exit_code == KILLED:
                self.killed.append(record)
                if after_kill is not None:
                    after_kill(record)
                continue
            self.result.require(record.exit_code == 0, f"a run failed: {record.stderr[-600:]}")
            return record
        self.result.require(False, f"the graph was not done after {MAX_RUNS} starts")
        return None

    def killed_at_random(
        self, rng: random.Random, kills: int, work_seconds: float
    ) -> ProcessRecord | None:
        """SIGKILL the graph from outside, ``kills`` times at most, each a random delay after
        the child said it was ready (within ``work_seconds``), then let it finish."""
        for number in range(kills):
            ready = self.folder / f"ready-{number}"
            args = [*self._args(), "--ready", str(ready)]
            out, err = self.folder / f"random-{number}.out", self.folder / f"random-{number}.err"
            began = time.monotonic()
            pid = self.forker.start(["run", *args], {}, out, err)
            code: int | None = None
            while not ready.exists() and code is None:
                if time.monotonic() - began > READY_DEADLINE_SECONDS:
                    break
                code = self.forker.wait(pid, 0.01)
            delay = rng.uniform(0.0, work_seconds)
            if code is None:
                code = self.forker.wait(pid, delay)
            if code is None:  # still running: the kill lands
                os.kill(pid, signal.SIGKILL)
                code = self.forker.wait(pid, None)
            record = forked_record("run", [CHILD, "run", *args], pid, code, out, err, began)
            record.duration_seconds = round(delay, 4)
            self.result.processes.append(record)
            if code == KILLED:
                self.killed.append(record)
            elif code == 0:
                return record
            else:
                self.result.require(False, f"a run failed: {record.stderr[-600:]}")
        return self.until_done()

    # -- what the files hold ---------------------------------------------------------------
    def caller(self, sql: str) -> list[dict[str, Any]]:
        return rows(self.dialect, self.stores.caller, sql)

    def receiver(self, table: str) -> list[dict[str, Any]]:
        return rows(self.dialect, self.stores.downstream, f"SELECT * FROM {table} ORDER BY id")

    def final_state(self) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
        """The thread's messages and what is left to run, read from its last checkpoint."""
        from oncewire.lab.children.langgraph import read_final

        return read_final(self.stores, self.mode)

    def snapshot(self) -> dict[str, Any]:
        durable = self.mode == "durable"
        receipts = rows(
            self.dialect, self.stores.downstream, "SELECT key FROM oncewire_receipts ORDER BY key"
        )
        return {
            "effects": self.caller(
                "SELECT key, kind, state, attempts FROM oncewire_effects ORDER BY key"
            )
            if durable
            else [],
            "runs": self.caller(
                "SELECT thread_id, state, attempts, error FROM oncewire_lg_runs ORDER BY thread_id"
            )
            if durable
            else [],
            "tickets": self.receiver("tickets"),
            "tool_attempts": self.receiver("tool_attempts"),
            "receipts": [r["key"] for r in receipts],
        }


def _check_durable(
    scenario: _Scenario, reference: list[dict[str, Any]] | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Check the durable invariants on the scenario's stores; (the summary, final messages)."""
    from oncewire.lab.children.langgraph import THREAD, TICKET_CALLS, TOOL_CALLS

    result = scenario.result
    after = scenario.snapshot()
    result.after = after
    keys = [f"langgraph/{THREAD}//{call['id']}" for call in TOOL_CALLS]
    effects = after["effects"]
    result.require(
        [e["key"] for e in effects] == sorted(keys), f"effects lost or invented: {effects}"
    )
    result.require(all(e["state"] == "done" for e in effects), f"not all done: {effects}")
    tickets = Counter(t["tool_call_id"] for t in after["tickets"])
    result.require(
        tickets == Counter(TICKET_CALLS), f"tickets per call {dict(tickets)}, not one each"
    )
    receipts = sorted(after["receipts"])
    wanted = sorted(f"langgraph/{THREAD}//{call}" for call in TICKET_CALLS)
    result.require(receipts == wanted, f"receipts {receipts}, not one per ticket call")
    attempts: dict[str, list[dict[str, Any]]] = {}
    for row in after["tool_attempts"]:
        attempts.setdefault(row["tool_call_id"], []).append(row)
    for call in TOOL_CALLS:
        tried = attempts.get(call["id"], [])
        result.require(bool(tried), f"{call['id']} never ran")
        result.require(
            all(row["redelivery"] == 1 for row in tried[1:]),
            f"{call['id']} ran again unflagged: {tried}",
        )
    messages, left = scenario.final_state()
    result.require(left == (), f"the run is not done: tasks left {left}")
    if reference is not None:
        result.require(messages == reference, "the final messages differ from the reference")
    runs = after["runs"]
    result.require(
        [(r["thread_id"], r["state"]) for r in runs] == [(THREAD, "done")],
        f"the thread's run is not recorded done: {runs}",
    )
    checkpoints = check_checkpoints(result, scenario.stores.caller, scenario.dialect, THREAD)
    return {
        "backend": scenario.dialect,
        "starts": sum(1 for p in result.processes if p.role == "run"),
        "run_attempts": runs[0]["attempts"] if runs else 0,
        "checkpoints": checkpoints,
        "kills": len(scenario.killed),
        "tickets": len(after["tickets"]),
        "duplicates": sum(n - 1 for n in tickets.values()),
        "redeliveries": sum(r["redelivery"] for r in after["tool_attempts"]),
        "effects_done": sum(e["state"] == "done" for e in effects),
    }, messages


def _timed(result: ScenarioResult, started: float) -> ScenarioResult:
    result.duration_seconds = time.monotonic() - started
    return result


def _uninterrupted(
    ctx: LabContext, forker: Forker
) -> tuple[ScenarioResult, list[dict[str, Any]] | None, float]:
    """The reference run: its result, its final messages (None if it failed) and how long
    its work took after the child was ready."""
    started = time.monotonic()
    result = ScenarioResult("uninterrupted")
    scenario = _Scenario(ctx, forker, result, "uninterrupted", "durable")
    last = scenario.until_done()
    result.require(not scenario.killed, "the uninterrupted run was killed")
    summary, messages = _check_durable(scenario, None)
    result.summary = summary
    response = last.response if last is not None else None
    result.details = {"final_messages": messages, "last_run": response}
    work = RANDOM_WORK_SECONDS
    if isinstance(response, dict) and isinstance(response.get("work_seconds"), int | float):
        work = max(0.2, float(response["work_seconds"]))
    return _timed(result, started), messages if result.passed else None, work


def _armed(
    ctx: LabContext, forker: Forker, point: str, reference: list[dict[str, Any]] | None
) -> ScenarioResult:
    started = time.monotonic()
    result = ScenarioResult(f"armed[{point}]")
    scenario = _Scenario(ctx, forker, result, f"armed-{point}", "durable")
    windows: list[str | None] = []
    name = point.partition("@")[0]

    def landed(record: ProcessRecord) -> None:
        from oncewire.lab.children.langgraph import THREAD, unfinished

        calls = unfinished(scenario.folder, record.pid, WINDOWS[name][0])
        stores = scenario.stores
        windows.append(check_window(result, stores.caller, scenario.dialect, THREAD, name, calls))

    scenario.until_done(point, landed if name in WINDOWS else None)
    if not scenario.token.exists():
        result.skipped = f"{point} is not reached on the durable graph's path"
        return _timed(result, started)
    result.require(len(scenario.killed) == 1, f"{len(scenario.killed)} kills, not one")
    summary, _ = _check_durable(scenario, reference)
    result.summary = {"point": point, **summary}
    if name in WINDOWS:
        result.summary["window"] = windows[0] if windows else None
    return _timed(result, started)


def _random(
    ctx: LabContext, forker: Forker, reference: list[dict[str, Any]] | None, work_seconds: float
) -> ScenarioResult:
    started = time.monotonic()
    result = ScenarioResult("random_kills")
    scenario = _Scenario(ctx, forker, result, "random-kills", "durable")
    kills = int(ctx.options.get("kills") or RANDOM_KILLS)
    scenario.killed_at_random(random.Random(f"langgraph/{ctx.seed}"), kills, work_seconds)
    summary, _ = _check_durable(scenario, reference)
    # The kills that landed once a tool had started in the killed process (not wasted on
    # the imports or the first model step).
    acted = {row["pid"] for row in scenario.receiver("tool_attempts")}
    summary["kills_in_tools"] = sum(1 for record in scenario.killed if record.pid in acted)
    result.summary = summary
    return _timed(result, started)


def _upstream(ctx: LabContext, forker: Forker) -> ScenarioResult:
    """The negative control: LangGraph's ToolNode on its SQLite saver runs a killed tool again."""
    from oncewire.lab.children.langgraph import TICKET_CALLS, TICKET_WRITTEN

    started = time.monotonic()
    result = ScenarioResult("upstream_tool_node_reruns_tool")
    scenario = _Scenario(ctx, forker, result, "upstream", "plain")
    scenario.until_done(TICKET_WRITTEN.name)
    after = scenario.snapshot()
    result.after = after
    result.require(len(scenario.killed) == 1, f"{len(scenario.killed)} kills, not one")
    tickets = Counter(t["tool_call_id"] for t in after["tickets"])
    doubled = sorted(call for call, n in tickets.items() if n > 1)
    # The message's two ticket calls run side by side: the kill may catch one or both written.
    result.require(
        len(doubled) >= 1, f"no call performed twice (the control's duplicate): {dict(tickets)}"
    )
    result.require(set(tickets) == set(TICKET_CALLS), f"a call has no ticket: {dict(tickets)}")
    result.require(
        all(t["redelivery"] == 0 for t in after["tickets"]),
        "a ticket came flagged: ToolNode has nothing to flag it with",
    )
    _, left = scenario.final_state()
    result.require(left == (), f"the run is not done: tasks left {left}")
    result.summary = {
        "kills": len(scenario.killed),
        "tickets": len(after["tickets"]),
        "duplicates": sum(n - 1 for n in tickets.values()),
        "performed_twice": doubled,
        "redeliveries": 0,
    }
    return _timed(result, started)


def all_points() -> list[str]:
    """Every armed scenario's point, in the order the suite runs them: each registered point
    on the durable graph's path, then the saver's points at a later hit."""
    return [*langgraph_points(), *(f"{point}@{LATER_HIT}" for point in WINDOWS)]


# One armed scenario per outcome class (not stored, committed as the chain's head, a tool
# redelivered, a run resumed from its recorded input): the tests' default run, with the
# uninterrupted reference, the random kills and the negative control. ``make soak`` and
# ``oncewire lab`` run :func:`all_points`.
DEFAULT_POINTS = (
    "langgraph.put_before_commit@3",
    "langgraph.writes_after_commit",
    "langgraph.tool_returned",
    "lab.langgraph.before_first_checkpoint",
)


def run_points(ctx: LabContext, points: Sequence[str] | None = None) -> Iterator[ScenarioResult]:
    """The uninterrupted reference, the armed scenarios of ``points`` (all of them:
    :func:`all_points`), the random kills and the negative control."""
    missing = missing_langgraph_extra("the langgraph suite")
    if missing is not None:
        result = ScenarioResult("langgraph")
        result.skipped = str(missing)
        yield result
        return
    if points is None:  # read only with the extra: the points are declared by its modules
        points = all_points()
    (ctx.root / "langgraph").mkdir(parents=True, exist_ok=True)
    forker = Forker(CHILD, ctx.root / "langgraph" / "forker.log")
    try:
        ctx.progress.update("langgraph: uninterrupted")
        first, reference, work_seconds = _uninterrupted(ctx, forker)
        yield first
        for point in points:
            ctx.progress.update(f"langgraph: {point}")
            yield _armed(ctx, forker, point, reference)
        ctx.progress.update("langgraph: random kills")
        yield _random(ctx, forker, reference, work_seconds)
        ctx.progress.update("langgraph: upstream ToolNode (negative control)")
        yield _upstream(ctx, forker)
    finally:
        forker.close()


def run_langgraph(ctx: LabContext) -> Iterator[ScenarioResult]:
    yield from run_points(ctx)


SUITE = Suite(
    "langgraph",
    "a LangGraph agent's DurableToolNode SIGKILLed at every crash point and at random, "
    "with ToolNode's duplicate as the negative control",
    run_langgraph,
    key_numbers=(
        "backend",
        "point",
        "starts",
        "kills",
        "run_attempts",
        "kills_in_tools",
        "tickets",
        "duplicates",
        "redeliveries",
        "checkpoints",
    ),
)
