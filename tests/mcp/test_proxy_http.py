"""``oncewire mcp proxy --upstream URL``: the server on streamable HTTP (the SDK's
``streamable_http_client``), the client on stdio; the same effects as with a child server."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.mcp.conftest import ROOT, Raw, calls_logged, child_env, proxied

KEY = "io.oncewire/idempotency-key"


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
