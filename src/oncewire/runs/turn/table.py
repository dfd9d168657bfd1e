"""The turn workflow: one chat turn (an inbound message answered by a model and its tools) as a
preset on the generic machinery.

::

    (new) --start--> running --record_step / steer--> running
    running --request_interrupt--> interrupting
    running, interrupting --propose_action (running only) / resolve_action--> (same)
    running, interrupting --resume--> (same; a new owner took the run over under the next fence)
    running --terminate[answered]--> answered        (the committed reply's text digest)
    running, interrupting --terminate--> interrupted (interrupting only) | failed |
                                         outcome_unknown | cancelled
    running, interrupting --abandon--> (same status, released: nothing follows; not a terminal)

Guards are the truthfulness rules: a turn lives on its session's branch under the run id
``turn:{inbound}``; steps are numbered 1, 2, ... without a gap; a tool call is proposed only as
the latest recorded step asked for it (its name and call id), under the effect key
``turn/{inbound}/s{step}/{index}``; once an interrupt is recorded no step, tool call or steer is
admitted and the turn can no longer be ``answered`` (the interrupt won); ``answered`` carries the
sha256 of the committed reply's text; no terminal but ``outcome_unknown`` can hide a
world-changing tool call whose outcome is not known.
"""

from __future__ import annotations

import enum
import re
from typing import Any

from oncewire.runs.machine import (
    NEW,
    Refusal,
    Request,
    Rows,
    State,
    Step,
    Transition,
    Workflow,
    register,
)
from oncewire.runs.rules import (
    abandon,
    guard_abandon,
    guard_resolve,
    proposal_problem,
    proposed_row,
    resolved_row,
    text_problem,
    world_open,
)

__all__ = [
    "TURN",
    "TURN_ACTIVE",
    "TURN_TERMINAL",
    "TurnState",
    "action_id",
    "effect_key",
    "run_id",
    "session_branch",
    "session_scope",
]


class TurnState(enum.StrEnum):
    """Where a turn stands: active (running, interrupting) or terminal (answered to cancelled)."""

    RUNNING = "running"  # started; model steps and tool calls are being recorded
    INTERRUPTING = "interrupting"  # an interrupt is recorded; only settling and a terminal follow
    ANSWERED = "answered"  # terminal: the reply (its text digest recorded) was committed
    INTERRUPTED = "interrupted"  # terminal: stopped by the recorded interrupt; no answer
    FAILED = "failed"  # terminal: the turn could not answer (an honest failure text, if any)
    OUTCOME_UNKNOWN = "outcome_unknown"  # terminal: a world-changing tool call's end is unknown
    CANCELLED = "cancelled"  # terminal: withdrawn by its caller or an operator


TURN_ACTIVE = frozenset({TurnState.RUNNING, TurnState.INTERRUPTING})
TURN_TERMINAL = frozenset(set(TurnState) - TURN_ACTIVE)
_ACTIVE = frozenset(str(s) for s in TURN_ACTIVE)
_RUNNING = frozenset({str(TurnState.RUNNING)})
_SESSION_FIELDS = ("platform", "bot", "chat", "thread")
_HEX64 = re.compile(r"[0-9a-f]{64}")


# -- names -------------------------------------------------------------------------------------
def _part(value: str) -> str:
    # "/" separates the parts and "%" escapes: both are escaped inside a part, so two sessions
    # never share a scope or a branch whatever their ids contain.
    return value.replace("%", "%25").replace("/", "%2F")


def session_scope(platform: str, bot: str, chat: str) -> str:
    """The run ledger scope of a chat: ``{platform}/{bot}/{chat}``."""
    return "/".join(_part(p) for p in (platform, bot, chat))


def session_branch(platform: str, bot: str, chat: str, thread: str) -> str:
    """The branch of a session: the chat's root branch (its scope) without a thread,
    ``{scope}/{thread}`` in one, so that threads of one chat run in parallel."""
    scope = session_scope(platform, bot, chat)
    return scope if thread == "" else f"{scope}/{_part(thread)}"


def run_id(inbound_id: int) -> str:
    """The one turn run of an inbound message."""
    return f"turn:{inbound_id}"


def action_id(step: int, index: int) -> str:
    """The action id of the ``index``-th tool call (from 0) of step ``step``."""
    return f"s{step}/{index}"


def effect_key(inbound_id: int, step: int, index: int) -> str:
    """The outbox key of a tool call's effect."""
    return f"turn/{inbound_id}/s{step}/{index}"


