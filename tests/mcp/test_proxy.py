"""``oncewire mcp proxy`` against the official SDK on both sides: a ``ClientSession`` over
``stdio_client`` launches the proxy as a real child process, which launches a real SDK server
(``upstream_server.py``) as its own; the store is read directly, and the server's log says
which calls it really got. The tests that need only a plain proxy share one pair of children
per backend (``shared``), each with keys of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, MCPError
from mcp_types import ElicitResult

from tests.mcp.conftest import SQLITE_BY_DEFAULT, Raw, Shared, calls_logged, direct, proxied

KEY = "io.oncewire/idempotency-key"


def text(result: object) -> str:
    return " ".join(getattr(c, "text", "") for c in getattr(result, "content", []))


@pytest.mark.parametrize(
    "shared_proxy", ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)], indirect=True
)
def test_lists_resources_and_prompts_pass_through_unchanged(shared: Shared) -> None:
    async def scenario(session: ClientSession) -> None:
        async with direct(shared.log) as plain:
            # The handshake's result as the server gave it: protocol version, capabilities,
            # serverInfo and instructions, nothing added or taken away by the proxy.
            assert plain.initialize_result is not None and session.initialize_result is not None
            assert session.initialize_result.model_dump() == plain.initialize_result.model_dump()
            expected = (
                (await plain.list_tools()).model_dump(),
                (await plain.list_resources()).model_dump(),
                (await plain.read_resource("res://greeting")).model_dump(),
                (await plain.list_prompts()).model_dump(),
                (await plain.get_prompt("greet", {"name": "Ada"})).model_dump(),
            )
        got = (
            (await session.list_tools()).model_dump(),
            (await session.list_resources()).model_dump(),
            (await session.read_resource("res://greeting")).model_dump(),
            (await session.list_prompts()).model_dump(),
            (await session.get_prompt("greet", {"name": "Ada"})).model_dump(),
        )
        assert session.initialize_result is not None
        assert session.initialize_result.server_info.name == "pay"
        assert got == expected

    shared.run(scenario)
    assert shared.effects() == []


@SQLITE_BY_DEFAULT
def test_a_servers_experimental_capabilities_reach_the_client_unchanged(
    db_url: str, upstream_log: Path
) -> None:
    """The deduplicates capability the proxy reads is the client's to read too: the proxy
    relays the handshake, it does not answer it."""

    async def scenario() -> None:
        async with proxied(db_url, upstream_log, UPSTREAM_DEDUP="1") as session:
            assert session.initialize_result is not None
            experimental = session.initialize_result.capabilities.experimental
            assert experimental == {"io.oncewire/deduplicates": {"version": 1}}

    anyio.run(scenario)


def test_a_call_is_one_effect_and_a_repeat_is_answered_from_the_store(shared: Shared) -> None:
    order = shared.key("order-1")

    async def scenario(session: ClientSession) -> None:
        first = await session.call_tool("charge", {"amount": 5}, meta={KEY: order})
        again = await session.call_tool("charge", {"amount": 5}, meta={KEY: order})
        assert text(first) == text(again) == "charged 5"
        assert not first.is_error and not again.is_error
        async with proxied(shared.url, shared.log) as other:  # another proxy, the same store
            later = await other.call_tool("charge", {"amount": 5}, meta={KEY: order})
            assert later.model_dump() == first.model_dump()

    shared.run(scenario)
    [effect] = shared.effects()
    assert effect["key"] == order
    assert effect["kind"] == "mcp.pay.charge"
    assert effect["payload"] == {"tool": "charge", "arguments": {"amount": 5}}
    assert effect["state"] == "done"
    assert effect["result"]["content"][0]["text"] == "charged 5"
    [call] = shared.calls()
    assert (call["key"], call["redelivery"]) == (order, False)


def test_a_call_without_a_key_is_keyed_by_the_session_and_the_request_id(
    db_url: str, raw: Raw, upstream_log: Path
) -> None:
    async def scenario() -> None:
        async with proxied(db_url, upstream_log, "--name", "payments") as session:
            await session.call_tool("charge", {"amount": 1})
            await session.call_tool("charge", {"amount": 1})

    anyio.run(scenario)
    effects = raw.effects()
    assert [e["kind"] for e in effects] == ["mcp.payments.charge"] * 2
    sessions = {e["key"].rsplit(":", 1)[0] for e in effects}
    assert len(sessions) == 1 and len({e["key"] for e in effects}) == 2
    assert [c["key"] for c in calls_logged(upstream_log)] == [e["key"] for e in effects]


def test_the_same_key_with_other_arguments_is_refused_and_nothing_is_forwarded(
    shared: Shared,
) -> None:
    order = shared.key("order-1")

    async def scenario(session: ClientSession) -> None:
        await session.call_tool("charge", {"amount": 5}, meta={KEY: order})
        with pytest.raises(MCPError) as refused:
            await session.call_tool("charge", {"amount": 6}, meta={KEY: order})
        assert refused.value.error.code == -32602
        assert "conflict" in refused.value.error.message
        assert order in refused.value.error.message
        with pytest.raises(MCPError, match="conflict"):
            await session.call_tool("refuse", {}, meta={KEY: order})
        assert text(await session.call_tool("lookup", {"q": "still serving"})) == (
            "found still serving"
        )

    shared.run(scenario)
    [effect] = shared.effects()
    assert effect["payload"] == {"tool": "charge", "arguments": {"amount": 5}}
    assert [c["tool"] for c in shared.calls()] == ["charge", "lookup"]


def test_a_read_only_tool_is_forwarded_without_an_effect(shared: Shared) -> None:
    async def scenario(session: ClientSession) -> None:
        for _ in range(2):
            result = await session.call_tool("lookup", {"q": "x"}, meta={KEY: shared.key("look-1")})
            assert text(result) == "found x"

    shared.run(scenario)
    assert shared.effects() == []
    assert [c["tool"] for c in shared.calls()] == ["lookup", "lookup"]


def test_a_tool_error_result_is_stored_and_replayed_as_it_came(shared: Shared) -> None:
    async def scenario(session: ClientSession) -> None:
        first = await session.call_tool("refuse", {}, meta={KEY: shared.key("r-1")})
        again = await session.call_tool("refuse", {}, meta={KEY: shared.key("r-1")})
        assert first.is_error and "refused on purpose" in text(first)
        assert again.model_dump() == first.model_dump()

    shared.run(scenario)
    [effect] = shared.effects()
    assert effect["state"] == "done" and effect["result"]["isError"] is True
    assert len(shared.calls()) == 1


def test_a_server_that_exits_with_the_call_in_flight_is_an_unknown_outcome(
    db_url: str, raw: Raw, upstream_log: Path
) -> None:
    async def scenario() -> None:
        async with proxied(db_url, upstream_log) as session:
            result = await session.call_tool("exit_now", {}, meta={KEY: "x-1"})
            assert result.is_error
            assert text(result).startswith("outcome unknown: the tool may or may not have run")
        async with proxied(db_url, upstream_log) as session:  # a retry: told the same
            retry = await session.call_tool("exit_now", {}, meta={KEY: "x-1"})
            assert retry.is_error and "outcome unknown" in text(retry)

    anyio.run(scenario)
    [effect] = raw.effects()
    assert effect["state"] == "dead" and effect["maybe_sent"]
    assert "exited" in effect["last_error"]
    assert len(calls_logged(upstream_log)) == 1


def test_a_call_that_times_out_is_recorded_as_a_timeout(
    db_url: str, raw: Raw, upstream_log: Path
) -> None:
    async def scenario() -> None:
        async with proxied(db_url, upstream_log, "--timeout", "0.5") as session:
            result = await session.call_tool("slow", {"seconds": 3}, meta={KEY: "s-1"})
            assert result.is_error and "outcome unknown" in text(result)
            assert text(await session.call_tool("lookup", {"q": "after"})) == "found after"

    anyio.run(scenario)
    [effect] = raw.effects()
    assert effect["state"] == "dead" and effect["maybe_sent"]
    assert "timed out" in effect["last_error"]


def test_a_call_the_client_cancels_is_recorded_cancelled(
    db_url: str, raw: Raw, upstream_log: Path
) -> None:
    async def scenario() -> None:
        async with proxied(db_url, upstream_log) as session:
            with anyio.move_on_after(1.0):
                await session.call_tool("slow", {"seconds": 3}, meta={KEY: "c-1"})
            for _ in range(100):
                if raw.effects()[0]["state"] == "cancelled":
                    break
                await anyio.sleep(0.05)
            retry = await session.call_tool("slow", {"seconds": 3}, meta={KEY: "c-1"})
            assert retry.is_error and "outcome unknown" in text(retry)

    anyio.run(scenario)
    [effect] = raw.effects()
    assert effect["state"] == "cancelled" and effect["maybe_sent"]
    assert "cancelled" in effect["last_error"]
    assert len(calls_logged(upstream_log)) == 1


@pytest.mark.parametrize(
    "shared_proxy", ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)], indirect=True
)
def test_progress_and_log_messages_pass_through_a_recorded_call(shared: Shared) -> None:
    progress: list[tuple[float, float | None, str | None]] = []
    logged: list[object] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    async def on_log(params: object) -> None:
        logged.append(getattr(params, "data", None))

    async def scenario(session: ClientSession) -> None:
        result = await session.call_tool(
            "steps", {"count": 3}, progress_callback=on_progress, meta={KEY: shared.key("p-1")}
        )
        assert text(result) == "3 steps"

    shared.proxy.on_log = on_log
    shared.run(scenario)
    assert progress == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]
    assert logged == ["step 1 of 3", "step 2 of 3", "step 3 of 3"]
    assert [e["key"] for e in shared.effects()] == [shared.key("p-1")]


def test_concurrent_calls_through_one_proxy_are_one_effect_each(shared: Shared) -> None:
    answers: dict[str, str] = {}

    async def scenario(session: ClientSession) -> None:
        async def one(n: int) -> None:
            key = shared.key(f"c-{n}")
            result = await session.call_tool("charge", {"amount": n}, meta={KEY: key})
            answers[key] = text(result)

        async with anyio.create_task_group() as tg:
            for n in range(12):
                tg.start_soon(one, n)
                tg.start_soon(one, n)  # the same call twice at once: still one effect

    shared.run(scenario)
    assert answers == {shared.key(f"c-{n}"): f"charged {n}" for n in range(12)}
    effects = shared.effects()
    assert sorted(e["key"] for e in effects) == sorted(answers)
    assert {e["state"] for e in effects} == {"done"}
    assert sorted(c["key"] for c in shared.calls()) == sorted(answers)


def test_effects_list_shows_the_calls(shared: Shared) -> None:
    import json
    import subprocess
    import sys

    async def scenario(session: ClientSession) -> None:
        await session.call_tool("charge", {"amount": 3}, meta={KEY: shared.key("listed-1")})

    shared.run(scenario)
    shown = subprocess.run(
        [sys.executable, "-m", "oncewire", "effects", "list", "--db", shared.url, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    # the shared store holds other tests' effects too: this test's are those with its keys
    [listed] = [e for e in json.loads(shown.stdout) if e["key"].startswith(shared.prefix)]
    assert (listed["key"], listed["kind"], listed["state"]) == (
        shared.key("listed-1"),
        "mcp.pay.charge",
        "done",
    )


@SQLITE_BY_DEFAULT
@pytest.mark.parametrize("mode", ["auto", "2026-07-28"])
def test_a_client_of_the_2026_protocol_through_the_proxy(
    db_url: str, raw: Raw, upstream_log: Path, mode: str
) -> None:
    """``mcp.Client`` negotiating with ``server/discover`` (auto), or pinned to 2026-07-28 with
    no handshake at all (the proxy then asks ``server/discover`` itself for the name)."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from tests.mcp.conftest import ROOT, child_env, proxy_argv

    argv = proxy_argv(db_url)
    params = StdioServerParameters(
        command=argv[0], args=argv[1:], env=child_env(upstream_log), cwd=str(ROOT)
    )

    async def scenario() -> None:
        async with Client(params, mode=mode) as client:
            for _ in range(2):
                result = await client.call_tool("charge", {"amount": 4}, meta={KEY: "m-1"})
                assert text(result) == "charged 4"
            assert text(await client.call_tool("lookup", {"q": "z"})) == "found z"

    anyio.run(scenario)
    [effect] = raw.effects()
    assert (effect["key"], effect["kind"], effect["state"]) == ("m-1", "mcp.pay.charge", "done")
    assert [c["tool"] for c in calls_logged(upstream_log)] == ["charge", "lookup"]


@SQLITE_BY_DEFAULT
def test_a_servers_request_to_the_client_during_a_recorded_call_passes_through(
    db_url: str, raw: Raw, upstream_log: Path
) -> None:
    """The server asks the client something (an elicitation) while the proxy performs its
    call: the request reaches the client's SDK callback, the answer reaches the server, and
    the call's one effect holds the answer the server gave after it."""
    asked: list[str] = []

    async def on_elicit(context: Any, params: Any) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"ok": True})

    async def scenario() -> None:
        async with proxied(db_url, upstream_log, elicitation_callback=on_elicit) as session:
            result = await session.call_tool("confirm", {"action": "refund"}, meta={KEY: "e-1"})
            assert not result.is_error and text(result) == "confirmed refund"

    anyio.run(scenario)
    assert asked == ["Confirm refund?"]
    [effect] = raw.effects()
    assert effect["key"] == "e-1" and effect["state"] == "done"
    assert [(c["tool"], c["arguments"]["ok"]) for c in calls_logged(upstream_log)] == [
        ("confirm", True)
    ]
