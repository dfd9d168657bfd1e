"""``oncewire.mcp.once`` against the official SDK's client and server, in one process (the SDK's
in-memory transport), on SQLite and PostgreSQL. What ran is read from the store's tables and a
side file the tool body appends to outside its transaction, never from what the tool reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp.server.mcpserver", reason="needs the mcp extra")

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolRequest, CallToolRequestParams, CallToolResult, ToolAnnotations
from pydantic import BaseModel

import oncewire
import oncewire.mcp
from mcp import Client
from oncewire.core.errors import ConfigurationError, InvalidState
from oncewire.lab.children.mcp_servers import tickets_server
from oncewire.mcp import DEDUPLICATES, IDEMPOTENCY_KEY, REDELIVERY
from oncewire.receipts import Receipts
from tests.mcp_once.conftest import lines, receipts_of, run, table, tickets


def keyed(key: str, *, redelivery: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {IDEMPOTENCY_KEY: key}
    if redelivery:
        meta[REDELIVERY] = True
    return meta


def wire(result: CallToolResult) -> dict[str, Any]:
    """What a client sees of a result, without the SDK's per-response server stamp."""
    return result.model_dump(mode="json", by_alias=True, exclude={"meta"})


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_repeat_with_the_same_key_replays_and_the_body_ran_once(
    store_url: str, receiver: Receipts, tmp_path: Path, use_async: bool
) -> None:
    side = tmp_path / "side.log"
    server = tickets_server(receiver, use_async=use_async, side_log=str(side))

    async def calls() -> list[CallToolResult]:
        async with Client(server) as client:
            args = {"title": "Backlog", "priority": "high"}
            first = await client.call_tool("create_ticket", args, meta=keyed("order-1"))
            again = await client.call_tool("create_ticket", args, meta=keyed("order-1"))
            other = await client.call_tool("create_ticket", args, meta=keyed("order-2"))
            return [first, again, other]

    first, again, other = run(calls)
    assert not first.is_error and wire(again) == wire(first)
    assert first.structured_content is not None
    assert other.structured_content != first.structured_content  # a new key is a new ticket
    stored = tickets(store_url)
    assert [t["operation_id"] for t in stored] == ["order-1", "order-2"]
    assert [line["key"] for line in lines(side)] == ["order-1", "order-2"]  # the body ran twice
    receipt = {r["key"]: r for r in receipts_of(store_url)}["order-1"]
    assert json.loads(receipt["payload_json"]) == {
        "tool": "create_ticket",
        "arguments": {"title": "Backlog", "priority": "high"},
    }
    assert json.loads(receipt["result_json"])["structuredContent"] == first.structured_content


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_changed_arguments_under_a_used_key_are_refused_and_nothing_changes(
    store_url: str, receiver: Receipts, tmp_path: Path, use_async: bool
) -> None:
    side = tmp_path / "side.log"
    server = tickets_server(receiver, use_async=use_async, side_log=str(side))

    async def first_call() -> None:
        async with Client(server) as client:
            await client.call_tool("create_ticket", {"title": "A"}, meta=keyed("k"))

    run(first_call)
    before = (tickets(store_url), receipts_of(store_url), lines(side))

    async def changed() -> tuple[CallToolResult, CallToolResult]:
        async with Client(server) as client:
            other_args = await client.call_tool("create_ticket", {"title": "B"}, meta=keyed("k"))
            other_tool = await client.call_tool("list_tickets", {}, meta=keyed("k"))
            return other_args, other_tool

    refused, read = run(changed)
    assert refused.is_error
    text = refused.content[0].text  # type: ignore[union-attr]
    assert "payload conflict" in text and "'k'" in text and "not run" in text
    assert not read.is_error  # list_tickets does not run once: the key means nothing to it
    assert (tickets(store_url), receipts_of(store_url), lines(side)) == before


def test_a_key_reused_for_another_tool_is_refused_naming_that_tool(
    store_url: str, receiver: Receipts
) -> None:
    receipts = receiver
    server: MCPServer[Any] = MCPServer("two")

    @server.tool()
    @oncewire.mcp.once(receipts)
    def charge(cents: int) -> str:
        return f"charged {cents}"

    @server.tool()
    @oncewire.mcp.once(receipts)
    def refund(cents: int) -> str:
        return f"refunded {cents}"

    async def calls() -> CallToolResult:
        async with Client(server) as client:
            await client.call_tool("charge", {"cents": 5}, meta=keyed("pay-1"))
            return await client.call_tool("refund", {"cents": 5}, meta=keyed("pay-1"))

    refused = run(calls)
    assert refused.is_error and "a call of 'charge'" in refused.content[0].text  # type: ignore[union-attr]
    assert [json.loads(r["payload_json"])["tool"] for r in receipts_of(store_url)] == ["charge"]


