"""The review workflow: one preset on the generic machinery.

::

    (new) --start--> running --record_candidate--> candidate --start_review--> reviewing
                                                  ^    |  ^                        |
                                                  |    |  +----complete_review-----+
                                                  |    +--start_repair--> repairing (bind_actions)
                                                  +-----complete_repair[completed|interrupted]--+
                                   repairing --complete_repair[outcome_unknown]--> unsettled
    any active --propose_action / resolve_action--> (same state)
    any active without an open phase --terminate--> verified | completed_with_issues |
                                         review_unavailable | outcome_unknown | failed | cancelled
    any active --abandon--> (same status, released: nothing follows; not a terminal)

Guards are the truthfulness rules: ``verified`` needs a passing review of the current
candidate; a review's verdict binds to the candidate it opened on; a repair with a world-changing
action not known to have finished cannot claim a new candidate.
"""

from __future__ import annotations

from typing import Any

from oncewire.core.canonical import canonical_json_unchecked
from oncewire.runs.machine import NEW, Request, Rows, State, Step, Transition, Workflow, register
from oncewire.runs.records import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    WORLD_CHANGING,
    ActionState,
    RunState,
    Verdict,
)
from oncewire.runs.review.recovery import UNAVAILABLE_SUMMARY, recovery_plan
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
from oncewire.storage.runs import FindingRow, PhaseRow

__all__ = ["REVIEW", "UNAVAILABLE_SUMMARY", "recovery_plan"]

ACTIVE = frozenset(str(s) for s in ACTIVE_STATUSES)
_CANDIDATE_FIELDS = (
    "candidate_id",
    "snapshot_sha256",
    "evidence_sha256",
    "artifact_set_sha256",
    "artifact_ids",
    "version_ids",
)


# -- helpers -----------------------------------------------------------------------------------
def _candidate_problem(candidate: Any) -> str | None:
    if not isinstance(candidate, dict):
        return "candidate must be an object"
    missing = [name for name in _CANDIDATE_FIELDS if name not in candidate]
    if missing:
        return f"candidate lacks {', '.join(missing)}"
    return text_problem(candidate, "candidate_id")


def _phase_row(step: Step, phase: dict[str, Any], status: str, **closing: Any) -> PhaseRow:
    return PhaseRow(
        run_id=step.run_id,
        phase_id=phase["id"],
        kind=phase["kind"],
        status=status,
        verdict=closing.get("verdict"),
        candidate_id=phase["candidate_id"],
        body_json=canonical_json_unchecked(phase["body"]),
        result_json=None
        if "result" not in closing
        else canonical_json_unchecked(closing["result"]),
        actions_bound=bool(phase["bound"]),
        opened_seq=phase["opened_seq"],
        closed_seq=step.seq if status != "open" else None,
        opened_at=phase["opened_at"],
        closed_at=step.at if status != "open" else None,
    )


# -- start and candidates ------------------------------------------------------------------------
def _guard_start(state: State, request: Request) -> str | None:
    for name in ("scope", "branch", "workflow"):
        problem = text_problem(request, name)
        if problem:
            return problem
    if not isinstance(request.get("params", {}), dict):
        return "params must be an object"
    return None


def _start(state: State, request: Request, step: Step, rows: Rows) -> None:
    params = dict(request.get("params") or {})
    state.update(
        {
            "scope": request["scope"],
            "branch": request["branch"],
            "turn": request.get("turn"),
            "workflow": request["workflow"],
            "budgets": params.get("budgets") or {},
            "reason": None,
            "created_at": step.at,
            "finished_at": None,
            "candidate": None,
            "phase": None,
            "last_review": None,
            "reviews": 0,
            "repairs": 0,
            "unresolved": {},
            "changed": False,
            "abandoned": None,
        }
    )


def _guard_candidate(state: State, request: Request) -> str | None:
    return _candidate_problem(request.get("candidate"))


