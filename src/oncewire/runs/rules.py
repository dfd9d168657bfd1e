"""The rules every workflow preset's table shares: request checks, the action ledger's guards
and rows, and the release (``abandon``).

A preset (:mod:`oncewire.runs.turn.table`, :mod:`oncewire.runs.review.table`) names its own
states and guards; what is written here means the same in each of them, so a proposal, a
resolution or a release reads and projects alike whichever workflow the run follows. A state
using these keeps ``unresolved``: action id -> ``{"class", "effect_key"}`` (a preset may add
keys, such as the review's ``phase``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from oncewire.core.canonical import canonical_json_unchecked
from oncewire.runs.machine import Request, Rows, State, Step
from oncewire.runs.records import WORLD_CHANGING, ActionState, SideEffectClass
from oncewire.storage.runs import ActionRow

__all__ = [
    "abandon",
    "guard_abandon",
    "guard_resolve",
    "proposal_problem",
    "proposed_row",
    "resolved_row",
    "text_problem",
    "world_open",
]


def text_problem(request: Request, name: str) -> str | None:
    """Why ``request[name]`` is not a non-empty string, or None when it is."""
    value = request.get(name)
    if not isinstance(value, str) or not value:
        return f"{name} must be a non-empty string"
    return None


def world_open(state: State, phase_id: str | None = None) -> list[str]:
    """Unresolved world-changing actions (of one phase, or of the whole run)."""
    return sorted(
        action_id
        for action_id, action in state["unresolved"].items()
        if action["class"] in WORLD_CHANGING and (phase_id is None or action["phase"] == phase_id)
    )


# -- the action ledger -----------------------------------------------------------------------
def proposal_problem(state: State, request: Request) -> str | None:
    """What every preset refuses in a proposal: an unknown side-effect class, and an action id
    already proposed (checked after the preset's own rules)."""
    if request.get("side_effect_class") not in {c.value for c in SideEffectClass}:
        return f"unknown side-effect class {request.get('side_effect_class')!r}"
    if request["action_id"] in state["unresolved"]:
        return f"action {request['action_id']!r} is already proposed"
    return None


def proposed_row(step: Step, request: Request, phase_id: str | None) -> ActionRow:
    """The action ledger's row of a proposal: what runs, with which arguments, before it runs."""
    arguments_json = canonical_json_unchecked(request.get("arguments"))
    return ActionRow(
        run_id=step.run_id,
        action_id=request["action_id"],
        phase_id=phase_id,
        kind=request["kind"],
        arguments_json=arguments_json,
        arguments_digest=hashlib.sha256(arguments_json.encode("utf-8")).hexdigest(),
        side_effect_class=request["side_effect_class"],
        resource_keys_json=canonical_json_unchecked(list(request.get("resource_keys") or [])),
        effect_key=request.get("effect_key"),
        status=ActionState.PROPOSED.value,
        result_json=None,
        proposed_seq=step.seq,
        resolved_seq=None,
    )


def guard_resolve(state: State, request: Request) -> str | None:
    """A resolution names a proposed, unresolved action and how it ended."""
    action = state["unresolved"].get(request.get("action_id"))
    if action is None:
        return f"action {request.get('action_id')!r} is not proposed and unresolved"
    if request.get("status") not in (
        ActionState.SUCCEEDED,
        ActionState.FAILED,
        ActionState.NOT_RUN,
    ):
        return "status must be succeeded, failed or not_run"
    return None


def resolved_row(
    step: Step, request: Request, action: dict[str, Any], phase_id: str | None
) -> ActionRow:
    """The action ledger's row of a resolution (``action`` is its entry in ``unresolved``)."""
    return ActionRow(
        run_id=step.run_id,
        action_id=request["action_id"],
        phase_id=phase_id,
        kind="",
        arguments_json="null",
        arguments_digest="",
        side_effect_class=action["class"],
        resource_keys_json="[]",
        effect_key=action["effect_key"],
        status=str(request["status"]),
        result_json=canonical_json_unchecked(request.get("result")),
        proposed_seq=0,
        resolved_seq=step.seq,
    )


# -- release ---------------------------------------------------------------------------------
def guard_abandon(state: State, request: Request) -> str | None:
    return text_problem(request, "reason")


def abandon(state: State, request: Request, step: Step, rows: Rows) -> None:
    # Not a terminal: the status keeps saying what the run was doing when it was released.
    state["abandoned"] = {"reason": request["reason"], "at": step.at}
