"""The agents suite's verdict, read from the stores and the child's logs.

:func:`check_durable` requires, of a durable run that ended: the run's record holds its three
model steps and every tool call one effect, ``done``; each ``open_ticket`` call wrote one
ticket and one receipt under its key; every attempt of a call after its first was flagged a
redelivery; no model step was asked for after it was recorded (each call the scripted model
logged, across processes, came before its step's ``created_at``; in a scenario armed at one
point whose window does not lie between a model call and its record, each step was asked
exactly once; at one where it may (``effects.accept_before_commit``, in the transaction
recording a step, and ``dispatch.after_record``, on the dispatcher's thread while the run's may
already have asked for its next step), no step more than twice, and only the one killed before
its record committed); and the final output is the uninterrupted run's. The scenario's outcome
class is required too: ``replayed`` (the kill came before the interrupted step's tool ran: each
tool's body ran once; its attempt may still come flagged, when the killed process's dispatcher
had claimed it and was waiting for the run to hand it the call, which a claim cannot tell from
a call under way), ``redelivered`` (the tool may have run: an attempt is flagged, the
receiver's receipt kept it from acting twice) or ``answered`` (the effect had ended: the
resumed run was given its answer, nothing ran again, nothing is flagged).

:func:`check_stream` reads what the consumer of a streamed run saw in its last process: each of
the three steps once as a completed response, a recorded step never as text deltas (a delta
only inside a live step, between its ``response.created`` and its ``response.completed``), and
as many live steps as that process asked the model for.

:func:`check_control` is the negative control's verdict: the plain SDK run, started again from
its input, asked its model for the first step again and opened the first ticket twice, neither
flagged. It passes when the duplicate is there.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from oncewire.lab.children.agents import (
    ALL_CALLS,
    EVENTS,
    FINAL,
    RUN_KEY,
    STEPS,
    TICKET_CALLS,
    Stores,
    call_key,
    model_calls,
)
from oncewire.lab.fixtures import rows
from oncewire.lab.framework import ScenarioResult

__all__ = ["OUTCOMES", "check_control", "check_durable", "check_stream", "snapshot"]

# The outcome classes of a kill, as the resumed run meets it (see the module docstring).
OUTCOMES = ("replayed", "redelivered", "answered")


def snapshot(stores: Stores, durable: bool) -> dict[str, Any]:
    """What the stores hold after the scenario, read with the plain drivers."""
    dialect = stores.dialect
    caller: dict[str, Any] = {"effects": [], "steps": []}
    if durable:
        caller["effects"] = rows(
            dialect,
            stores.caller,
            "SELECT key, kind, state, attempts FROM oncewire_effects ORDER BY key",
        )
        caller["steps"] = rows(
            dialect,
            stores.caller,
            "SELECT run_key, step, created_at FROM oncewire_agent_steps ORDER BY run_key, step",
        )
    receipts = rows(dialect, stores.downstream, "SELECT key FROM oncewire_receipts ORDER BY key")
    return {
        **caller,
        "tickets": rows(dialect, stores.downstream, "SELECT * FROM tickets ORDER BY id"),
        "tool_attempts": rows(
            dialect, stores.downstream, "SELECT * FROM tool_attempts ORDER BY id"
        ),
        "receipts": [r["key"] for r in receipts],
        "model_calls": model_calls(stores.folder),
    }


def check_durable(
    result: ScenarioResult,
    stores: Stores,
    *,
    output: Any,
    reference: Any,
    kills: int,
    armed: bool,
    outcome: str | None,
    may_ask_again: bool = False,
) -> dict[str, Any]:
    """Require the durable invariants (see the module docstring); the scenario's summary."""
    after = snapshot(stores, durable=True)
    result.after = after
    keys = sorted(call_key(call) for call in ALL_CALLS)
    effects = after["effects"]
    result.require([e["key"] for e in effects] == keys, f"effects lost or invented: {effects}")
    result.require(all(e["state"] == "done" for e in effects), f"not all done: {effects}")
    steps = {s["step"]: float(s["created_at"]) for s in after["steps"] if s["run_key"] == RUN_KEY}
    result.require(sorted(steps) == sorted(STEPS.values()), f"steps recorded: {sorted(steps)}")
    tickets = Counter(t["key"] for t in after["tickets"])
    wanted = Counter(call_key(call) for call in TICKET_CALLS)
    result.require(tickets == wanted, f"tickets per call {dict(tickets)}, not one each")
    result.require(sorted(after["receipts"]) == sorted(wanted), f"receipts {after['receipts']}")
    attempts: dict[str, list[dict[str, Any]]] = {}
    for row in after["tool_attempts"]:
        attempts.setdefault(row["key"], []).append(row)
    for key in keys:
        of_key = attempts.get(key, [])
        result.require(bool(of_key), f"{key} never ran")
        result.require(
            all(row["redelivery"] == 1 for row in of_key[1:]),
            f"{key} ran again unflagged: {of_key}",
        )
    asked = Counter(call["step"] for call in after["model_calls"])
    late = [
        call
        for call in after["model_calls"]
        if call["step"] in steps and call["at"] > steps[call["step"]]
    ]
    result.require(not late, f"a model step was asked for after it was recorded: {late}")
    result.require(-1 not in asked, "the model was asked a step the script does not have")
    if armed and may_ask_again:
        # Killed where a model call may be made and not recorded: that step asked twice.
        again = [step for step, count in asked.items() if count == 2]
        result.require(
            sorted(asked) == sorted(STEPS.values())
            and len(again) <= kills
            and all(count in (1, 2) for count in asked.values()),
            f"model calls per step {dict(asked)}, not one each but an unrecorded step's two",
        )
    elif armed:
        once = Counter({step: 1 for step in STEPS.values()})
        result.require(asked == once, f"model calls per step {dict(asked)}, not one each")
    result.require(output == FINAL, f"the final output is {output!r}, not the script's")
    if reference is not None:
        result.require(output == reference, f"the final output {output!r} is not {reference!r}")
    redeliveries = sum(r["redelivery"] for r in after["tool_attempts"])
    tried = len(after["tool_attempts"])
    if outcome == "redelivered":
        result.require(redeliveries >= 1, "no attempt was flagged after the kill in a tool")
    elif outcome in ("replayed", "answered"):
        # Each tool's body ran once: the killed process never started the interrupted one.
        result.require(tried == len(keys), f"{tried} tool attempts for {len(keys)} calls")
    if outcome == "answered":
        result.require(redeliveries == 0, f"{redeliveries} redeliveries where none was due")
    return {
        "backend": stores.dialect,
        "kills": kills,
        "model_calls": sum(asked.values()),
        "steps": len(steps),
        "effects_done": sum(e["state"] == "done" for e in effects),
        "tickets": len(after["tickets"]),
        "duplicates": sum(n - 1 for n in tickets.values()),
        "tool_attempts": len(after["tool_attempts"]),
        "redeliveries": redeliveries,
    }


