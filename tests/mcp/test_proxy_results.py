"""The results the proxy writes itself (an unknown outcome, a cancelled or refused call, a
result that cannot be replayed) are valid ``tools/call`` results for every protocol revision
the SDK knows, by the SDK's own check of a server's result: a client that negotiated the
2026-07-28 revision requires ``resultType`` (the Agents SDK's MCP client refused them)."""

from __future__ import annotations

import pytest

pytest.importorskip("mcp", reason="needs the mcp extra")

from mcp_types import methods
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS

from oncewire.mcp.proxy_calls import error_result

WRITTEN = [
    "outcome unknown: the tool may or may not have run; do not assume either",
    "the call was cancelled before the server answered",
    "the tool ran, but its result cannot be replayed: the server's answer was not stored",
]


@pytest.mark.parametrize("version", sorted(KNOWN_PROTOCOL_VERSIONS))
@pytest.mark.parametrize("text", WRITTEN, ids=["unknown", "cancelled", "unreplayable"])
def test_a_result_the_proxy_writes_is_valid_for_every_revision(version: str, text: str) -> None:
    methods.validate_server_result("tools/call", version, error_result(text))
