"""``oncewire mcp proxy --upstream URL``: the server on streamable HTTP (the SDK's
``streamable_http_client``), the client on stdio; the same effects as with a child server.
The transport does not depend on the store: the server behind the proxy and the clients in
front of it run on both backends in every run, the rest on SQLite by default and on both under
``--soak``."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.mcp.conftest import (
    ROOT,
    SQLITE_BY_DEFAULT,
    Raw,
    calls_logged,
    child_env,
    proxied,
    proxy_argv,
)

KEY = "io.oncewire/idempotency-key"


# The two transports' main cases, on both backends in every run (the rest of the file runs on
# PostgreSQL under --soak).
BOTH_BACKENDS = pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def http_upstream(upstream_log: Path) -> Iterator[str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp.upstream_server", "--http", str(port)],
        env=child_env(upstream_log),
        cwd=str(ROOT),
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, "the HTTP server exited"
                assert time.monotonic() < deadline, "the HTTP server did not listen"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=30)


def text(result: object) -> str:
    return " ".join(getattr(c, "text", "") for c in getattr(result, "content", []))


@BOTH_BACKENDS
def test_a_streamable_http_server_behind_the_proxy(
    db_url: str, raw: Raw, upstream_log: Path, http_upstream: str
) -> None:
    async def scenario() -> None:
        async with proxied(db_url, upstream_log, "--upstream", http_upstream) as session:
            assert session.initialize_result is not None
            assert session.initialize_result.server_info.name == "pay"
            tools = {t.name for t in (await session.list_tools()).tools}
            assert {"charge", "lookup"} <= tools
            first = await session.call_tool("charge", {"amount": 7}, meta={KEY: "h-1"})
            again = await session.call_tool("charge", {"amount": 7}, meta={KEY: "h-1"})
            assert text(first) == text(again) == "charged 7"
            assert text(await session.call_tool("lookup", {"q": "y"})) == "found y"
            resource = await session.read_resource("res://greeting")
            assert "hello from the server" in str(resource)

    anyio.run(scenario)
    [effect] = raw.effects()
    assert (effect["key"], effect["kind"], effect["state"]) == ("h-1", "mcp.pay.charge", "done")
    logged = calls_logged(upstream_log)
    assert [(c["tool"], c["key"], c["redelivery"]) for c in logged] == [
        ("charge", "h-1", False),
        ("lookup", None, None),
    ]


@pytest.fixture
def listening(db_url: str, upstream_log: Path) -> Iterator[str]:
    """``oncewire mcp proxy --listen`` in front of the stdio server, as a child process."""
    port = _free_port()
    argv = proxy_argv(db_url, "--listen", f"127.0.0.1:{port}")
    process = subprocess.Popen(argv, env=child_env(upstream_log), cwd=str(ROOT))
    try:
        _wait_listening(process, port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=30)


def _wait_listening(process: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert process.poll() is None, "the process exited"
            assert time.monotonic() < deadline, "nothing listened"
            time.sleep(0.1)


@BOTH_BACKENDS
def test_clients_on_streamable_http_in_front_of_a_stdio_server(
    db_url: str, raw: Raw, upstream_log: Path, listening: str
) -> None:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def one_session() -> list[str]:
        async with (
            streamable_http_client(listening) as streams,
            ClientSession(streams[0], streams[1]) as session,
        ):
            init = await session.initialize()
            assert init.server_info.name == "pay"
            tools = {t.name for t in (await session.list_tools()).tools}
            assert {"charge", "lookup"} <= tools
            answers = []
            for _ in range(2):
                result = await session.call_tool("charge", {"amount": 8}, meta={KEY: "l-1"})
                answers.append(text(result))
            answers.append(text(await session.call_tool("lookup", {"q": "w"})))
            return answers

    async def scenario() -> None:
        assert await one_session() == ["charged 8", "charged 8", "found w"]
        assert await one_session() == ["charged 8", "charged 8", "found w"]  # a new session

    anyio.run(scenario)
    [effect] = raw.effects()
    assert (effect["key"], effect["kind"], effect["state"]) == ("l-1", "mcp.pay.charge", "done")
    assert [c["tool"] for c in calls_logged(upstream_log)] == ["charge", "lookup", "lookup"]


@SQLITE_BY_DEFAULT
def test_each_listening_session_has_its_calls_performed_by_its_own_server(
    db_url: str, raw: Raw, upstream_log: Path, listening: str
) -> None:
    """Sessions served at once by one ``--listen`` process, each with a server child of its
    own and the same serverInfo.name: every call is performed by the server of the session
    that sent it (the servers' pids in their log)."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def one_session(side: str) -> None:
        async with (
            streamable_http_client(listening) as streams,
            ClientSession(streams[0], streams[1]) as session,
        ):
            await session.initialize()
            assert text(await session.call_tool("lookup", {"q": side})) == f"found {side}"

            async def one(n: int) -> None:
                meta = {KEY: f"{side}-{n}"}
                result = await session.call_tool("charge", {"amount": n, "note": side}, meta=meta)
                assert text(result) == f"charged {n}"

            async with anyio.create_task_group() as tg:
                for n in range(8):
                    tg.start_soon(one, n)

    async def scenario() -> None:
        async with anyio.create_task_group() as tg:
            for side in ("a", "b", "c"):
                tg.start_soon(one_session, side)

    anyio.run(scenario)
    assert len(raw.effects()) == 24
    assert {e["state"] for e in raw.effects()} == {"done"}
    logged = calls_logged(upstream_log)
    server_of = {c["arguments"]["q"]: c["pid"] for c in logged if c["tool"] == "lookup"}
    assert len(set(server_of.values())) == 3  # a server per session
    for call in (c for c in logged if c["tool"] == "charge"):
        side = call["arguments"]["note"]
        assert call["pid"] == server_of[side], f"a call of session {side} went to another server"
    assert len([c for c in logged if c["tool"] == "charge"]) == 24


@pytest.mark.parametrize(
    ("given", "address"),
    [
        ("8765", ("127.0.0.1", 8765)),
        (":8765", ("127.0.0.1", 8765)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
        ("[::1]:9000", ("::1", 9000)),
        ("localhost:1", ("localhost", 1)),
    ],
)
def test_a_listen_address_without_a_host_is_loopback(given: str, address: tuple[str, int]) -> None:
    from oncewire.cli.mcp import _address

    assert _address(given) == address


def test_a_bad_listen_address_is_refused_before_the_store_is_opened(tmp_path: Path) -> None:
    db = tmp_path / "never.db"
    argv = [sys.executable, "-m", "oncewire", "mcp", "proxy", "--db", str(db), "--listen"]
    for bad in ("127.0.0.1:http", "127.0.0.1:70000", "host:", ""):
        ran = subprocess.run(
            [*argv, bad, "--", sys.executable, "-c", "pass"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ran.returncode == 1, (bad, ran.stderr)
        assert ran.stderr.startswith("error: --listen takes HOST:PORT"), ran.stderr
        assert not db.exists()


@SQLITE_BY_DEFAULT
def test_a_streamable_http_server_that_dies_with_the_call_in_flight_is_an_unknown_outcome(
    db_url: str, raw: Raw, upstream_log: Path, http_upstream: str
) -> None:
    """The server's process exits after the request reached it: the SDK's transport resolves
    the request with its connection-closed error (-32000), which does not say the call did not
    run. The call is answered "outcome unknown" and recorded dead, maybe sent, never refused."""
    import mcp_types

    from oncewire.mcp.proxy_calls import CONNECTION_CLOSED

    assert mcp_types.CONNECTION_CLOSED == CONNECTION_CLOSED  # the code the proxy reads so

    async def scenario() -> None:
        async with proxied(db_url, upstream_log, "--upstream", http_upstream) as session:
            with anyio.fail_after(60):
                result = await session.call_tool("exit_now", {}, meta={KEY: "hx-1"})
            assert result.is_error
            assert text(result).startswith("outcome unknown: the tool may or may not have run")

    anyio.run(scenario)
    [effect] = raw.effects()
    assert (effect["key"], effect["state"], effect["maybe_sent"]) == ("hx-1", "dead", True)
    assert [c["tool"] for c in calls_logged(upstream_log)] == ["exit_now"]