def _record_candidate(state: State, request: Request, step: Step, rows: Rows) -> None:
    state["candidate"] = dict(request["candidate"])


# -- reviews -------------------------------------------------------------------------------------
def _guard_start_review(state: State, request: Request) -> str | None:
    problem = text_problem(request, "review_id")
    if problem:
        return problem
    candidate = state["candidate"] or {}
    if request.get("candidate_id") != candidate.get("candidate_id"):
        return (
            f"review opened on candidate {request.get('candidate_id')!r}, but the current "
            f"candidate is {candidate.get('candidate_id')!r}"
        )
    if request.get("evidence_sha256") != candidate.get("evidence_sha256"):
        return "the review's evidence digest is not the current candidate's"
    budget = state["budgets"].get("max_review_attempts")
    if isinstance(budget, int) and state["reviews"] >= budget:
        return f"the review budget ({budget}) is spent"
    return None


def _start_review(state: State, request: Request, step: Step, rows: Rows) -> None:
    phase = {
        "id": request["review_id"],
        "kind": "review",
        "candidate_id": request["candidate_id"],
        "bound": False,
        "opened_seq": step.seq,
        "opened_at": step.at,
        "body": {k: v for k, v in request.items() if k != "review_id"},
    }
    state["phase"] = phase
    state["reviews"] += 1
    rows.phases.append(_phase_row(step, phase, "open"))


def _guard_complete_review(state: State, request: Request) -> str | None:
    phase = state["phase"] or {}
    if request.get("review_id") != phase.get("id"):
        return f"review {request.get('review_id')!r} is not the open review {phase.get('id')!r}"
    status, verdict = request.get("status"), request.get("verdict")
    findings = request.get("findings") or []
    if not isinstance(findings, list) or not all(isinstance(f, dict) for f in findings):
        return "findings must be a list of objects"
    if status == "unavailable":
        if verdict != Verdict.REVIEW_UNAVAILABLE or findings:
            return "an unavailable review has verdict review_unavailable and no findings"
    elif status == "completed":
        if verdict not in (Verdict.PASS, Verdict.ISSUES, Verdict.FAILED):
            return "a completed review's verdict is pass, issues or failed"
    else:
        return "status must be completed or unavailable"
    ids = [f.get("finding_id") for f in findings]
    if not all(isinstance(i, str) and i for i in ids) or len(set(ids)) != len(ids):
        return "every finding needs a distinct finding_id"
    if any(
        f.get("candidate_id", phase.get("candidate_id")) != phase.get("candidate_id")
        for f in findings
    ):
        return "a finding is bound to another candidate than the review's"
    return None


def _complete_review(state: State, request: Request, step: Step, rows: Rows) -> None:
    phase = state["phase"]
    findings = list(request.get("findings") or [])
    verdict = str(request["verdict"])
    state["last_review"] = {
        "id": phase["id"],
        "candidate_id": phase["candidate_id"],
        "verdict": verdict,
        "findings": [f["finding_id"] for f in findings],
    }
    state["phase"] = None
    result = {
        "assessment": request.get("assessment") or {},
        "usage": request.get("usage") or {},
    }
    rows.phases.append(
        _phase_row(step, phase, str(request["status"]), verdict=verdict, result=result)
    )
    for finding in findings:
        rows.findings.append(
            FindingRow(
                run_id=step.run_id,
                finding_id=finding["finding_id"],
                phase_id=phase["id"],
                candidate_id=phase["candidate_id"],
                severity=str(finding.get("severity", "unspecified")),
                body_json=canonical_json_unchecked(finding),
            )
        )


