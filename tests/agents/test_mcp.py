"""MCP tools in a durable run, as real processes: the run (``tests/agents/mcp_agent.py``, a
child of the test) starts ``oncewire mcp proxy`` through the SDK's ``MCPServerStdio`` with
``oncewire.agents.mcp_meta`` as its ``tool_meta_resolver``, and the proxy starts the lab's
``tickets`` server (``oncewire.mcp.once`` over ``Receipts``). Processes are SIGKILLed by armed
crash points, and the run is started again with its run_key: one effect in the run's store, one
in the proxy's, one run of the server's body and one ticket, whatever died where. The control
(under ``--soak``) is the same crash without the resolver: a second ticket.

What happened is read from the stores (the run's effects, the proxy's effects, the server's
receipts and tickets), the server body's side log (every run of the body, committed or not),
the log of what ``mcp_meta`` returned, and the token files the dying processes wrote; never from
what the run answered alone. On SQLite the run and the proxy have stores of their own; on
PostgreSQL they share one schema, as one database often serves both.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp.server.mcpserver", reason="needs the mcp extra")
pytest.importorskip("agents.mcp", reason="needs the agents extra")

from oncewire import agents as durable
from oncewire.agents.mcp import mcp_key
from oncewire.core.crash import ENV_POINTS, ENV_TOKEN
from oncewire.dispatch.attempt import running
from oncewire.effects.attempt import Attempt
from oncewire.lab.fixtures import dialect_of, rows
from oncewire.mcp import IDEMPOTENCY_KEY, REDELIVERY
from tests.conftest import _child_env

from .mcp_agent import CALL_ID, RUN_KEY

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
EFFECT = f"agents/{RUN_KEY}/{CALL_ID}"
KEY = mcp_key(EFFECT)
ANSWER = {"type": "text", "text": '{\n  "ticket_id": 1\n}'}
TOOL_KIND = "mcp.oncewire-lab-tickets.create_ticket"


@dataclass
class Stores:
    folder: Path
    ledger: str  # the run's
    proxy: str  # the proxy's (the run's own on PostgreSQL)

    def run(self, *args: str, crash: str | None = None) -> subprocess.CompletedProcess[str]:
        """The run in a child process (``crash``: a point armed in it)."""
        env = _child_env()
        if crash is not None:
            env.update({ENV_POINTS: crash, ENV_TOKEN: str(self.folder / "agent.crash")})
        argv = [sys.executable, "-m", "tests.agents.mcp_agent", str(self.folder), self.ledger]
        return subprocess.run(
            [*argv, "--proxy-db", self.proxy, *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def finished(self, *args: str) -> dict[str, Any]:
        done = self.run(*args)
        assert done.returncode == 0, done.stderr
        answered: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return answered

    def killed(self, *args: str, crash: str | None = None) -> None:
        done = self.run(*args, crash=crash)
        assert done.returncode == -9, (done.returncode, done.stderr)

    def effects(self, url: str, kind: str) -> list[dict[str, Any]]:
        return rows(
            dialect_of(url),
            url,
            "SELECT key, state, result, maybe_sent, started_fence, recoveries "
            f"FROM oncewire_effects WHERE kind = '{kind}' ORDER BY id",
        )

    def run_effects(self) -> list[dict[str, Any]]:
        return self.effects(self.ledger, "agents.tool")

    def proxy_effects(self) -> list[dict[str, Any]]:
        return self.effects(self.proxy, TOOL_KIND)

    def receiver(self, sql: str) -> list[dict[str, Any]]:
        return rows("sqlite", str(self.folder / "receiver.db"), sql)

    def lines(self, name: str) -> list[Any]:
        path = self.folder / name
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def body_runs(self) -> list[tuple[str, bool]]:
        """Every run of the server's tool body: (key, redelivery)."""
        return [(line["key"], line["redelivery"]) for line in self.lines("side.log")]

    def sent(self) -> list[Any]:
        """What the run's resolver sent as ``_meta``, call by call."""
        return [line["meta"] for line in self.lines("meta.log")]

    def model_calls(self) -> list[str]:
        path = self.folder / "calls.log"
        return path.read_text().split() if path.exists() else []

    def crashed(self, name: str) -> str:
        return (self.folder / name).read_text().split()[0]


@pytest.fixture
def stores(store_url: str, tmp_path: Path) -> Stores:
    if dialect_of(store_url) == "sqlite":
        return Stores(tmp_path, store_url, str(tmp_path / "proxy.db"))
    return Stores(tmp_path, store_url, store_url)


def _sent(redelivery: bool) -> dict[str, Any]:
    return {IDEMPOTENCY_KEY: KEY, REDELIVERY: redelivery}


