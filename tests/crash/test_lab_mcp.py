"""The crash lab's mcp suite for real, on SQLite and on PostgreSQL: an SDK client's calls
through ``oncewire mcp proxy`` (real processes: the client, each proxy, each server), the proxy
and its server SIGKILLed, answers dropped, and the stores the suite kept read back here with
the plain drivers.

The default run takes a bounded slice of the suite's scenarios on each backend (a proxy crash
point with each server, a server crash point, a random run with two kills and a dropped
answer); the whole suite on both backends is ``slow`` (``make soak``)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire.lab.fixtures import Backend, rows, with_search_path
from oncewire.lab.framework import LabContext, Progress, ScenarioResult
from oncewire.lab.runner import run_lab
from oncewire.lab.suites.mcp import proxy_points, run_cells
from tests.support.pg import server_url

pytestmark = pytest.mark.crash

pytest.importorskip("mcp", reason="needs the mcp extra")


def _stores(folder: Path) -> tuple[str, str, str]:
    """(dialect, caller, downstream) of a scenario folder the lab kept."""
    listed = folder / "schemas.txt"
    if listed.exists():
        caller, downstream = listed.read_text().split()
        url = server_url()
        return "postgresql", with_search_path(url, caller), with_search_path(url, downstream)
    return "sqlite", str(folder / "caller.sqlite"), str(folder / "downstream.sqlite")


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _read_back(folder: Path, server: str) -> dict[str, Any]:
    """What a scenario's stores and the server's log hold, read around the suite."""
    dialect, caller, downstream = _stores(folder)
    effects = rows(dialect, caller, "SELECT key, state FROM oncewire_effects ORDER BY key")
    found: dict[str, Any] = {"effects": {e["key"]: e["state"] for e in effects}}
    if server == "tickets":
        tickets = rows(dialect, downstream, "SELECT operation_id FROM tickets")
        receipts = rows(dialect, downstream, "SELECT key FROM oncewire_receipts")
        found["tickets"] = Counter(t["operation_id"] for t in tickets)
        found["receipts"] = Counter(r["key"] for r in receipts)
    else:
        found["log"] = _lines(folder / "calls.jsonl")
    return found


def _failures(results: list[ScenarioResult]) -> str:
    return json.dumps({r.name: r.failures for r in results if r.failures}, indent=1)


@pytest.fixture
def pg_lab(tmp_path: Path) -> Iterator[Path]:
    lab = tmp_path / "lab"
    yield lab
    import psycopg

    with psycopg.connect(server_url(), autocommit=True) as conn:
        for listed in lab.glob("mcp/*/schemas.txt"):
            for schema in listed.read_text().split():
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


def _slice(root: Path, backend: Backend, cells: list[tuple[str, str, str]], mode: str) -> Any:
    root.mkdir()
    ctx = LabContext(root, 7, {"kills": 2}, Progress(enabled=False), backend, keep=True)
    results = list(run_cells(ctx, cells, [mode]))
    assert all(r.passed for r in results), _failures(results)
    assert not any(r.skipped for r in results)
    return {r.name: r for r in results}


def _check_one_ticket_each(folder: Path) -> None:
    found = _read_back(folder, "tickets")
    keys = set(found["effects"])
    assert keys and set(found["effects"].values()) == {"done"}, found
    assert found["tickets"] == Counter(dict.fromkeys(keys, 1)), found
    assert found["receipts"] == Counter(dict.fromkeys(keys, 1)), found


@pytest.mark.timeout(900)
def test_a_bounded_slice_of_the_mcp_suite_passes_on_sqlite(tmp_path: Path) -> None:
    cells = [
        ("proxy", "mcp.proxy.after_forward", "tickets"),
        ("proxy", "mcp.proxy.after_forward", "log"),
    ]
    results = _slice(tmp_path / "lab", Backend(), cells, "log+redeliver")
    suite = tmp_path / "lab" / "mcp"
    # The tickets server's call, killed after the server answered and before the proxy stored
    # it: redelivered, flagged, replayed by the receipt: one ticket, one receipt per key.
    _check_one_ticket_each(suite / "proxy-mcp.proxy.after_forward-tickets")
    # The plain server's: it ran once, and the proxy, not knowing, never ran it again; the
    # first call's answer is "outcome unknown", the second call's a success.
    plain = results["proxy[mcp.proxy.after_forward][log]"].summary
    assert (plain["executions"], plain["duplicates"], plain["unknown"]) == (2, 0, 1)
    found = _read_back(suite / "proxy-mcp.proxy.after_forward-log", "log")
    assert Counter(line["key"] for line in found["log"]) == Counter(
        dict.fromkeys(found["effects"], 1)
    )
    assert sorted(found["effects"].values()) == ["dead", "done"]
    # The random run on the plain server behind --redeliver: every extra execution flagged.
    random = results["random[log+redeliver]"].summary
    assert random["kills"] >= 1 and random["dropped"] == 1, random
    log = _read_back(suite / "random-log+redeliver", "log")["log"]
    seen: set[str] = set()
    for line in log:
        assert line["redelivery"] or line["key"] not in seen, line
        seen.add(line["key"])


@pytest.mark.timeout(900)
def test_a_bounded_slice_of_the_mcp_suite_passes_on_postgresql(
    tmp_path: Path, pg_lab: Path
) -> None:
    cells = [
        ("proxy", "mcp.proxy.before_forward", "log"),
        ("server", "receipts.after_work_before_commit", "tickets"),
    ]
    backend = Backend("postgresql", server_url(), run_id=f"test{tmp_path.name[-6:]}")
    results = _slice(pg_lab, backend, cells, "tickets")
    suite = pg_lab / "mcp"
    # Killed with the call claimed and not yet written to the server: the plain server never
    # got it, and the proxy, which cannot know that, answers "outcome unknown" and never
    # sends it: no execution, the effect dead.
    before = results["proxy[mcp.proxy.before_forward][log]"].summary
    assert (before["backend"], before["executions"], before["unknown"]) == ("postgresql", 1, 1)
    found = _read_back(suite / "proxy-mcp.proxy.before_forward-log", "log")
    assert sorted(found["effects"].values()) == ["dead", "done"]
    # The tickets server killed between its body's writes and the receipt's commit: neither
    # stored, the call redelivered (flagged), one ticket.
    server = results["server[receipts.after_work_before_commit][tickets]"].summary
    assert server["flagged"] >= 1 and server["duplicates"] == 0
    _check_one_ticket_each(suite / "server-receipts.after_work_before_commit-tickets")
    random = results["random[tickets]"].summary
    assert random["kills"] >= 1 and random["dropped"] == 1 and random["duplicates"] == 0, random
    _check_one_ticket_each(suite / "random-tickets")


def _check_suite(root: Path, evidence: dict[str, Any], backend: str) -> None:
    scenarios = evidence["suites"]["mcp"]["scenarios"]
    assert evidence["passed"], json.dumps(
        {n: s["failures"] for n, s in scenarios.items() if s["failures"]}, indent=1
    )
    for point in proxy_points():
        for server in ("tickets", "log"):
            scenario = scenarios[f"proxy[{point}][{server}]"]
            assert not scenario["skipped"] and scenario["summary"]["backend"] == backend
    for folder in sorted((root / "mcp").iterdir()):
        if folder.name.endswith("-tickets"):
            _check_one_ticket_each(folder)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_whole_mcp_suite_passes_on_sqlite(tmp_path: Path) -> None:
    evidence = run_lab(["mcp"], directory=tmp_path / "lab")
    _check_suite(tmp_path / "lab", evidence, "sqlite")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_whole_mcp_suite_passes_on_postgresql(tmp_path: Path, pg_lab: Path) -> None:
    backend = Backend("postgresql", server_url(), run_id=f"test{tmp_path.name[-6:]}")
    evidence = run_lab(["mcp"], directory=pg_lab, backend=backend)
    _check_suite(pg_lab, evidence, "postgresql")