# -- helpers -----------------------------------------------------------------------------------
def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _positive(value: Any) -> bool:
    return _count(value) and value > 0


def _digest(value: Any) -> bool:
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


# -- start -------------------------------------------------------------------------------------
def _guard_start(state: State, request: Request) -> str | None:
    for name in ("scope", "branch", "workflow"):
        problem = text_problem(request, name)
        if problem:
            return problem
    params = request.get("params")
    if not isinstance(params, dict):
        return "params must be an object"
    inbound = params.get("inbound")
    if not _positive(inbound):
        return "params.inbound must be the inbound message's id (a positive integer)"
    session = params.get("session")
    if not isinstance(session, dict) or sorted(session) != sorted(_SESSION_FIELDS):
        return f"params.session must be an object of {', '.join(_SESSION_FIELDS)}"
    for name in _SESSION_FIELDS:
        value = session[name]
        if not isinstance(value, str) or (not value and name != "thread"):
            return (
                f"the session's {name} must be a {'' if name == 'thread' else 'non-empty '}string"
            )
    scope = session_scope(session["platform"], session["bot"], session["chat"])
    branch = session_branch(session["platform"], session["bot"], session["chat"], session["thread"])
    if (request["scope"], request["branch"]) != (scope, branch):
        return f"a turn runs on its session's scope {scope!r} and branch {branch!r}"
    if request.get("turn") != str(inbound):
        return f"a turn's turn is its inbound id {str(inbound)!r}"
    return None


def _start(state: State, request: Request, step: Step, rows: Rows) -> None:
    params = request["params"]
    if step.run_id != run_id(params["inbound"]):
        raise Refusal(
            f"the turn of inbound {params['inbound']} is run {run_id(params['inbound'])!r}"
        )
    state.update(
        {
            "scope": request["scope"],
            "branch": request["branch"],
            "turn": request["turn"],
            "workflow": request["workflow"],
            "reason": None,
            "created_at": step.at,
            "finished_at": None,
            "abandoned": None,
            "inbound": params["inbound"],
            "session": dict(params["session"]),
            "steps": 0,
            "calls": [],  # the latest step's tool calls: [call id, tool name]
            "unresolved": {},
            "interrupt": None,
            "steered": [],
            "fence": 1,
            "resumes": 0,
            "reply_sha256": None,
        }
    )


# -- steps -------------------------------------------------------------------------------------
def _guard_step(state: State, request: Request) -> str | None:
    number = request.get("step")
    if not _positive(number) or number != state["steps"] + 1:
        return f"the next step is {state['steps'] + 1}, not {number!r}"
    for name in ("request_digest", "response_digest"):
        if not _digest(request.get(name)):
            return f"{name} must be a sha256 hex digest"
    if not isinstance(request.get("usage"), dict):
        return "usage must be an object"
    problem = text_problem(request, "finish_reason")
    if problem:
        return problem
    calls = request.get("tool_calls")
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        return "tool_calls must be a list of objects"
    for call in calls:
        if text_problem(call, "id") or text_problem(call, "name"):
            return "every tool call needs a non-empty id and name"
    if len({c["id"] for c in calls}) != len(calls):
        return "the step's tool call ids must be distinct"
    return None


def _record_step(state: State, request: Request, step: Step, rows: Rows) -> None:
    state["steps"] = request["step"]
    state["calls"] = [[call["id"], call["name"]] for call in request["tool_calls"]]


def _guard_steer(state: State, request: Request) -> str | None:
    inbound = request.get("inbound")
    if not _positive(inbound) or inbound == state["inbound"]:
        return "inbound must be the steering message's id (another inbound's)"
    if inbound in state["steered"]:
        return f"inbound {inbound} already steered this turn"
    if request.get("after_step") != state["steps"]:
        return f"a steer lands after the latest recorded step ({state['steps']})"
    return None


def _steer(state: State, request: Request, step: Step, rows: Rows) -> None:
    state["steered"].append(request["inbound"])


