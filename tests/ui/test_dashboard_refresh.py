"""The live refresh with effects waiting for an operator, on a real SQLite file and a real
PostgreSQL schema, against ``oncewire ui`` child processes.

Regression: once any effect was dead or rejected (or any chat had a reply), the fragment a page
fetches once a refresh period (``?fragment=1``) answered 500 on the overview, the effects list, an
effect's page and the chats: the fragment was rendered without the macros its template imports.
The header said "refresh failed" and the data froze. Each fragment is fetched over HTTP here,
and in a headless Chromium each page is opened, the store changed after it loaded, and the page
must show the change through its own refresh without ever saying a refresh failed. The server
refreshes every 0.2 s here (``--refresh-seconds``), so each wait is a fraction of a second.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.dispatch.dispatcher import Dispatcher
from oncewire.dispatch.retry import RetryPolicy
from oncewire.effects.outcomes import Done, MaybeSent, Rejected
from oncewire.lab.suites.replies_rig import Rig, reply_text
from tests.support.runs_db import RunsDatabase
from tests.ui.support import FAST, artifacts, browser, fetch, server

pytestmark = pytest.mark.timeout(300)

REFRESHED_MS = 20_000  # a hundred refresh periods: the change must show within one that succeeds

# Seen by the page's status line: every text it took, so a failure between two successes
# is not missed.
WATCH_STATUS = """
window.liveStatuses = [];
document.addEventListener("DOMContentLoaded", function () {
  var status = document.getElementById("live-status");
  if (!status) { return; }
  new MutationObserver(function () { window.liveStatuses.push(status.textContent); })
    .observe(status, { childList: true, characterData: true, subtree: true });
});
"""


@pytest.fixture
def database(store_url: str) -> Iterator[RunsDatabase]:
    opened = RunsDatabase(store_url)
    yield opened


def _prepare(database: RunsDatabase, folder: Path) -> int:
    """A dead, a rejected and a done effect (a real dispatcher), and a chat with a delivered
    reply (a real reply engine); returns the chat's inbound id."""
    with Ledger(database.url) as ledger:
        ledger.accept("dead-1", "doomed", {"n": 1}, max_attempts=1)
        ledger.accept("rejected-1", "refuse", {"n": 2})
        ledger.accept("done-1", "mail", {"n": 3})
        sinks = {
            "doomed": lambda attempt: MaybeSent("gateway timeout"),
            "refuse": lambda attempt: Rejected("no such account"),
            "mail": lambda attempt: Done({"sent": True}),
        }
        Dispatcher(ledger, sinks, retry=RetryPolicy(base_seconds=0.01, jitter=0.0)).run(
            until_idle=True, handle_signals=False
        )
    with Rig(folder / "rig", db=database.url) as rig:
        admitted = rig.admit("fk_tg", "c-1", "m-1")
        rig.answer(admitted.inbound.id, reply_text("A-1", "an answer."), "off")
    states = dict(database.query("SELECT key, state FROM oncewire_effects"))
    assert states == {"dead-1": "dead", "rejected-1": "rejected", "done-1": "done"}
    replies = database.query("SELECT state FROM oncewire_replies")
    assert [state for (state,) in replies] == ["delivered"]
    return admitted.inbound.id


def _fragment(url: str) -> str:
    return url + ("&" if "?" in url else "?") + "fragment=1"


def test_every_fragment_answers_with_dead_and_rejected_effects(
    database: RunsDatabase, tmp_path: Path
) -> None:
    inbound = _prepare(database, tmp_path)
    # Each page's address and what its content must show of the store.
    pages = {
        "/": ['data-key="dead-1"', 'data-key="rejected-1"', 'data-label="dead"'],
        "/effects": ['data-key="dead-1"', 'data-key="rejected-1"', 'data-key="done-1"'],
        "/effects?state=dead": ['data-key="dead-1"', "state-dead"],
        "/effects/dead-1": ['id="effect-key">dead-1<', "state-dead"],
        "/effect?key=rejected-1": ['id="effect-key">rejected-1<', "state-rejected"],
        "/chats": [f'data-inbound="{inbound}"', "state-delivered"],
        f"/chats/{inbound}": ['id="reply-state"', "state-delivered", "state-acked"],
        "/receipts": ["no receipts"],
        "/runs": ["no runs"],
        "/lab": ['id="lab-report"'],
    }
    with server(database.url) as ui:
        for path, shown in pages.items():
            whole = fetch(ui.url + path)
            part = fetch(_fragment(ui.url + path))
            assert (whole.status, part.status) == (200, 200), (path, part.text)
            assert 'id="live"' in whole.text and "<html" not in part.text, path
            for text in shown:
                assert text in whole.text and text in part.text, (path, text)


