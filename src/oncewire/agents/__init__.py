"""oncewire for the OpenAI Agents SDK (``pip install 'oncewire[agents]'``).

A run that survives its process: each model response recorded before anything acts on it, each
tool call an effect performed once, and the conversation kept by :class:`OncewireSession` in the
same store; :func:`mcp_meta` puts a tool call's key on an MCP server's requests, so that
``oncewire mcp proxy`` and the server answer a redelivered call once.

Importing this package needs no optional dependency; a name that needs ``openai-agents`` imports
it when first used (a :class:`~oncewire.errors.MissingExtra` without the extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oncewire.core import lazy as _lazy

if TYPE_CHECKING:
    from oncewire.agents.mcp import mcp_meta
    from oncewire.agents.runner import run, run_streamed, run_sync
    from oncewire.agents.scope import RunDiverged
    from oncewire.agents.session import OncewireSession
    from oncewire.dispatch.attempt import ToolRefused, current_attempt

__all__ = [
    "OncewireSession",
    "RunDiverged",
    "ToolRefused",
    "current_attempt",
    "mcp_meta",
    "run",
    "run_streamed",
    "run_sync",
]

_HOME: dict[str, str] = {
    "OncewireSession": "oncewire.agents.session",
    "ToolRefused": "oncewire.dispatch.attempt",
    "current_attempt": "oncewire.dispatch.attempt",
    "mcp_meta": "oncewire.agents.mcp",
    "run": "oncewire.agents.runner",
    "run_streamed": "oncewire.agents.runner",
    "run_sync": "oncewire.agents.runner",
    "RunDiverged": "oncewire.agents.scope",
}

if not TYPE_CHECKING:  # a type checker keeps reporting unknown names as errors
    __getattr__, __dir__ = _lazy.names(globals(), _HOME)