def test_the_redelivery_flag_is_visible_inside_the_tool(store_url: str, receiver: Receipts) -> None:
    server = tickets_server(receiver)

    async def calls() -> None:
        async with Client(server) as client:
            await client.call_tool("create_ticket", {"title": "A"}, meta=keyed("r1"))
            await client.call_tool(
                "create_ticket", {"title": "A"}, meta=keyed("r2", redelivery=True)
            )

    run(calls)
    assert [(t["operation_id"], t["redelivery"]) for t in tickets(store_url)] == [
        ("r1", 0),
        ("r2", 1),
    ]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_the_capability_is_advertised_to_a_client(receiver: Receipts, mode: str) -> None:
    declared = tickets_server(receiver)
    plain: MCPServer[Any] = MCPServer("plain")

    async def capabilities() -> tuple[Any, Any]:
        async with Client(declared, mode=mode) as one, Client(plain, mode=mode) as two:
            return one.server_capabilities.experimental, two.server_capabilities.experimental

    ours, theirs = run(capabilities)
    assert ours == {DEDUPLICATES: {"version": 1}}
    assert not (theirs or {}).get(DEDUPLICATES)


def test_declaring_refuses_a_tool_that_does_not_run_once_and_withholds_for_a_later_one(
    tmp_path: Path,
) -> None:
    receipts = oncewire.Receipts(str(tmp_path / "r.db"))  # SQLite only: closed with the file
    server: MCPServer[Any] = MCPServer("mixed")

    @server.tool()
    def send_email(to: str) -> str:
        return to

    with pytest.raises(ConfigurationError, match="send_email"):
        oncewire.mcp.declare_deduplicates(server)
    server.remove_tool("send_email")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def look(to: str) -> str:
        return to

    @server.tool()
    @oncewire.mcp.once(receipts)
    def send(to: str) -> str:
        return to

    oncewire.mcp.declare_deduplicates(server)
    oncewire.mcp.declare_deduplicates(server)  # twice changes nothing

    @server.tool()
    def later(to: str) -> str:
        return to

    async def capabilities() -> Any:
        async with Client(server) as client:
            return client.server_capabilities.experimental

    assert not (run(capabilities) or {}).get(DEDUPLICATES)
    server.remove_tool("later")
    assert run(capabilities) == {DEDUPLICATES: {"version": 1}}


class Ticket(BaseModel):
    id: int
    title: str


def test_the_decorated_tool_keeps_its_schema_and_its_own_context(tmp_path: Path) -> None:
    receipts = oncewire.Receipts(str(tmp_path / "r.db"))  # SQLite only: closed with the file
    plain: MCPServer[Any] = MCPServer("plain")
    once: MCPServer[Any] = MCPServer("once")
    seen: list[str] = []

    def make(title: str, ctx: Context, labels: list[str] | None = None, n: int = 1) -> Ticket:
        """Make a ticket."""
        seen.append(ctx.request_id)
        return Ticket(id=n, title=title)

    async def amake(title: str, n: int = 1) -> Ticket:
        """Make a ticket, awaited."""
        return Ticket(id=n, title=title)

    plain.tool()(make)
    plain.tool()(amake)
    once.tool()(oncewire.mcp.once(receipts)(make))
    once.tool()(oncewire.mcp.once(receipts)(amake))

    async def listed(server: MCPServer[Any]) -> list[dict[str, Any]]:
        async with Client(server) as client:
            result = await client.list_tools()
            await client.call_tool("make", {"title": "x"}, meta=keyed("m"))
            return [tool.model_dump(mode="json") for tool in result.tools]

    assert run(lambda: listed(once)) == run(lambda: listed(plain))
    assert len(seen) == 2  # the tool's own Context parameter is still filled, in both


def test_a_call_without_a_key_runs_as_the_sdk_runs_it_unless_a_key_is_required(
    store_url: str, receiver: Receipts, tmp_path: Path
) -> None:
    receipts = receiver
    side = tmp_path / "side.log"
    server: MCPServer[Any] = MCPServer("keyless")

    def note(what: str) -> None:
        call = oncewire.mcp.current_call()
        with side.open("a") as f:
            f.write(json.dumps({"key": call.key, "tx": call.tx is not None, "what": what}) + "\n")

    @server.tool()
    @oncewire.mcp.once(receipts)
    def optional(what: str) -> str:
        note(what)
        return what

    @server.tool()
    @oncewire.mcp.once(receipts, required=True)
    def required(what: str) -> str:
        note(what)
        return what

    async def calls() -> list[CallToolResult]:
        async with Client(server) as client:
            return [
                await client.call_tool("optional", {"what": "a"}),
                await client.call_tool("optional", {"what": "a"}),
                await client.call_tool("required", {"what": "b"}),
            ]

    one, two, refused = run(calls)
    assert not one.is_error and not two.is_error
    assert refused.is_error and IDEMPOTENCY_KEY in refused.content[0].text  # type: ignore[union-attr]
    assert lines(side) == [{"key": None, "tx": False, "what": "a"}] * 2  # ran twice, no receipt
    assert receipts_of(store_url) == []


