"""Suite ``langgraph``: a LangGraph agent's tools under SIGKILL, in real processes.

Each scenario runs the child of :mod:`oncewire.lab.children.langgraph` (an agent graph with a
scripted model, whose ``open_ticket`` tool writes tickets into a receiver in another store) in
a folder of its own, SIGKILLs it, and starts it again on the same files until the graph is
done. Every verdict is read from the files: the ledger's effects, the receiver's tickets,
receipts and tool attempt log, and the graph's last checkpoint.

* ``uninterrupted``: the run without a crash; its final messages are the reference;
* ``armed[POINT]``: every registered crash point of the tool node's path (``langgraph.*``, the
  lab tool's ``lab.langgraph.ticket_written``, and the ``effects.``, ``dispatch.`` and
  ``receipts.`` points it crosses) armed in turn, fired once in the scenario's process tree;
  a point the run does not reach is reported as not applicable;
* ``random_kills``: the child killed from outside after seeded random delays, again and again,
  until a run finishes;
* ``upstream_tool_node_reruns_tool`` (the negative control, LangGraph issues #7417 and #7213):
  the same graph on LangGraph's ``ToolNode`` and ``SqliteSaver``, killed once the first ticket
  is written: the resumed graph runs that tool again and the receiver holds two tickets for one
  call (for both, when the other call had written its ticket too), neither flagged. It
  passes when the lab sees that duplicate; the durable scenarios pass when it is never there.

The durable invariants: every tool call has exactly one effect, ``done``; each
``open_ticket`` call wrote exactly one ticket and one receipt under its key; every attempt of
a call after its first was flagged a redelivery; the final messages equal the uninterrupted
run's; and the run was not lost (the last checkpoint has nothing left to do).

The files are SQLite whatever ``--backend`` says: the graph checkpoints with LangGraph's SQLite
saver, beside them. Without the ``langgraph`` extra the suite is one scenario reported not
applicable, in one line.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from oncewire.core import crash, extras
from oncewire.core.errors import MissingExtra
from oncewire.lab.fixtures import rows
from oncewire.lab.framework import LabContext, ProcessRecord, ScenarioResult, Suite

__all__ = ["CHILD", "SUITE", "langgraph_points", "missing_langgraph_extra", "run_langgraph"]

CHILD = "oncewire.lab.children.langgraph"
KILLED = -signal.SIGKILL
MAX_RUNS = 8  # starts of one scenario's graph before the lab calls it stuck
POINT_PREFIXES = ("langgraph.", "lab.langgraph.", "effects.", "dispatch.", "receipts.")
RANDOM_KILLS = 4
# The child spends most of its first ~1.5 s importing; the graph's work comes after.
RANDOM_DELAY_SECONDS = (1.2, 2.6)


def missing_langgraph_extra(feature: str) -> MissingExtra | None:
    """What ``feature`` would raise for the ``langgraph`` extra's missing modules (and the
    SQLite saver the suite checkpoints with); None when all are installed."""
    missing = extras.missing("langgraph") + extras.missing(
        "langgraph", ("langgraph.checkpoint.sqlite",)
    )
    return MissingExtra(feature, "langgraph", missing) if missing else None


def langgraph_points() -> list[str]:
    """The registered crash points on the durable graph's path."""
    import oncewire.dispatch.dispatcher
    import oncewire.effects.outbox
    import oncewire.lab.children.langgraph
    import oncewire.langgraph.tools
    import oncewire.receipts  # noqa: F401  (importing registers their points)

    return [name for name in crash.registry() if name.startswith(POINT_PREFIXES)]


class _Scenario:
    """One scenario's folder and the runs of its child."""

    def __init__(self, ctx: LabContext, result: ScenarioResult, name: str, mode: str) -> None:
        self.ctx = ctx
        self.result = result
        self.mode = mode
        self.folder = ctx.scenario_dir("langgraph", name)
        self.token = self.folder / "crash.token"
        self.killed: list[ProcessRecord] = []
        init = self._child("init")
        result.require(init.exit_code == 0, f"init failed: {init.stderr[-400:]}")

    def _child(self, role: str, arm: str | None = None) -> ProcessRecord:
        args = ["--folder", str(self.folder), "--mode", self.mode]
        record = self.ctx.child(role, args, arm=arm, token=self.token, module=CHILD)
        self.result.processes.append(record)
        return record

    def until_done(self, arm: str | None = None) -> ProcessRecord | None:
        """Start the graph until a run ends it (a crash point armed in each start, fired at
        most once in all); the last run, or None if none finished."""
        for _ in range(MAX_RUNS):
            record = self._child("run", arm)
            if record.exit_code == KILLED:
                self.killed.append(record)
                continue
            self.result.require(record.exit_code == 0, f"a run failed: {record.stderr[-600:]}")
            return record
        self.result.require(False, f"the graph was not done after {MAX_RUNS} starts")
        return None

    def killed_at_random(self, rng: random.Random, kills: int) -> ProcessRecord | None:
        """SIGKILL the graph from outside after random delays, ``kills`` times at most, then
        let it finish."""
        for _ in range(kills):
            process = self.ctx.spawn("run", ["--folder", str(self.folder)], module=CHILD)
            delay = rng.uniform(*RANDOM_DELAY_SECONDS)
            try:
                process.wait(timeout=delay)
            except Exception:  # still running: the kill lands
                process.send_signal(signal.SIGKILL)
            _, err = process.communicate()
            record = ProcessRecord(
                role="run",
                argv=["-m", CHILD, "run", "--folder", str(self.folder)],
                pid=process.pid,
                exit_code=process.returncode,
                response=None,
                stderr=err[-2000:],
                duration_seconds=round(delay, 4),
            )
            self.result.processes.append(record)
            if process.returncode == KILLED:
                self.killed.append(record)
            elif process.returncode == 0:
                return record
            else:
                self.result.require(False, f"a run failed: {err[-600:]}")
        return self.until_done()

    # -- what the files hold ---------------------------------------------------------------
    def effects(self) -> list[dict[str, Any]]:
        return rows(
            "sqlite",
            str(self.folder / "caller.sqlite"),
            "SELECT key, kind, state, attempts FROM oncewire_effects ORDER BY key",
        )

    def receiver(self, table: str) -> list[dict[str, Any]]:
        return rows("sqlite", str(self.folder / "downstream.sqlite"), f"SELECT * FROM {table}")

    def final_state(self) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
        """The thread's messages and what is left to run, read from its last checkpoint."""
        from oncewire.lab.children.langgraph import THREAD, build_graph, final_messages

        app = build_graph(self.folder, self.mode)
        state = app.get_state({"configurable": {"thread_id": THREAD}})
        return final_messages(state.values.get("messages", [])), tuple(t.name for t in state.tasks)

    def snapshot(self) -> dict[str, Any]:
        return {
            "effects": self.effects() if self.mode == "durable" else [],
            "tickets": self.receiver("tickets"),
            "tool_attempts": self.receiver("tool_attempts"),
            "receipts": [r["key"] for r in self.receiver("oncewire_receipts")],
        }


