"""The lab's suites, in the order ``oncewire lab`` runs them: the one list.

The seed's outbox scenarios come first, then the crash point matrix, the torture runs, the
workers under fire, the threads sharing commits, the reply engine, the run ledger, the
gateway, the LangGraph tool node, the MCP proxy and the OpenAI Agents SDK run. A new suite is
a module here that defines ``SUITE`` and a line in this tuple; the framework imports none of
them.
"""

from __future__ import annotations

from oncewire.lab.framework import Suite
from oncewire.lab.suites import (
    agents,
    crashpoints,
    gateway,
    group,
    langgraph,
    mcp,
    outbox,
    replies,
    runs,
    torture,
    workers,
)

__all__ = ["SUITES", "by_name"]

SUITES: tuple[Suite, ...] = (
    outbox.SUITE,
    crashpoints.SUITE,
    torture.SUITE,
    workers.SUITE,
    group.SUITE,
    replies.SUITE,
    runs.SUITE,
    gateway.SUITE,
    langgraph.SUITE,
    mcp.SUITE,
    agents.SUITE,
)


def by_name() -> dict[str, Suite]:
    """``SUITES`` keyed by name, in order."""
    return {suite.name: suite for suite in SUITES}
