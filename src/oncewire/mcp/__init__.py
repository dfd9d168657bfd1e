"""oncewire for the Model Context Protocol (``pip install 'oncewire[mcp]'``).

* ``oncewire mcp proxy``: between an MCP client and a server, every ``tools/call`` an effect,
  recorded before it is forwarded, answered once, never reported done when nobody knows;
* :func:`once`: a tool of an ``mcp`` SDK server that runs each call once per key
  (:class:`~oncewire.Receipts`), :func:`current_call` inside it (key, redelivery flag, the
  receipt's transaction), and :func:`declare_deduplicates`, which says so to the proxy.

Importing this package needs no optional dependency; a name that needs ``mcp`` imports it when
first used (a :class:`~oncewire.errors.MissingExtra` without the extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oncewire.core import lazy as _lazy
from oncewire.mcp.protocol import DEDUPLICATES, IDEMPOTENCY_KEY, REDELIVERY

if TYPE_CHECKING:
    from oncewire.mcp.call import ToolCall, current_call
    from oncewire.mcp.once_tools import declare_deduplicates, once, runs_once
    from oncewire.mcp.proxy import Proxy
    from oncewire.mcp.proxy_run import run_stdio, serve_stdio

__all__ = [
    "DEDUPLICATES",
    "IDEMPOTENCY_KEY",
    "REDELIVERY",
    "Proxy",
    "ToolCall",
    "current_call",
    "declare_deduplicates",
    "once",
    "run_stdio",
    "runs_once",
    "serve_stdio",
]

_HOME: dict[str, str] = {
    "Proxy": "oncewire.mcp.proxy",
    "ToolCall": "oncewire.mcp.call",
    "current_call": "oncewire.mcp.call",
    "declare_deduplicates": "oncewire.mcp.once_tools",
    "once": "oncewire.mcp.once_tools",
    "run_stdio": "oncewire.mcp.proxy_run",
    "runs_once": "oncewire.mcp.once_tools",
    "serve_stdio": "oncewire.mcp.proxy_run",
}

if not TYPE_CHECKING:  # a type checker keeps reporting unknown names as errors
    __getattr__, __dir__ = _lazy.names(globals(), _HOME)