# -- repairs -------------------------------------------------------------------------------------
def _guard_start_repair(state: State, request: Request) -> str | None:
    problem = text_problem(request, "repair_id")
    if problem:
        return problem
    review = state["last_review"]
    candidate = state["candidate"] or {}
    if review is None or review["candidate_id"] != candidate.get("candidate_id"):
        return "a repair needs a review of the current candidate"
    if review["verdict"] not in (Verdict.ISSUES, Verdict.FAILED):
        return f"the last review's verdict is {review['verdict']}; there is nothing to repair"
    finding_ids = request.get("finding_ids") or []
    unknown = sorted(set(finding_ids) - set(review["findings"]))
    if unknown:
        return f"findings {unknown} are not the last review's"
    budget = state["budgets"].get("max_repair_rounds")
    if isinstance(budget, int) and state["repairs"] >= budget:
        return f"the repair budget ({budget}) is spent"
    return None


def _start_repair(state: State, request: Request, step: Step, rows: Rows) -> None:
    phase = {
        "id": request["repair_id"],
        "kind": "repair",
        "candidate_id": (state["candidate"] or {}).get("candidate_id"),
        "bound": False,
        "opened_seq": step.seq,
        "opened_at": step.at,
        "body": {k: v for k, v in request.items() if k != "repair_id"},
    }
    state["phase"] = phase
    state["repairs"] += 1
    state["changed"] = False
    rows.phases.append(_phase_row(step, phase, "open"))


def _guard_bind(state: State, request: Request) -> str | None:
    phase = state["phase"] or {}
    if request.get("repair_id") != phase.get("id"):
        return f"repair {request.get('repair_id')!r} is not the open repair {phase.get('id')!r}"
    return None


def _bind(state: State, request: Request, step: Step, rows: Rows) -> None:
    phase = state["phase"]
    phase["bound"] = True
    rows.phases.append(_phase_row(step, phase, "open"))


def _guard_complete_repair(state: State, request: Request) -> str | None:
    phase = state["phase"] or {}
    if request.get("repair_id") != phase.get("id"):
        return f"repair {request.get('repair_id')!r} is not the open repair {phase.get('id')!r}"
    status = request.get("status")
    pending = world_open(state, phase.get("id"))
    if status == "completed":
        if pending:
            return f"actions {pending} may have changed the world and are not resolved"
        return _candidate_problem(request.get("candidate"))
    if status == "interrupted":
        if pending or state["changed"] or request.get("candidate") is not None:
            return "an interrupted repair that changed something has an unknown outcome"
        return None
    if status == "outcome_unknown":
        return None if request.get("candidate") is None else "an unknown outcome has no candidate"
    return "status must be completed, interrupted or outcome_unknown"


def _complete_repair(state: State, request: Request, step: Step, rows: Rows) -> None:
    phase = state["phase"]
    status = str(request["status"])
    candidate = request.get("candidate")
    result = {"candidate": candidate, "after_version_ids": (candidate or {}).get("version_ids", [])}
    rows.phases.append(_phase_row(step, phase, status, result=result))
    state["phase"] = None
    if status == "completed":
        state["candidate"] = dict(candidate or {})
        state["status"] = RunState.CANDIDATE.value
    elif status == "interrupted":
        state["status"] = RunState.CANDIDATE.value
    else:
        state["status"] = RunState.UNSETTLED.value


# -- actions -------------------------------------------------------------------------------------
def _guard_propose(state: State, request: Request) -> str | None:
    for name in ("action_id", "kind"):
        problem = text_problem(request, name)
        if problem:
            return problem
    return proposal_problem(state, request)


def _propose(state: State, request: Request, step: Step, rows: Rows) -> None:
    phase = state["phase"]
    state["unresolved"][request["action_id"]] = {
        "class": request["side_effect_class"],
        "phase": phase["id"] if phase else None,
        "effect_key": request.get("effect_key"),
    }
    if phase is not None and not phase["bound"]:
        phase["bound"] = True  # the first recorded action proves the phase keeps a ledger
        rows.phases.append(_phase_row(step, phase, "open"))
    rows.actions.append(proposed_row(step, request, phase["id"] if phase else None))