class SepParams(CallToolRequestParams):
    """``tools/call`` params as SEP-3182 proposed them: ``idempotencyKey`` beside the name."""

    idempotency_key: str | None = None


class SepRequest(CallToolRequest):
    params: SepParams


def test_the_key_from_sep_3182_idempotency_key_and_from_the_arguments(
    store_url: str, receiver: Receipts
) -> None:
    receipts = receiver
    server: MCPServer[Any] = MCPServer("keys")

    @server.tool()
    @oncewire.mcp.once(receipts)
    def by_request(n: int) -> str:
        return str(oncewire.mcp.current_call().key)

    @server.tool()
    @oncewire.mcp.once(receipts, key=lambda arguments: f"order/{arguments['order']}")
    def by_arguments(order: int) -> str:
        return str(oncewire.mcp.current_call().key)

    async def calls() -> list[Any]:
        async with Client(server) as client:
            params = SepParams(name="by_request", arguments={"n": 1}, idempotency_key="sep-1")
            sep = await client.session.send_request(SepRequest(params=params), CallToolResult)
            derived = await client.call_tool("by_arguments", {"order": 7}, meta=keyed("ignored"))
            return [sep, derived]

    sep, derived = run(calls)
    assert sep.structured_content == {"result": "sep-1"}
    assert derived.structured_content == {"result": "order/7"}
    assert [r["key"] for r in receipts_of(store_url)] == ["order/7", "sep-1"]


def test_a_body_that_raises_stores_nothing_and_a_retry_runs_again(
    store_url: str, receiver: Receipts
) -> None:
    receipts = receiver
    server: MCPServer[Any] = MCPServer("flaky")
    runs: list[int] = []

    @server.tool()
    @oncewire.mcp.once(receipts)
    def flaky(n: int) -> str:
        tx = oncewire.mcp.current_call().tx
        tx.execute("CREATE TABLE IF NOT EXISTS marks (n INTEGER)")
        tx.execute("INSERT INTO marks (n) VALUES (:n)", {"n": n})
        runs.append(n)
        if len(runs) == 1:
            raise RuntimeError("the downstream API timed out")
        return "ok"

    async def calls() -> list[CallToolResult]:
        async with Client(server) as client:
            return [await client.call_tool("flaky", {"n": 1}, meta=keyed("f")) for _ in range(3)]

    failed, ok, replayed = run(calls)
    assert failed.is_error and not ok.is_error and wire(replayed) == wire(ok)
    assert table(store_url, "SELECT n FROM marks") == [{"n": 1}]  # the failed run rolled back
    assert [r["key"] for r in receipts_of(store_url)] == ["f"]


@pytest.mark.parametrize("bad", [42, "", " padded", "a\u200bb"])
def test_a_key_that_is_not_a_valid_key_is_refused_before_the_body(tmp_path: Path, bad: Any) -> None:
    receipts = oncewire.Receipts(str(tmp_path / "r.db"))  # SQLite only: closed with the file
    server: MCPServer[Any] = MCPServer("bad")
    runs: list[int] = []

    @server.tool()
    @oncewire.mcp.once(receipts)
    def tool(n: int) -> int:
        runs.append(n)
        return n

    async def call() -> CallToolResult:
        async with Client(server) as client:
            return await client.call_tool("tool", {"n": 1}, meta={IDEMPOTENCY_KEY: bad})

    refused = run(call)
    assert refused.is_error and "idempotency key" in refused.content[0].text  # type: ignore[union-attr]
    assert runs == [] and receipts.list() == []


def test_current_call_outside_a_tool_and_misuse_of_the_decorator(tmp_path: Path) -> None:
    with pytest.raises(InvalidState, match="outside the body"):
        oncewire.mcp.current_call()
    with pytest.raises(ConfigurationError, match="Receipts"):
        oncewire.mcp.once("r.db")  # type: ignore[arg-type]
    receipts = oncewire.Receipts(str(tmp_path / "r.db"))  # SQLite only: closed with the file

    def clash(oncewire_context: int) -> int:
        return oncewire_context

    with pytest.raises(ConfigurationError, match="oncewire_context"):
        oncewire.mcp.once(receipts)(clash)
