"""The MCP proxy benchmark runs end to end on SQLite and PostgreSQL (the SDK client, the lab's
servers and the proxy as real processes) and reports every figure it promises; timings are not
asserted, counts are."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.pg import server_url

pytest.importorskip("mcp", reason="needs the mcp extra")

ROOT = Path(__file__).resolve().parents[2]
SEGMENTS = {"to_accept", "accept_to_call", "server_call", "settle_to_client"}


@pytest.mark.timeout(300)
def test_mcp_bench_with_a_tiny_count_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "mcp_bench.py"),
            "-n",
            "4",
            "--warmup",
            "1",
            "--backend",
            "both",
            "--db",
            server_url(),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    assert document["n"] == 4
    assert set(document["results"]) == {"sqlite", "postgresql"}
    for backend, figures in document["results"].items():
        assert figures["floor"]["p50_ms"] > 0, backend
        for server in ("log", "tickets"):
            figure = figures[server]
            for path in ("direct", "proxy"):
                assert figure[path]["calls_per_second"] > 0, (backend, server, path)
                assert figure[path]["p99_ms"] >= figure[path]["p50_ms"] > 0
            assert "added_p50_ms" in figure and "added_p50_floors" in figure
            # Every proxied call was found in the store and split by its timestamps.
            assert set(figure["segments_ms"]) == SEGMENTS, (backend, server)
    for word in ("floor", "direct", "proxy", "split", "tickets", "log"):
        assert word in done.stdout, word
    # The closing note: where the added time goes, for every backend and server.
    assert "Where the proxy's added time goes" in done.stdout
    assert document["note"].startswith("Where the proxy's added time goes")
    for backend in ("sqlite", "postgresql"):
        for server in ("log", "tickets"):
            assert f"{backend}/{server}: +" in document["note"], (backend, server)
