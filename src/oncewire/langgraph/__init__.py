"""oncewire for LangGraph (the ``langgraph`` extra): a durable checkpointer, and durable runs.

``OncewireSaver`` stores a graph's checkpoints in the ledger's own store (SQLite or
PostgreSQL), ordered, hash-chained and owned by one process at a time; ``durable_invoke``
records a run's input before its first node runs, so that a run whose process died is listed
(``pending_runs``, ``oncewire langgraph pending``) and resumed (``resume_run``). Importing this
package needs nothing: a name is loaded on first use, and without the extra that use raises
:class:`~oncewire.core.errors.MissingExtra`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from oncewire.core.extras import refusal

if TYPE_CHECKING:
    from oncewire.langgraph.saver import OncewireSaver
    from oncewire.langgraph.saver_runs import durable_invoke, pending_runs, resume_run

__all__ = ["OncewireSaver", "durable_invoke", "pending_runs", "resume_run"]

_HOME = {
    "OncewireSaver": "oncewire.langgraph.saver",
    "durable_invoke": "oncewire.langgraph.saver_runs",
    "pending_runs": "oncewire.langgraph.saver_runs",
    "resume_run": "oncewire.langgraph.saver_runs",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'oncewire.langgraph' has no attribute {name!r}")
    try:
        module = importlib.import_module(home)
    except ImportError as exc:
        if exc.name and exc.name.split(".")[0] in ("langgraph", "langchain_core"):
            raise refusal("langgraph", f"oncewire.langgraph.{name}", exc) from exc
        raise
    value = getattr(module, name)
    globals()[name] = value
    return value