def check_stream(result: ScenarioResult, folder: Path, pid: int) -> dict[str, int]:
    """Require what the consumer of process ``pid`` saw (see the module docstring)."""
    path = folder / EVENTS
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    events = [e["event"] for e in map(json.loads, lines) if e["pid"] == pid]
    live, stray, created, completed = False, 0, 0, 0
    for event in events:
        if event == "raw_response_event:response.created":
            live, created = True, created + 1
        elif event == "raw_response_event:response.completed":
            live, completed = False, completed + 1
        elif "delta" in event and not live:
            stray += 1
    asked = sum(1 for call in model_calls(folder) if call["pid"] == pid)
    result.require(completed == len(STEPS), f"{completed} completed responses, not one per step")
    result.require(stray == 0, f"{stray} deltas outside a live step: a recorded step re-streamed")
    result.require(created == asked, f"{created} live steps streamed, {asked} model calls made")
    result.require(
        bool(events) and events[-1] == "run_item_stream_event:message_output_created",
        f"the stream did not end with the final message: {events[-3:]}",
    )
    return {"replayed_steps": completed - created, "live_steps": created}


def check_control(result: ScenarioResult, stores: Stores, kills: int) -> dict[str, Any]:
    """Require the negative control's duplicate (see the module docstring)."""
    after = snapshot(stores, durable=False)
    result.after = after
    tickets = Counter(t["key"] for t in after["tickets"])
    first = call_key(TICKET_CALLS[0])
    result.require(tickets[first] == 2, f"the first ticket was not opened twice: {dict(tickets)}")
    result.require(
        all(r["redelivery"] == 0 for r in after["tool_attempts"]),
        "an attempt came flagged: the plain Runner has nothing to flag it with",
    )
    asked = Counter(call["step"] for call in after["model_calls"])
    result.require(asked[0] == 2, f"the first model step was not asked twice: {dict(asked)}")
    return {
        "backend": stores.dialect,
        "kills": kills,
        "model_calls": sum(asked.values()),
        "tickets": len(after["tickets"]),
        "duplicates": sum(n - 1 for n in tickets.values()),
        "redeliveries": 0,
    }
