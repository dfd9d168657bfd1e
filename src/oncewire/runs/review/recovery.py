"""How the review preset closes a run that a dead owner left mid-flight.

The plan is what a live run would do, decided only from what is known: an interrupted review
ends ``review_unavailable`` with no invented findings; an unresolved world-changing action makes
the outcome unknown; a repair with no action ledger cannot be described truthfully and is
released as abandoned. Each step then goes through the normal command path.
"""

from __future__ import annotations

from typing import Any

from oncewire.runs.machine import State
from oncewire.runs.records import WORLD_CHANGING, RunState, Verdict

__all__ = ["UNAVAILABLE_SUMMARY", "recovery_plan"]

UNAVAILABLE_SUMMARY = (
    "The review did not finish: the process running it exited before the reviewer answered. "
    "No verdict and no findings were produced."
)


def recovery_plan(
    state: State, effect_states: dict[str, str], *, reason: str
) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
    """What a live run would do to close itself, decided from what is known.

    Returns the commands to run (each through the normal path), or ``([], why)`` when nothing
    truthful can be said and the run must be released as abandoned instead. An unresolved
    world-changing action linked to an effect that the outbox says was rejected or cancelled
    never happened; any other unresolved one has an unknown outcome.
    """
    phase = state["phase"]
    steps: list[tuple[str, dict[str, Any]]] = []
    unknown: list[str] = []
    changed = bool(state["changed"])
    for action_id, action in sorted(state["unresolved"].items()):
        effect_state = effect_states.get(action.get("effect_key") or "")
        if effect_state in ("done", "rejected", "cancelled"):
            # The outbox knows how the linked effect ended: record that, as a live run would.
            happened = effect_state == "done"
            steps.append(
                (
                    "resolve_action",
                    {
                        "action_id": action_id,
                        "status": "succeeded" if happened else "failed",
                        "result": {
                            "effect_key": action["effect_key"],
                            "effect_state": effect_state,
                        },
                    },
                )
            )
            if (
                happened
                and action["class"] in WORLD_CHANGING
                and phase
                and action["phase"] == phase["id"]
            ):
                changed = True
        elif action["class"] in WORLD_CHANGING:
            unknown.append(action_id)
    if phase is not None and phase["kind"] == "review":
        steps.append(
            (
                "complete_review",
                {
                    "review_id": phase["id"],
                    "status": "unavailable",
                    "verdict": Verdict.REVIEW_UNAVAILABLE.value,
                    "assessment": {"summary": UNAVAILABLE_SUMMARY, "recovered": True},
                    "findings": [],
                    "usage": {},
                },
            )
        )
        final = RunState.OUTCOME_UNKNOWN if unknown else RunState.REVIEW_UNAVAILABLE
    elif phase is not None and phase["kind"] == "repair":
        if not phase["bound"]:
            return [], "repair_untracked"  # no ledger: nothing truthful can be said
        phase_unknown = changed or any(
            state["unresolved"][a]["phase"] == phase["id"] for a in unknown
        )
        status = "outcome_unknown" if phase_unknown else "interrupted"
        steps.append(("complete_repair", {"repair_id": phase["id"], "status": status}))
        if phase_unknown or unknown:
            final = RunState.OUTCOME_UNKNOWN
        else:
            final = RunState.COMPLETED_WITH_ISSUES
            reason = "repair_interrupted"
    elif state["status"] == RunState.UNSETTLED or unknown:
        final = RunState.OUTCOME_UNKNOWN
    else:
        final = RunState.REVIEW_UNAVAILABLE
    steps.append(("terminate", {"status": final.value, "reason": reason}))
    return steps, None
