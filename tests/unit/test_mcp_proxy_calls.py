"""The MCP proxy's pure parts: reading a tools/call, classifying a line, what a server's error
says happened, and the headers toward an HTTP server (the wire itself: tests/mcp)."""

from __future__ import annotations

import pytest

from oncewire.effects.outcomes import MaybeSent, Rejected
from oncewire.mcp import proxy_calls as calls
from oncewire.mcp.protocol import IDEMPOTENCY_KEY

pytest.importorskip("anyio", reason="needs the mcp extra")

from oncewire.mcp.proxy_wire import parse_line


def test_a_call_is_read_with_its_key_from_meta_then_from_the_sep_field() -> None:
    call = calls.read_call(
        {"name": "charge", "arguments": {"a": 1}, "_meta": {IDEMPOTENCY_KEY: "k"}}
    )
    assert (call.tool, call.arguments, call.key) == ("charge", {"a": 1}, "k")
    assert call.payload == {"tool": "charge", "arguments": {"a": 1}}
    assert calls.read_call({"name": "t", "idempotencyKey": "sep"}).key == "sep"
    assert calls.read_call({"name": "t"}).key is None
    assert calls.read_call({"name": "t"}).arguments == {}


@pytest.mark.parametrize(
    "params",
    [
        None,
        [],
        {},
        {"name": ""},
        {"name": 5},
        {"name": "t", "arguments": "x"},
        {"name": "t", "_meta": 1},
        {"name": "t", "_meta": {IDEMPOTENCY_KEY: ""}},
        {"name": "t", "idempotencyKey": 7},
    ],
)
def test_a_call_the_proxy_cannot_use_is_a_bad_call(params: object) -> None:
    with pytest.raises(calls.BadCall) as refused:
        calls.read_call(params)
    assert refused.value.error()["code"] == -32602


def test_a_servers_error_is_a_refusal_unless_it_says_it_failed_while_handling() -> None:
    assert isinstance(calls.error_outcome({"code": -32602, "message": "no tool"}), Rejected)
    assert isinstance(calls.error_outcome({"code": -32050, "message": "busy"}), Rejected)
    assert isinstance(calls.error_outcome({"code": -32603, "message": "boom"}), MaybeSent)
    assert isinstance(calls.error_outcome({"code": -32700, "message": "garbled"}), MaybeSent)
    # The SDK's streamable HTTP transport resolves a request whose response stream ended
    # without an answer with connection closed: the request had left, so it may have run.
    closed = {"code": -32000, "message": "SSE stream ended without a response"}
    assert isinstance(calls.error_outcome(closed), MaybeSent)


def test_what_the_proxy_learns_of_its_server() -> None:
    facts = calls.ServerFacts()
    facts.learn(
        "initialize",
        {
            "protocolVersion": "2025-11-25",
            "serverInfo": {"name": "pay"},
            "capabilities": {"experimental": {"io.oncewire/deduplicates": {"version": 1}}},
        },
    )
    assert (facts.name, facts.protocol_version, facts.deduplicates) == ("pay", "2025-11-25", True)
    facts.learn(
        "tools/list",
        {"tools": [{"name": "a", "annotations": {"readOnlyHint": True}}, {"name": "b"}, 5]},
    )
    assert facts.read_only == {"a": True, "b": False}


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"ping"}', "request"),
        ('{"jsonrpc":"2.0","method":"notifications/initialized"}', "notification"),
        ('{"jsonrpc":"2.0","id":"s","result":{}}', "response"),
        ({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, "request"),
        ("{", "invalid"),
        ('{"jsonrpc":"2.0","id":false,"method":"ping"}', "invalid"),
    ],
)
def test_lines_are_classified(line: bytes | str | dict[str, object], kind: str) -> None:
    incoming = parse_line(line)
    assert incoming is not None and incoming.kind == kind
    assert parse_line("   \n") is None


def test_a_done_effect_without_a_call_result_is_not_replayed_as_one() -> None:
    from oncewire.storage.records import EffectState

    class Stored:
        state = EffectState.DONE
        result_json = '"plain"'
        last_error = None

    answer = calls.answer(Stored())  # type: ignore[arg-type]
    assert answer["isError"] is True and "cannot be replayed" in answer["content"][0]["text"]
