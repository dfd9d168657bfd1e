"""MCP tools in a durable run: the tool call's key and redelivery flag on the wire.

The Agents SDK turns each tool of an MCP server given to ``Agent(mcp_servers=[...])`` into a
function tool (``agents.mcp.MCPUtil.to_function_tool``) that the run loop invokes like any
other, so in a durable run an MCP tool call is already an effect
(:mod:`oncewire.agents.tools`): recorded with the model step that asked for it, performed once
by the run's inline dispatcher, retried as a flagged redelivery when it may have run. What the
SDK sends the server carries no key, though, so a redelivery is a new request to it:
``oncewire mcp proxy`` keys such a call by its own session and the request id, which a new
proxy (or a new request) never repeats, and the call ran again at the server.

:func:`mcp_meta` closes that gap through the SDK's own hook for it: ``tool_meta_resolver``,
which every ``agents.mcp`` server class takes (``MCPServerStdio(params,
tool_meta_resolver=mcp_meta)``, ``MCPServerStreamableHttp``, ``MCPServerSse``). The SDK calls
it before each ``tools/call``, inside the tool's invocation and so inside its attempt
(:func:`oncewire.agents.current_attempt`), and sends what it returns as ``params._meta``:

* ``io.oncewire/idempotency-key``: :func:`mcp_key` of the attempt's key, the same on every
  attempt of the call in every process. The proxy records the call under it, answers a repeat
  of a call that is done from its record, and redelivers one whose outcome it does not know
  with this key, which ``oncewire.mcp.once`` on the server answers from its receipt.
* ``io.oncewire/redelivery``: the attempt's flag, for a server reached without a proxy (a
  proxy sends its own attempt's flag, which is what its server should read).

The key is the run's effect key under the prefix ``mcp/``, not the effect key itself, because
the proxy records the call as an effect of its own: given the run's own store (one database
for both, as is usual), it would find the key bound to the run's ``agents.tool`` effect and
refuse the call as a conflict, every attempt. Outside a durable run the resolver returns
``None``: the SDK sends no ``_meta`` and the proxy keys the call as it keys any call without
one, so a server configured with it serves plain runs unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oncewire.core.errors import InvalidState
from oncewire.dispatch.attempt import current_attempt
from oncewire.mcp.protocol import IDEMPOTENCY_KEY, REDELIVERY

if TYPE_CHECKING:
    from agents.mcp.util import MCPToolMetaContext

__all__ = ["KEY_PREFIX", "mcp_key", "mcp_meta"]

# What a durable run's MCP tool call is keyed by at the proxy and the server: this, then the
# run's effect key (agents/{run_key}/{tool_call_id}).
KEY_PREFIX = "mcp/"


def mcp_key(effect_key: str) -> str:
    """The idempotency key sent for the MCP tool call whose effect in the run is
    ``effect_key`` (see the module docstring for why it is not ``effect_key`` itself)."""
    return KEY_PREFIX + effect_key


def mcp_meta(context: MCPToolMetaContext | None = None) -> dict[str, Any] | None:
    """The ``_meta`` of an MCP tool call: its key and redelivery flag inside a durable run,
    ``None`` (nothing sent) outside one. Give it to an ``agents.mcp`` server as
    ``tool_meta_resolver``; a resolver of your own can merge it into what it returns. The SDK's
    context (server, tool, arguments) is not needed: the attempt says everything."""
    try:
        attempt = current_attempt()
    except InvalidState:  # not inside a durable tool: the call goes without a key
        return None
    return {IDEMPOTENCY_KEY: mcp_key(attempt.key), REDELIVERY: attempt.redelivery}
