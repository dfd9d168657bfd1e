"""The lab's MCP servers as real stdio child processes of the SDK's client, on SQLite and
PostgreSQL: a call answered once across server processes, the capability read on the wire, and
a server SIGKILLed (a real ``kill -9``, by an armed crash point) between the tool body's work and
its receipt's commit, or between the commit and the answer, then the call retried with its key.

What happened is read from the store's tables, a side file the body appends to *outside* its
transaction, and the crash token file the dying process wrote, never from the server's answers.

The default run covers each case on both backends with the sync tool and on SQLite with the
``async def`` tool (its receipts are the sync store's, run on threads); the async tool on
PostgreSQL, and the capability read on PostgreSQL (it does not depend on the store), run
under ``--soak``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp.server.mcpserver", reason="needs the mcp extra")

from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from oncewire.core.crash import ENV_POINTS, ENV_TOKEN
from oncewire.mcp import DEDUPLICATES, IDEMPOTENCY_KEY, REDELIVERY
from tests.conftest import _child_env
from tests.mcp_once.conftest import PYTHON, lines, receipts_of, run, server_argv, tickets

pytestmark = pytest.mark.crash

SOAK = pytest.mark.slow

BACKEND_AND_TOOL = pytest.mark.parametrize(
    ("store_url", "use_async"),
    [
        pytest.param("sqlite", False, id="sync-sqlite"),
        pytest.param("postgresql", False, id="sync-postgresql"),
        pytest.param("sqlite", True, id="async-sqlite"),
        pytest.param("postgresql", True, id="async-postgresql", marks=SOAK),
    ],
    indirect=["store_url"],
)


def tickets_params(store: str, side: Path, *extra: str, **env: str) -> StdioServerParameters:
    argv = server_argv("tickets", "--store", store, "--side-log", str(side), *extra)
    return StdioServerParameters(command=PYTHON, args=argv, env=_child_env(**env))


def call(
    params: StdioServerParameters, key: str, *, redelivery: bool = False, title: str = "Backlog"
) -> CallToolResult:
    meta: dict[str, Any] = {IDEMPOTENCY_KEY: key}
    if redelivery:
        meta[REDELIVERY] = True

    async def once() -> CallToolResult:
        async with Client(params) as client:
            return await client.call_tool("create_ticket", {"title": title}, meta=meta)

    return run(once)


def died(params: StdioServerParameters, key: str) -> None:
    """The call, to a server that dies in it: the client sees the connection close."""
    with pytest.raises(BaseException) as caught:
        call(params, key)
    assert _mcp_errors(caught.value), caught.value


def _mcp_errors(exc: BaseException) -> list[MCPError]:
    if isinstance(exc, MCPError):
        return [exc]
    nested = getattr(exc, "exceptions", ())
    return [found for inner in nested for found in _mcp_errors(inner)]


@BACKEND_AND_TOOL
def test_a_call_is_answered_once_across_server_processes(
    store_url: str, tmp_path: Path, use_async: bool
) -> None:
    side = tmp_path / "side.log"
    flags = ("--async",) if use_async else ()
    first = call(tickets_params(store_url, side, *flags), "t-1")
    again = call(tickets_params(store_url, side, *flags), "t-1")  # a new server process
    assert not first.is_error and again.structured_content == first.structured_content
    assert again.content == first.content
    assert [t["operation_id"] for t in tickets(store_url)] == ["t-1"]
    assert len(lines(side)) == 1  # the body ran once
    assert len({line["pid"] for line in lines(side)}) == 1


@pytest.mark.parametrize(
    "store_url", ["sqlite", pytest.param("postgresql", marks=SOAK)], indirect=True
)
@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_the_capability_is_read_by_a_client_over_stdio(
    store_url: str, tmp_path: Path, mode: str
) -> None:
    log_params = StdioServerParameters(
        command=PYTHON, args=server_argv("log", "--log", str(tmp_path / "l.log")), env=_child_env()
    )

    async def capabilities() -> tuple[Any, Any]:
        params = tickets_params(store_url, tmp_path / "side.log")
        async with Client(params, mode=mode) as ours, Client(log_params, mode=mode) as plain:
            return ours.server_capabilities.experimental, plain.server_capabilities.experimental

    ours, plain = run(capabilities)
    assert ours == {DEDUPLICATES: {"version": 1}}
    assert not (plain or {}).get(DEDUPLICATES)


@BACKEND_AND_TOOL
def test_a_server_killed_before_the_receipt_commits_leaves_nothing_and_the_retry_writes_once(
    store_url: str, tmp_path: Path, use_async: bool
) -> None:
    side, token = tmp_path / "side.log", tmp_path / "crash.token"
    flags = ("--async",) if use_async else ()
    armed = tickets_params(
        store_url,
        side,
        *flags,
        **{ENV_POINTS: "receipts.after_work_before_commit", ENV_TOKEN: str(token)},
    )
    died(armed, "k-1")
    name, pid = token.read_text().split()
    assert name == "receipts.after_work_before_commit"
    assert not _alive(int(pid))
    # The body ran (its side file says so) and wrote its ticket in the receipt's transaction,
    # which the kill rolled back: no ticket, no receipt. The file outside it kept its line.
    assert [(line["key"], line["redelivery"]) for line in lines(side)] == [("k-1", False)]
    assert tickets(store_url) == [] and receipts_of(store_url) == []

    retried = call(tickets_params(store_url, side, *flags), "k-1", redelivery=True)
    assert not retried.is_error
    assert [(line["key"], line["redelivery"]) for line in lines(side)] == [
        ("k-1", False),
        ("k-1", True),  # the retry's body saw the flag
    ]
    stored = tickets(store_url)
    assert [(t["operation_id"], t["redelivery"]) for t in stored] == [("k-1", 1)]
    assert [r["key"] for r in receipts_of(store_url)] == ["k-1"]
    assert retried.structured_content == {"ticket_id": _ticket_ids(store_url)[0]}


@BACKEND_AND_TOOL
def test_a_server_killed_after_the_commit_answers_the_retry_from_the_receipt(
    store_url: str, tmp_path: Path, use_async: bool
) -> None:
    side, token = tmp_path / "side.log", tmp_path / "crash.token"
    flags = ("--async",) if use_async else ()
    armed = tickets_params(
        store_url,
        side,
        *flags,
        **{ENV_POINTS: "receipts.after_commit_before_reply", ENV_TOKEN: str(token)},
    )
    died(armed, "k-2")
    assert token.read_text().split()[0] == "receipts.after_commit_before_reply"
    assert [t["operation_id"] for t in tickets(store_url)] == ["k-2"]  # committed, unanswered

    retried = call(tickets_params(store_url, side, *flags), "k-2", redelivery=True)
    assert retried.structured_content == {"ticket_id": _ticket_ids(store_url)[0]}
    assert len(lines(side)) == 1  # replayed: the body did not run again
    assert [(t["operation_id"], t["redelivery"]) for t in tickets(store_url)] == [("k-2", 0)]


def test_the_plain_log_server_appends_a_line_per_call(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    params = StdioServerParameters(
        command=PYTHON, args=server_argv("log"), env=_child_env(ONCEWIRE_MCP_LOG=str(log))
    )
    first = call(params, "p-1", title="A")
    call(params, "p-1", title="A", redelivery=True)
    assert not first.is_error
    entries = lines(log)
    assert [(e["key"], e["redelivery"]) for e in entries] == [("p-1", False), ("p-1", True)]
    assert entries[0]["arguments"] == {"title": "A", "project": "demo-agent", "priority": "normal"}
    assert entries[0]["pid"] != entries[1]["pid"]  # two server processes, nothing deduplicated


def _ticket_ids(url: str) -> list[int]:
    from tests.mcp_once.conftest import table

    return [int(row["id"]) for row in table(url, "SELECT id FROM tickets ORDER BY id")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
