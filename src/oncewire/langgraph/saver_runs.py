"""Durable runs: a run's input is recorded before its first node runs, so none is lost.

``durable_invoke(graph, input, config)`` claims the thread, records the run (its input, its
config, the checkpoint it starts from, ``graph_ref`` when given: ``module:attr``) in
``oncewire_lg_runs`` in a transaction of its own, and only then invokes the graph; the run is
marked ``done`` or ``failed`` when ``invoke`` returns or raises. A process that dies in between
leaves the run ``running`` under an owner that is gone: :func:`pending_runs` (``oncewire
langgraph pending``) lists it, and :func:`resume_run` (``oncewire langgraph resume --graph
module:attr``) takes the thread over and goes on from its latest checkpoint, or from the
recorded input when the run died before its first checkpoint was stored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oncewire.core.errors import ConfigurationError, RunNotFound
from oncewire.core.ids import owner_is_dead_locally
from oncewire.langgraph.saver import OncewireSaver
from oncewire.storage.langgraph import LangGraphRun, lease_name

__all__ = ["PendingRun", "durable_invoke", "pending_runs", "resume_run"]


@dataclass(frozen=True, slots=True)
class PendingRun:
    """A run accepted on a thread whose owner died (or stopped renewing its lease) mid-run."""

    thread_id: str
    owner: str
    graph: str | None
    attempts: int
    started_at: float
    why: str  # "owner died" (a gone process on this host) or "lease ran out"

    def as_dict(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "owner": self.owner,
            "graph": self.graph,
            "attempts": self.attempts,
            "started_at": self.started_at,
            "why": self.why,
        }


def _saver_of(graph: Any) -> OncewireSaver:
    saver = getattr(graph, "checkpointer", None)
    if not isinstance(saver, OncewireSaver):
        raise ConfigurationError(
            "durable runs need a graph compiled with an OncewireSaver "
            "(graph.compile(checkpointer=OncewireSaver(ledger)))"
        )
    return saver


def _plain(configurable: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a config that can be recorded and given back (strings, numbers, flags)."""
    return {
        k: v
        for k, v in configurable.items()
        if isinstance(v, str | int | float | bool) and not k.startswith("__")
    }


def _finish(saver: OncewireSaver, thread_id: str, state: str, error: str | None) -> None:
    saver.store.lg_end_run(
        thread_id, owner=saver.owner, state=state, error=error, now=saver.ledger.clock.now()
    )
    saver.release(thread_id)


def _run(saver: OncewireSaver, graph: Any, thread_id: str, value: Any, config: Any) -> Any:
    try:
        result = graph.invoke(value, config)
    except BaseException as exc:
        _finish(saver, thread_id, "failed", f"{type(exc).__name__}: {exc}"[:2000])
        raise
    _finish(saver, thread_id, "done", None)
    return result


def durable_invoke(
    graph: Any, input: Any, config: Mapping[str, Any], *, graph_ref: str | None = None
) -> Any:
    """``graph.invoke(input, config)``, with the run recorded durably before its first node
    runs (see the module docstring). ``graph_ref`` (``module:attr``) is how a later
    ``oncewire langgraph resume`` finds the graph. :class:`ThreadBusy` while another live
    process owns the thread; nothing is recorded then."""
    saver = _saver_of(graph)
    configurable = dict(config.get("configurable") or {})
    if "thread_id" not in configurable:
        raise ConfigurationError("durable_invoke needs config['configurable']['thread_id']")
    thread_id = str(configurable["thread_id"])
    saver.claim(thread_id)
    base = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    input_type, blob = saver.serde.dumps_typed(input)
    recorded = {
        "configurable": _plain(configurable),
        "base": None if base is None else base.checkpoint["id"],
    }
    saver.store.lg_start_run(
        thread_id,
        graph=graph_ref,
        input_type=input_type,
        input_blob=blob,
        config_json=json.dumps(recorded, sort_keys=True),
        owner=saver.owner,
        now=saver.ledger.clock.now(),
    )
    return _run(saver, graph, thread_id, input, config)


def _why(saver: OncewireSaver, run: LangGraphRun, now: float) -> str | None:
    if owner_is_dead_locally(run.owner):
        return "owner died"
    lease = saver.store.get_lease(lease_name(run.thread_id))
    if lease is None or lease.owner != run.owner or not lease.live(now):
        return "lease ran out"
    return None


def pending_runs(saver: OncewireSaver) -> list[PendingRun]:
    """The runs still ``running`` whose owner is a dead process on this host, or whose lease
    ran out (or moved to another owner): accepted, never finished."""
    now = saver.ledger.clock.now()
    found = []
    for run in saver.store.lg_running_runs():
        why = _why(saver, run, now)
        if why is not None:
            found.append(
                PendingRun(run.thread_id, run.owner, run.graph, run.attempts, run.started_at, why)
            )
    return found


def resume_run(graph: Any, thread_id: str) -> Any:
    """Take over ``thread_id``'s unfinished run and finish it with ``graph`` (compiled with an
    OncewireSaver on the same store): from its latest checkpoint, or from the recorded input
    when no checkpoint of the run was stored. :class:`RunNotFound` when the thread has no
    running run; :class:`ThreadBusy` while its owner is alive and holds the lease."""
    saver = _saver_of(graph)
    run = saver.store.lg_get_run(thread_id)
    if run is None or run.state != "running":
        raise RunNotFound(f"thread {thread_id!r} has no unfinished run", thread_id=thread_id)
    saver.claim(thread_id)
    saver.store.lg_resume_run(thread_id, owner=saver.owner, now=saver.ledger.clock.now())
    recorded = json.loads(run.config_json)
    config = {"configurable": {**recorded.get("configurable", {}), "thread_id": thread_id}}
    latest = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    started = latest is not None and latest.checkpoint["id"] != recorded.get("base")
    value = None if started else saver.serde.loads_typed((run.input_type, run.input))
    return _run(saver, graph, thread_id, value, config)