def _resolve(state: State, request: Request, step: Step, rows: Rows) -> None:
    action = state["unresolved"].pop(request["action_id"])
    phase = state["phase"]
    if (
        request["status"] == ActionState.SUCCEEDED
        and action["class"] in WORLD_CHANGING
        and phase is not None
        and action["phase"] == phase["id"]
    ):
        state["changed"] = True
    rows.actions.append(resolved_row(step, request, action, action["phase"]))


# -- terminal ------------------------------------------------------------------------------------
def _guard_terminate(state: State, request: Request) -> str | None:
    status, reason = request.get("status"), request.get("reason")
    if status not in {str(s) for s in TERMINAL_STATUSES}:
        return f"{status!r} is not a terminal status"
    if not isinstance(reason, str) or not reason:
        return "a terminal needs a reason"
    if state["phase"] is not None:
        return f"the {state['phase']['kind']} phase {state['phase']['id']!r} is still open"
    current = state["status"]
    open_world = world_open(state)
    review = state["last_review"]
    candidate = state["candidate"] or {}
    reviewed = review is not None and review["candidate_id"] == candidate.get("candidate_id")
    if status in (RunState.VERIFIED, RunState.COMPLETED_WITH_ISSUES):
        if current != RunState.CANDIDATE:
            return f"{status} needs a reviewed candidate (the run is {current})"
        if open_world:
            return f"actions {open_world} may have changed the world and are not resolved"
        if not reviewed:
            return "the current candidate has no review"
        wanted = (
            (Verdict.PASS,) if status == RunState.VERIFIED else (Verdict.ISSUES, Verdict.FAILED)
        )
        if review["verdict"] not in wanted:
            return f"the latest review of the current candidate says {review['verdict']}"
    elif status == RunState.REVIEW_UNAVAILABLE:
        if current not in (RunState.RUNNING, RunState.CANDIDATE):
            return f"review_unavailable does not follow {current}"
        if open_world:
            return f"actions {open_world} have unknown outcomes: the run's outcome is unknown"
    elif current == RunState.UNSETTLED and status not in (
        RunState.OUTCOME_UNKNOWN,
        RunState.FAILED,
    ):
        return "after a repair with an unknown outcome only outcome_unknown or failed can follow"
    return None


def _terminate(state: State, request: Request, step: Step, rows: Rows) -> None:
    state["status"] = str(request["status"])
    state["reason"] = str(request["reason"])
    state["finished_at"] = step.at


REVIEW = register(
    Workflow(
        "review",
        (
            Transition("start", frozenset({NEW}), "run_started", "running", _start, _guard_start),
            Transition(
                "record_candidate",
                frozenset({"running", "candidate"}),
                "candidate_recorded",
                "candidate",
                _record_candidate,
                _guard_candidate,
            ),
            Transition(
                "start_review",
                frozenset({"candidate"}),
                "review_started",
                "reviewing",
                _start_review,
                _guard_start_review,
            ),
            Transition(
                "complete_review",
                frozenset({"reviewing"}),
                "review_completed",
                "candidate",
                _complete_review,
                _guard_complete_review,
            ),
            Transition(
                "start_repair",
                frozenset({"candidate"}),
                "repair_started",
                "repairing",
                _start_repair,
                _guard_start_repair,
            ),
            Transition(
                "bind_actions", frozenset({"repairing"}), "actions_bound", None, _bind, _guard_bind
            ),
            Transition(
                "complete_repair",
                frozenset({"repairing"}),
                "repair_completed",
                None,
                _complete_repair,
                _guard_complete_repair,
            ),
            Transition("propose_action", ACTIVE, "action_proposed", None, _propose, _guard_propose),
            Transition("resolve_action", ACTIVE, "action_resolved", None, _resolve, guard_resolve),
            Transition(
                "terminate", ACTIVE, "run_terminated", None, _terminate, _guard_terminate, True
            ),
            Transition("abandon", ACTIVE, "run_abandoned", None, abandon, guard_abandon),
        ),
        terminal_statuses=frozenset(str(s) for s in TERMINAL_STATUSES),
    )
)
