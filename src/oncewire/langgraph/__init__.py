"""oncewire for LangGraph (``pip install 'oncewire[langgraph]'``).

* :class:`OncewireSaver`: a checkpointer on the ledger's own store (SQLite or PostgreSQL),
  ordered, hash-chained and owned by one process at a time (docs/langgraph.md, "The
  checkpointer");
* :func:`durable_invoke`: a run's input recorded before its first node runs, so that a run
  whose process died is listed (:func:`pending_runs`, ``oncewire langgraph pending``) and
  resumed (:func:`resume_run`);
* :class:`DurableToolNode`: ``ToolNode`` whose tool calls are effects, each performed once
  and told to the model truthfully (docs/langgraph.md, "Tools that run once");
* :func:`current_attempt`: inside such a tool, its :class:`~oncewire.Attempt` (key,
  redelivery), to hand on as the receiver's idempotency key;
* :func:`tool_sinks`: the same tools as sinks for ``oncewire dispatch`` workers.

Importing this package needs no optional dependency; a name that needs LangGraph imports it
when first used (a :class:`~oncewire.errors.MissingExtra` without the extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oncewire.core import lazy as _lazy

if TYPE_CHECKING:
    from oncewire.dispatch.attempt import ToolRefused, current_attempt
    from oncewire.langgraph.saver import OncewireSaver
    from oncewire.langgraph.saver_runs import durable_invoke, pending_runs, resume_run
    from oncewire.langgraph.tools import DurableToolNode, ToolCallFailed, tool_sinks

__all__ = [
    "DurableToolNode",
    "OncewireSaver",
    "ToolCallFailed",
    "ToolRefused",
    "current_attempt",
    "durable_invoke",
    "pending_runs",
    "resume_run",
    "tool_sinks",
]

_HOME = {
    "DurableToolNode": "oncewire.langgraph.tools",
    "ToolCallFailed": "oncewire.langgraph.tools",
    "tool_sinks": "oncewire.langgraph.tools",
    "ToolRefused": "oncewire.dispatch.attempt",
    "current_attempt": "oncewire.dispatch.attempt",
    "OncewireSaver": "oncewire.langgraph.saver",
    "durable_invoke": "oncewire.langgraph.saver_runs",
    "pending_runs": "oncewire.langgraph.saver_runs",
    "resume_run": "oncewire.langgraph.saver_runs",
}

if not TYPE_CHECKING:  # a type checker keeps reporting unknown names as errors
    __getattr__, __dir__ = _lazy.names(globals(), _HOME)
