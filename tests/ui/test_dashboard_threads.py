"""The LangGraph pages of ``oncewire ui``: threads written by a real OncewireSaver (a graph run
and plain puts) on a real SQLite file and a real PostgreSQL schema, one of them tampered with
directly in its table. The list shows every thread once across its pages, the intact ones
verified and the tampered one broken with the typed error's reason; a thread's page lists its
checkpoints as stored and names the row that no longer matches its chain entry. The server is
a child process (``oncewire ui --port 0``); a second one runs where ``import langgraph`` fails,
and verifies the same way (the chain's code needs no LangGraph)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

pytest.importorskip("langgraph.graph", reason="needs the langgraph extra")

from langgraph.graph import END, START, StateGraph

from oncewire.langgraph import OncewireSaver
from oncewire.ledger import Ledger
from oncewire.ui.headers import HEADERS
from oncewire.ui.threads import THREADS_PAGE
from tests.support.runs_db import RunsDatabase
from tests.ui.support import fetch, server

pytestmark = pytest.mark.timeout(300)

GOOD, BAD, HOSTILE = "a-good", "a-bad", "<b>x</b>&"
FILLERS = [f"z-{i:03d}" for i in range(THREADS_PAGE + 1)]
ROW = re.compile(r'<tr data-thread="([^"]*)" data-ok="(yes|no)">(.*?)</tr>', re.S)
CELL = re.compile(r'<td class="(good|bad)">(.*?)</td>', re.S)


@pytest.fixture
def database(store_url: str) -> Iterator[RunsDatabase]:
    opened = RunsDatabase(store_url)
    yield opened


def _graph() -> Any:
    g = StateGraph(dict[str, int])
    g.add_node("one", lambda s: {"n": s.get("n", 0) + 1})
    g.add_node("two", lambda s: {"n": s.get("n", 0) + 1})
    g.add_edge(START, "one")
    g.add_edge("one", "two")
    g.add_edge("two", END)
    return g


def _checkpoint() -> dict[str, Any]:
    return {
        "v": 4,
        "id": "1f000000-0000-6000-8000-000000000001",
        "ts": "",
        "channel_values": {},
        "channel_versions": {},
        "versions_seen": {},
        "updated_channels": None,
    }


def _write_threads(url: str) -> None:
    with Ledger(url) as ledger:
        saver = OncewireSaver(ledger)
        app = _graph().compile(checkpointer=saver)
        for thread_id in (GOOD, BAD):
            app.invoke({"n": 0}, {"configurable": {"thread_id": thread_id}})
        for thread_id in [HOSTILE, *FILLERS]:
            config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
            saver.put(config, _checkpoint(), {"source": "input", "step": -1, "parents": {}}, {})


def _tamper(database: RunsDatabase) -> str:
    """Flip a byte of the bad thread's newest checkpoint blob; that checkpoint's id."""
    cid, blob = database.query(
        "SELECT checkpoint_id, checkpoint FROM oncewire_lg_checkpoints WHERE thread_id = ? "
        "ORDER BY checkpoint_id DESC LIMIT 1",
        (BAD,),
    )[0]
    blob = bytes(blob)
    database.execute(
        (
            "UPDATE oncewire_lg_checkpoints SET checkpoint = ? WHERE thread_id = ? "
            "AND checkpoint_id = ?",
            (bytes([blob[0] ^ 1]) + blob[1:], BAD, cid),
        )
    )
    return str(cid)


def _rows(text: str) -> dict[str, tuple[bool, str, str]]:
    """thread id -> (verified, the verification cell's class, its text)."""
    found = {}
    for thread_id, ok, cells in ROW.findall(text):
        cell = CELL.search(cells)
        assert cell is not None, cells
        found[html.unescape(thread_id)] = (ok == "yes", cell.group(1), html.unescape(cell.group(2)))
    return found


def _all_pages(base: str) -> list[dict[str, tuple[bool, str, str]]]:
    pages, address = [], base + "/threads"
    while True:
        answer = fetch(address)
        assert answer.status == 200, answer.text
        assert answer.headers["content-security-policy"] == HEADERS["content-security-policy"]
        assert '<a href="/threads"' in answer.text  # the navigation links the page
        pages.append(_rows(answer.text))
        following = re.search(r'<a id="next-page" href="([^"]*)"', answer.text)
        if following is None:
            return pages
        address = base + html.unescape(following.group(1))


def _check_list(base: str, database: RunsDatabase) -> None:
    stored = [str(r[0]) for r in database.query("SELECT thread_id FROM oncewire_lg_threads")]
    pages = _all_pages(base)
    assert [len(p) for p in pages] == [THREADS_PAGE, len(stored) - THREADS_PAGE]
    listed = [t for p in pages for t in p]
    assert listed == sorted(stored)  # each thread once, by id, across the pages
    shown = {t: v for p in pages for t, v in p.items()}
    assert shown[GOOD][:2] == (True, "good") and shown[GOOD][2].startswith("verified: ")
    ok, css, text = shown[BAD]
    assert (ok, css) == (False, "bad")
    assert text.startswith("broken: checkpoint ") and "does not match its chain entry" in text
    assert text.endswith("[checkpoint_tampered]")
    assert [t for t, v in shown.items() if not v[0]] == [BAD]  # the rest verified


def _check_detail(base: str, database: RunsDatabase, tampered: str) -> None:
    for thread_id in (GOOD, BAD):
        answer = fetch(base + "/thread?" + urlencode({"id": thread_id}))
        assert answer.status == 200, answer.text
        verified = 'data-ok="yes"' in answer.text.split('id="verification"')[1][:80]
        assert verified == (thread_id == GOOD)
        rows = re.findall(r'<tr data-checkpoint="([^"]*)" data-check="([^"]*)">', answer.text)
        stored = database.query(
            "SELECT checkpoint_id FROM oncewire_lg_checkpoints WHERE thread_id = ? "
            "ORDER BY seq DESC",
            (thread_id,),
        )
        assert [c for c, _ in rows] == [str(r[0]) for r in stored] and len(rows) >= 3
        broken = [c for c, check in rows if check != "matches"]
        assert broken == ([tampered] if thread_id == BAD else [])
        lease = re.search(r"<th>owner / lease</th><td>(.*?)</td>", answer.text)
        assert lease is not None
        owner, fence = database.query(
            "SELECT owner, fence FROM oncewire_leases WHERE name = ?",
            ("langgraph.thread:" + thread_id,),
        )[0]
        expected = f"released (fence {fence})" if owner is None else f"{owner} (fence {fence}, "
        assert html.unescape(lease.group(1)).startswith(expected)
    hostile = fetch(base + "/thread?" + urlencode({"id": HOSTILE}))
    assert hostile.status == 200 and "<b>x</b>" not in hostile.text
    assert "&lt;b&gt;x&lt;/b&gt;&amp;" in hostile.text
    assert fetch(base + "/thread?id=nobody").status == 404


def test_threads_are_listed_verified_and_paged(database: RunsDatabase, tmp_path: Path) -> None:
    _write_threads(database.url)
    tampered = _tamper(database)
    with server(database.url) as ui:
        _check_list(ui.url, database)
        _check_detail(ui.url, database, tampered)
        first = fetch(ui.url + "/threads").text
        assert "&lt;b&gt;x&lt;/b&gt;&amp;" in first and "<b>x</b>" not in first

    # A key the threads were not chained with judges nothing: no thread is shown as fine.
    with server(database.url, env={"ONCEWIRE_RUNS_KEY": "another key"}) as ui:
        shown = {t: v for p in _all_pages(ui.url) for t, v in p.items()}
        assert len(shown) == len(FILLERS) + 3
        assert all(not ok and css == "bad" for ok, css, _ in shown.values())
        assert all(text.startswith("not verified: ") for _, _, text in shown.values())

    # Where LangGraph cannot be imported, the pages verify the same way.
    shadow = tmp_path / "no-langgraph"
    (shadow / "langgraph").mkdir(parents=True)
    (shadow / "langgraph" / "__init__.py").write_text('raise ImportError("no langgraph here")\n')
    with server(database.url, env={"PYTHONPATH": str(shadow)}) as ui:
        _check_list(ui.url, database)
        _check_detail(ui.url, database, tampered)

    # Rows whose head row was deleted are not a thread that verifies.
    database.execute(("DELETE FROM oncewire_lg_threads WHERE thread_id = ?", (FILLERS[0],)))
    with server(database.url) as ui:
        answer = fetch(ui.url + "/thread?" + urlencode({"id": FILLERS[0]}))
        assert answer.status == 200, answer.text
        verdict = re.search(r'<p id="verification" class="bad" data-ok="no">(.*?)</p>', answer.text)
        assert verdict is not None and "rows without a chain head" in verdict.group(1)
        assert 'data-check="not checked"' in answer.text
