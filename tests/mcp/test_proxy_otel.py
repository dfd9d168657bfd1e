"""What the operator's tools see of a proxied call: ``oncewire mcp proxy --otel`` makes the
spans of its effect (the proxy a real child process, OpenTelemetry's global provider set in it
as ``opentelemetry-instrument`` would, every span written to a file as it ends),
``oncewire effects show`` prints its payload and result, and the dashboard (``oncewire ui``, a
real child process fetched over plain HTTP) lists it under its kind and opens it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.mcp.conftest import ROOT, SQLITE_BY_DEFAULT, Raw, Shared, calls_logged, child_env
from tests.ui.support import fetch, server

pytest.importorskip("opentelemetry.sdk", reason="needs the otel extra")

KEY = "io.oncewire/idempotency-key"


def text(result: object) -> str:
    return " ".join(getattr(c, "text", "") for c in getattr(result, "content", []))


def spans(path: Path, name: str, key: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [s for s in found if s["name"] == name and s["attributes"]["oncewire.effect.key"] == key]


@SQLITE_BY_DEFAULT
def test_a_proxied_call_makes_its_effects_spans_with_otel(
    db_url: str, raw: Raw, upstream_log: Path, tmp_path: Path
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    argv = [sys.executable, "-m", "tests.mcp.otel_proxy", "mcp", "proxy", "--db", db_url]
    argv += ["--otel", "--", sys.executable, "-m", "tests.mcp.upstream_server"]
    env = child_env(upstream_log, SPANS_FILE=str(spans_file))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(ROOT))

    async def scenario() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            for _ in range(2):  # the repeat is answered from the store: no attempt
                result = await session.call_tool("charge", {"amount": 4}, meta={KEY: "o-1"})
                assert text(result) == "charged 4"

    anyio.run(scenario)
    accepts = spans(spans_file, "oncewire.accept", "o-1")
    assert [s["attributes"]["oncewire.effect.created"] for s in accepts] == [True, False]
    assert {s["attributes"]["oncewire.effect.kind"] for s in accepts} == {"mcp.pay.charge"}
    [attempt] = spans(spans_file, "oncewire.attempt", "o-1")
    attributes = attempt["attributes"]
    assert attributes["oncewire.effect.kind"] == "mcp.pay.charge"
    assert (attributes["oncewire.attempt.outcome"], attributes["oncewire.attempt.state"]) == (
        "done",
        "done",
    )
    assert (attributes["oncewire.attempt.number"], attributes["oncewire.attempt.redelivery"]) == (
        1,
        False,
    )
    assert [c["key"] for c in calls_logged(upstream_log)] == ["o-1"]
    assert [e["state"] for e in raw.effects()] == ["done"]


def test_effects_show_prints_a_proxied_calls_payload_and_result(shared: Shared) -> None:
    key = shared.key("shown-1")

    async def scenario(session: ClientSession) -> None:
        await session.call_tool("charge", {"amount": 6, "note": "for show"}, meta={KEY: key})

    shared.run(scenario)
    show = [sys.executable, "-m", "oncewire", "effects", "show", "--db", shared.url, key]
    shown = json.loads(
        subprocess.run([*show, "--json"], capture_output=True, text=True, check=True).stdout
    )
    effect = shown["effect"]
    assert (effect["key"], effect["kind"], effect["state"]) == (key, "mcp.pay.charge", "done")
    assert effect["payload"] == {"tool": "charge", "arguments": {"amount": 6, "note": "for show"}}
    assert effect["result"]["content"] == [{"type": "text", "text": "charged 6"}]
    assert [(a["outcome"], a["redelivery"]) for a in shown["attempts"]] == [("done", False)]
    table = subprocess.run(show, capture_output=True, text=True, check=True).stdout
    assert '"arguments": {"amount": 6, "note": "for show"}' in table
    assert '"text": "charged 6"' in table


def test_the_dashboard_lists_a_proxied_call_under_its_kind_and_opens_it(shared: Shared) -> None:
    key = shared.key("dashboard-1")

    async def scenario(session: ClientSession) -> None:
        await session.call_tool(
            "charge", {"amount": 8, "note": "on the dashboard"}, meta={KEY: key}
        )

    shared.run(scenario)
    with server(shared.url) as ui:
        listed = fetch(f"{ui.url}/effects?kind=mcp.pay.charge")
        assert listed.status == 200, listed.text[:500]
        assert f'data-key="{key}"' in listed.text
        opened = fetch(f"{ui.url}/effects/{quote(key, safe='')}")
        assert opened.status == 200, opened.text[:500]
        assert 'id="effect-key"' in opened.text and key in opened.text
        for shown in ("mcp.pay.charge", "done", "on the dashboard", "charged 8"):
            assert shown in opened.text, shown


def test_otel_from_the_environment_says_when_no_provider_is_configured(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "oncewire", "mcp", "proxy", "--db", str(tmp_path / "p.db")]
    ran = subprocess.run(
        [*argv, "--", sys.executable, "-c", "pass"],  # a server that exits at once
        env=child_env(tmp_path / "upstream.log", ONCEWIRE_OTEL="1"),
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert "--otel: no OpenTelemetry tracer provider is configured" in ran.stderr