def _opened(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#live-status")


def _refreshed(page: Any, selector: str, script: str | None = None) -> None:
    """Wait until the page shows the change through its refresh, then check every refresh.
    (``script`` is a function: the page's policy forbids evaluating a string as script.)"""
    if script is None:
        page.wait_for_selector(selector, timeout=REFRESHED_MS)
    else:
        page.wait_for_function(script, timeout=REFRESHED_MS)
    assert page.evaluate("window.sameDocument") is True  # refreshed in place, not reloaded
    assert int(page.get_attribute("#live-status", "data-refreshes") or 0) >= 1
    statuses = page.evaluate("window.liveStatuses")
    assert statuses, "the status line never changed"
    assert not [s for s in statuses if "refresh failed" in s], statuses
    assert "refresh failed" not in page.locator("header").inner_text()


def test_each_page_refreshes_its_data_with_dead_and_rejected_effects(
    database: RunsDatabase, tmp_path: Path
) -> None:
    inbound = _prepare(database, tmp_path)
    shots = artifacts(tmp_path, f"refresh-{database.dialect}")
    with server(database.url, *FAST) as ui, browser() as chromium:
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        page.add_init_script(WATCH_STATUS)

        # The overview: an effect accepted after the page loaded is counted.
        _opened(page, ui.url + "/")
        pending = '#effects-by-state g[data-label="pending"]'
        assert page.get_attribute(pending, "data-value") == "0"
        assert page.locator("#attention tr[data-key]").count() == 2
        page.evaluate("window.sameDocument = true")
        with Ledger(database.url) as ledger:
            ledger.accept("new-1", "mail", {})
        _refreshed(
            page,
            pending,
            f"() => document.querySelector('{pending}').getAttribute('data-value') === '1'",
        )
        assert page.locator("#attention tr[data-key]").count() == 2
        page.screenshot(path=str(shots / "overview.png"), full_page=True)

        # The effects list: a new row.
        _opened(page, ui.url + "/effects")
        page.evaluate("window.sameDocument = true")
        with Ledger(database.url) as ledger:
            ledger.accept("new-2", "mail", {})
        _refreshed(page, 'table.effects tr[data-key="new-2"]')
        assert page.locator('table.effects tr[data-key="dead-1"]').count() == 1

        # The dead effect's page (its address as typed) and the rejected one's (as linked from
        # the list): each retried around the page, which then shows it pending.
        for key, opened in (("dead-1", "/effects/dead-1"), ("rejected-1", None)):
            if opened is None:
                _opened(page, ui.url + "/effects")
                page.click(f'table.effects tr[data-key="{key}"] a')
                page.wait_for_selector("#effect-key")
            else:
                _opened(page, ui.url + opened)
            assert page.locator("#effect-key").inner_text() == key
            state = database.query("SELECT state FROM oncewire_effects WHERE key = ?", (key,))
            assert page.locator("#effect-state").inner_text() == state[0][0] != "pending"
            page.evaluate("window.sameDocument = true")
            with Ledger(database.url) as ledger:
                ledger.effects.retry(key)
            _refreshed(
                page,
                "#effect-state",
                "() => document.getElementById('effect-state').textContent === 'pending'",
            )
            page.screenshot(path=str(shots / f"{key}.png"), full_page=True)

        # The chats: a message admitted after the page loaded.
        _opened(page, ui.url + "/chats")
        assert page.locator(f'#inbound tr[data-inbound="{inbound}"]').count() == 1
        page.evaluate("window.sameDocument = true")
        with Ledger(database.url) as ledger:
            later = ledger.inbound.admit("fk_tg", "bot", "c-2", "m-2", {"text": "and another"})
        _refreshed(page, f'#inbound tr[data-inbound="{later.inbound.id}"]')
        page.screenshot(path=str(shots / "chats.png"), full_page=True)


def test_what_is_typed_while_a_refresh_is_on_its_way_stays(tmp_path: Path) -> None:
    """A refresh asked for before a control took the focus is not swapped in when it arrives:
    the kind typed into the filter meanwhile stays, and refreshing resumes once the focus
    leaves. (Regression: the fragment replaced the form, and what was typed, if it arrived
    after the typing began.)"""
    db = str(tmp_path / "typed.db")
    with Ledger(db) as ledger:
        ledger.accept("e-1", "mail", {})
    with server(db, *FAST) as ui, browser() as chromium:
        page = chromium.new_page()
        held: list[Any] = []

        def fragment(url: str) -> bool:
            return url == ui.url + "/effects?fragment=1"

        def hold(route: Any) -> None:  # each refresh waits here until it is let through
            held.append(route)

        page.route(fragment, hold)
        page.goto(ui.url + "/effects")
        for _ in range(400):
            if held:
                break
            page.wait_for_timeout(50)
        assert len(held) == 1, "no refresh was asked for"
        page.fill("#filter input[name=kind]", "typed meanwhile")
        with page.expect_response(lambda response: fragment(response.url)):
            held[0].continue_()
        page.wait_for_timeout(300)  # the answer is in: a swap would have happened by now
        assert page.input_value("#filter input[name=kind]") == "typed meanwhile"
        assert page.get_attribute("#live-status", "data-refreshes") == "0"
        assert len(held) == 1  # and no refresh is asked for while the focus is in the form

        page.unroute(fragment)
        page.evaluate("document.activeElement.blur()")
        page.wait_for_function(
            "() => Number(document.getElementById('live-status').dataset.refreshes) >= 1",
            timeout=REFRESHED_MS,
        )
        assert page.input_value("#filter input[name=kind]") == ""  # the server's content again