def test_the_resolver_sends_the_attempts_key_and_flag_and_nothing_outside_an_attempt() -> None:
    assert durable.mcp_meta(None) is None
    attempt = Attempt(EFFECT, "agents.tool", {}, number=2, redelivery=True, fence=2)
    assert running(attempt, lambda: durable.mcp_meta(None)) == _sent(True)
    assert KEY == "mcp/agents/ticket-42/call-1"


def test_a_call_the_server_ran_before_both_died_is_redelivered_by_key_and_answered_once(
    stores: Stores,
) -> None:
    # The server ran the call and answered; the proxy dies before it stores the answer, and
    # the run dies before it records its tool's outcome (which is the proxy's closed pipe).
    stores.killed(
        "--proxy-crash", "mcp.proxy.after_forward", crash="dispatch.after_sink_before_record"
    )
    assert stores.crashed("proxy.crash") == "mcp.proxy.after_forward"
    assert stores.crashed("agent.crash") == "dispatch.after_sink_before_record"
    assert [e["state"] for e in stores.run_effects()] == ["claimed"]
    assert [e["state"] for e in stores.proxy_effects()] == ["claimed"]
    assert stores.body_runs() == [(KEY, False)]
    assert len(stores.receiver("SELECT key FROM oncewire_receipts")) == 1

    assert stores.finished() == {"final": "Ticket opened.", "outputs": [ANSWER]}
    # The run redelivered its call, flagged, under the same key ...
    assert stores.sent() == [_sent(False), _sent(True)]
    (run_effect,) = stores.run_effects()
    assert (run_effect["state"], run_effect["recoveries"]) == ("done", 1)
    # ... the new proxy found the call in its record, not ended, and forwarded it again ...
    (proxy_effect,) = stores.proxy_effects()
    assert (proxy_effect["key"], proxy_effect["state"]) == (KEY, "done")
    assert (proxy_effect["started_fence"], proxy_effect["recoveries"]) == (2, 1)
    # ... and the server answered it from its receipt: the body ran once, one ticket.
    assert stores.body_runs() == [(KEY, False)]
    assert stores.receiver("SELECT key FROM oncewire_receipts") == [{"key": KEY}]
    assert stores.receiver("SELECT operation_id FROM tickets") == [{"operation_id": KEY}]
    assert stores.model_calls() == ["0", "1"]


@pytest.mark.parametrize("stores", ["sqlite"], indirect=True)
def test_a_crash_after_the_proxy_answered_is_answered_from_the_proxys_record(
    stores: Stores,
) -> None:
    stores.killed(crash="agents.tool_returned")
    assert stores.crashed("agent.crash") == "agents.tool_returned"
    assert [e["state"] for e in stores.proxy_effects()] == ["done"]

    assert stores.finished() == {"final": "Ticket opened.", "outputs": [ANSWER]}
    assert stores.sent() == [_sent(False), _sent(True)]
    (proxy_effect,) = stores.proxy_effects()
    assert (proxy_effect["state"], proxy_effect["started_fence"]) == ("done", 1)
    assert stores.body_runs() == [(KEY, False)]


@pytest.mark.parametrize("stores", ["sqlite"], indirect=True)
def test_without_a_proxy_the_server_reads_the_key_and_the_flag_from_the_run(
    stores: Stores,
) -> None:
    # The server dies after its body's work, before the receipt commits (both roll back).
    stores.killed(
        "--direct",
        "--server-crash",
        "receipts.after_work_before_commit",
        crash="dispatch.after_sink_before_record",
    )
    assert stores.crashed("server.crash") == "receipts.after_work_before_commit"
    assert stores.receiver("SELECT key FROM oncewire_receipts") == []

    assert stores.finished("--direct") == {"final": "Ticket opened.", "outputs": [ANSWER]}
    assert stores.body_runs() == [(KEY, False), (KEY, True)]
    assert stores.receiver("SELECT key FROM oncewire_receipts") == [{"key": KEY}]
    assert stores.receiver("SELECT operation_id, redelivery FROM tickets") == [
        {"operation_id": KEY, "redelivery": 1}
    ]


@pytest.mark.slow
@pytest.mark.parametrize("stores", ["sqlite"], indirect=True)
def test_without_the_resolver_the_redelivered_call_runs_again_at_the_server(
    stores: Stores,
) -> None:
    # The control: the SDK as it comes sends no key, so the proxy keys each request by its own
    # session, and the redelivery is a new call with a receipt of its own: a second ticket.
    stores.killed(
        "--no-meta",
        "--proxy-crash",
        "mcp.proxy.after_forward",
        crash="dispatch.after_sink_before_record",
    )
    stores.finished("--no-meta")
    assert [e["state"] for e in stores.run_effects()] == ["done"]
    keys = [key for key, _ in stores.body_runs()]
    assert len(keys) == len(set(keys)) == 2
    assert len(stores.receiver("SELECT operation_id FROM tickets")) == 2