def _check_durable(
    scenario: _Scenario, reference: list[dict[str, Any]] | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Check the durable invariants on the scenario's files; (the summary, final messages)."""
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
    return {
        "starts": sum(1 for p in result.processes if p.role == "run"),
        "kills": len(scenario.killed),
        "tickets": len(after["tickets"]),
        "duplicates": sum(n - 1 for n in tickets.values()),
        "redeliveries": sum(r["redelivery"] for r in after["tool_attempts"]),
        "effects_done": sum(e["state"] == "done" for e in effects),
    }, messages


def _timed(result: ScenarioResult, started: float) -> ScenarioResult:
    result.duration_seconds = time.monotonic() - started
    return result


def _uninterrupted(ctx: LabContext) -> tuple[ScenarioResult, list[dict[str, Any]] | None]:
    started = time.monotonic()
    result = ScenarioResult("uninterrupted")
    scenario = _Scenario(ctx, result, "uninterrupted", "durable")
    last = scenario.until_done()
    result.require(not scenario.killed, "the uninterrupted run was killed")
    summary, messages = _check_durable(scenario, None)
    result.summary = summary
    result.details = {"final_messages": messages, "last_run": last and last.response}
    return _timed(result, started), messages if result.passed else None


def _armed(ctx: LabContext, point: str, reference: list[dict[str, Any]] | None) -> ScenarioResult:
    started = time.monotonic()
    result = ScenarioResult(f"armed[{point}]")
    scenario = _Scenario(ctx, result, f"armed-{point}", "durable")
    scenario.until_done(point)
    if not scenario.token.exists():
        result.skipped = f"{point} is not reached on the durable graph's path"
        return _timed(result, started)
    result.require(len(scenario.killed) == 1, f"{len(scenario.killed)} kills, not one")
    summary, _ = _check_durable(scenario, reference)
    result.summary = {"point": point, **summary}
    return _timed(result, started)


def _random(ctx: LabContext, reference: list[dict[str, Any]] | None) -> ScenarioResult:
    started = time.monotonic()
    result = ScenarioResult("random_kills")
    scenario = _Scenario(ctx, result, "random-kills", "durable")
    kills = int(ctx.options.get("kills") or RANDOM_KILLS)
    scenario.killed_at_random(random.Random(f"langgraph/{ctx.seed}"), kills)
    summary, _ = _check_durable(scenario, reference)
    result.summary = summary
    return _timed(result, started)


def _upstream(ctx: LabContext) -> ScenarioResult:
    """The negative control: LangGraph's ToolNode on its SQLite saver runs a killed tool again."""
    from oncewire.lab.children.langgraph import TICKET_CALLS, TICKET_WRITTEN

    started = time.monotonic()
    result = ScenarioResult("upstream_tool_node_reruns_tool")
    scenario = _Scenario(ctx, result, "upstream", "plain")
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


def run_langgraph(ctx: LabContext) -> Iterator[ScenarioResult]:
    missing = missing_langgraph_extra("the langgraph suite")
    if missing is not None:
        result = ScenarioResult("langgraph")
        result.skipped = str(missing)
        yield result
        return
    ctx.progress.update("langgraph: uninterrupted")
    first, reference = _uninterrupted(ctx)
    yield first
    for point in langgraph_points():
        ctx.progress.update(f"langgraph: {point}")
        yield _armed(ctx, point, reference)
    ctx.progress.update("langgraph: random kills")
    yield _random(ctx, reference)
    ctx.progress.update("langgraph: upstream ToolNode (negative control)")
    yield _upstream(ctx)


SUITE = Suite(
    "langgraph",
    "a LangGraph agent's DurableToolNode SIGKILLed at every crash point and at random, "
    "with ToolNode's duplicate as the negative control",
    run_langgraph,
    key_numbers=("point", "starts", "kills", "tickets", "duplicates", "redeliveries"),
)
