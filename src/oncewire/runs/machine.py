"""The generic machinery: a declarative transition table and the fold that applies it.

A workflow is a table of :class:`Transition` rows ``(source states, command) -> (new state,
event type, guard)``. The same table serves two readers:

* a command: look up the row for the run's status, run the guard against the request, apply
  the reducer, append one event;
* verification: fold the stored events from the genesis through the same rows and guards, so an
  event that no command could have produced (a changed type, a swapped order, a payload bound to
  another candidate) fails verification even when its hash was recomputed.

Reducers mutate a plain JSON state (a dict) and return the projection rows the event implies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oncewire.storage.runs import ActionRow, FindingRow, PhaseRow

__all__ = [
    "NEW",
    "RecoveryPlan",
    "Refusal",
    "Rows",
    "Step",
    "Transition",
    "Workflow",
    "apply_command",
    "workflow",
]

NEW = ""  # the status of a run that does not exist yet

State = dict[str, Any]
Request = Mapping[str, Any]


class Refusal(Exception):
    """A guard said no. Becomes TransitionRefused for a command, a fault for verification."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Step:
    """Where an event lands: what reducers need to build rows."""

    run_id: str
    seq: int
    at: float
    by: str | None


@dataclass
class Rows:
    phases: list[PhaseRow] = field(default_factory=list)
    findings: list[FindingRow] = field(default_factory=list)
    actions: list[ActionRow] = field(default_factory=list)


Guard = Callable[[State, Request], str | None]
Reducer = Callable[[State, Request, Step, Rows], None]


def _always(state: State, request: Request) -> str | None:
    return None


@dataclass(frozen=True)
class Transition:
    """One row of the table.

    ``target`` None keeps the current status unless the reducer sets one (a terminal's status,
    for instance, comes from its request).
    """

    command: str
    sources: frozenset[str]
    event: str
    target: str | None
    apply: Reducer
    guard: Guard = _always
    terminal: bool = False


@dataclass(frozen=True)
class Workflow:
    """A named transition table: the rows a command looks up and that verification folds again."""

    name: str
    transitions: tuple[Transition, ...]
    terminal_statuses: frozenset[str]
    table: dict[tuple[str, str], Transition] = field(init=False, repr=False)
    by_event: dict[str, Transition] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        table: dict[tuple[str, str], Transition] = {}
        by_event: dict[str, Transition] = {}
        for row in self.transitions:
            if row.event in by_event and by_event[row.event] is not row:
                raise ValueError(f"event type {row.event!r} is produced by two commands")
            by_event[row.event] = row
            for source in row.sources:
                if (source, row.command) in table:
                    raise ValueError(f"({source!r}, {row.command!r}) appears twice")
                table[(source, row.command)] = row
        object.__setattr__(self, "table", table)
        object.__setattr__(self, "by_event", by_event)

    def commands(self) -> list[str]:
        return sorted({row.command for row in self.transitions})

    def describe(self) -> list[dict[str, Any]]:
        """The table as data (for docs and ``oncewire runs show --table``)."""
        return [
            {
                "from": sorted(s or "(new)" for s in row.sources),
                "command": row.command,
                "to": row.target or "(from request)" if row.terminal else row.target or "(same)",
                "event": row.event,
                "terminal": row.terminal,
            }
            for row in self.transitions
        ]


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """What reconciliation does with a run its dead owner left, as a workflow decides it:
    run ``steps`` (each through the normal command path, the last one a terminal); or release
    the run without a terminal (``abandon``: why); or leave it untouched (``defer``: why)."""

    steps: tuple[tuple[str, dict[str, Any]], ...] = ()
    abandon: str | None = None
    defer: str | None = None


_WORKFLOWS: dict[str, Workflow] = {}


def register(flow: Workflow) -> Workflow:
    _WORKFLOWS[flow.name] = flow
    return flow


def workflow(name: str) -> Workflow:
    """The registered workflow ``name``. The built-in presets (review, turn) register
    themselves on import, and ``oncewire.runs`` imports them: Python runs the package before any
    of its modules, so they are here whenever this one is (the machinery needs no preset)."""
    try:
        return _WORKFLOWS[name]
    except KeyError:
        raise Refusal(f"unknown workflow {name!r}") from None


def apply_command(
    flow: Workflow, state: State, command: str, request: Request, step: Step
) -> tuple[Transition, Rows]:
    """Apply one command to ``state`` in place; raise :class:`Refusal` if the table says no."""
    status = str(state.get("status", NEW))
    if state.get("abandoned"):
        raise Refusal(f"the run was abandoned ({state['abandoned']['reason']}): nothing follows")
    row = flow.table.get((status, command))
    if row is None:
        allowed = sorted(s or "(new)" for s, c in flow.table if c == command)
        raise Refusal(f"{command} is not allowed from {status or '(new)'} (only from {allowed})")
    reason = row.guard(state, request)
    if reason:
        raise Refusal(reason)
    rows = Rows()
    row.apply(state, request, step, rows)
    if row.target is not None:
        state["status"] = row.target
    return row, rows


def names(items: Iterable[Any]) -> list[str]:
    return sorted(str(item) for item in items)