# -- tool calls --------------------------------------------------------------------------------
def _guard_propose(state: State, request: Request) -> str | None:
    number: int = state["steps"]
    if request.get("step") != number or not _positive(number):
        return f"tool calls are proposed for the latest recorded step ({number})"
    index = request.get("index")
    if not isinstance(index, int) or not _count(index) or index >= len(state["calls"]):
        return f"step {number} asked for {len(state['calls'])} tool call(s); no index {index!r}"
    call_id, name = state["calls"][index]
    if request.get("tool_call_id") != call_id or request.get("kind") != name:
        return f"step {number}'s tool call {index} is {name!r} (id {call_id!r})"
    if request.get("action_id") != action_id(number, index):
        return f"the action id of that call is {action_id(number, index)!r}"
    effect = request.get("effect_key")
    if effect is not None and effect != effect_key(state["inbound"], number, index):
        return f"the call's effect key is {effect_key(state['inbound'], number, index)!r}"
    return proposal_problem(state, request)


def _propose(state: State, request: Request, step: Step, rows: Rows) -> None:
    state["unresolved"][request["action_id"]] = {
        "class": request["side_effect_class"],
        "effect_key": request.get("effect_key"),
    }
    rows.actions.append(proposed_row(step, request, None))


def _resolve(state: State, request: Request, step: Step, rows: Rows) -> None:
    action = state["unresolved"].pop(request["action_id"])
    rows.actions.append(resolved_row(step, request, action, None))


# -- interrupts and takeovers ------------------------------------------------------------------
def _guard_interrupt(state: State, request: Request) -> str | None:
    by = request.get("by")
    if by is not None and (not _positive(by) or by == state["inbound"]):
        return "by must be the interrupting message's id (another inbound's) or null"
    return text_problem(request, "reason")


def _interrupt(state: State, request: Request, step: Step, rows: Rows) -> None:
    state["interrupt"] = {"by": request.get("by"), "reason": request["reason"], "seq": step.seq}


def _guard_resume(state: State, request: Request) -> str | None:
    problem = text_problem(request, "owner") or text_problem(request, "reason")
    if problem:
        return problem
    if request.get("from_fence") != state["fence"] or request.get("fence") != state["fence"] + 1:
        return f"a takeover moves the fence from {state['fence']} to {state['fence'] + 1}"
    return None


def _resume(state: State, request: Request, step: Step, rows: Rows) -> None:
    state["fence"] = request["fence"]
    state["resumes"] += 1


# -- terminal ----------------------------------------------------------------------------------
def _guard_terminate(state: State, request: Request) -> str | None:
    status = request.get("status")
    if status not in {str(s) for s in TURN_TERMINAL}:
        return f"{status!r} is not a turn's terminal status"
    problem = text_problem(request, "reason")
    if problem:
        return problem
    reply = request.get("reply_sha256")
    if reply is not None and not _digest(reply):
        return "reply_sha256 must be a sha256 hex digest"
    current = state["status"]
    if status == TurnState.ANSWERED:
        if current != TurnState.RUNNING:
            return "the turn was interrupted before its answer was committed"
        if reply is None:
            return "answered needs the committed reply's text digest (reply_sha256)"
    if status == TurnState.INTERRUPTED and current != TurnState.INTERRUPTING:
        return "interrupted needs a recorded interrupt"
    open_world = world_open(state)
    if status != TurnState.OUTCOME_UNKNOWN and open_world:
        return f"tool calls {open_world} may have changed the world: the outcome is unknown"
    return None


def _terminate(state: State, request: Request, step: Step, rows: Rows) -> None:
    state["status"] = str(request["status"])
    state["reason"] = str(request["reason"])
    state["reply_sha256"] = request.get("reply_sha256")
    state["finished_at"] = step.at


TURN = register(
    Workflow(
        "turn",
        (
            Transition("start", frozenset({NEW}), "run_started", "running", _start, _guard_start),
            Transition("record_step", _RUNNING, "step_recorded", None, _record_step, _guard_step),
            Transition("steer", _RUNNING, "run_steered", None, _steer, _guard_steer),
            Transition(
                "propose_action", _RUNNING, "action_proposed", None, _propose, _guard_propose
            ),
            Transition("resolve_action", _ACTIVE, "action_resolved", None, _resolve, guard_resolve),
            Transition(
                "request_interrupt",
                _RUNNING,
                "interrupt_requested",
                "interrupting",
                _interrupt,
                _guard_interrupt,
            ),
            Transition("resume", _ACTIVE, "run_resumed", None, _resume, _guard_resume),
            Transition(
                "terminate", _ACTIVE, "run_terminated", None, _terminate, _guard_terminate, True
            ),
            Transition("abandon", _ACTIVE, "run_abandoned", None, abandon, guard_abandon),
        ),
        terminal_statuses=frozenset(str(s) for s in TURN_TERMINAL),
    )
)
