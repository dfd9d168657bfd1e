"""Every page of ``oncewire ui`` in a real headless Chromium, against a real SQLite file and a
real PostgreSQL schema prepared through oncewire's engines (see ``tests/ui/support.py``).

The server is a child process (``oncewire ui --port 0``). What each page shows is compared
with rows read around oncewire, through the plain drivers. Screenshots of every page are kept
in ``$ONCEWIRE_ARTIFACTS/ui/pages-<backend>/`` when ONCEWIRE_ARTIFACTS is set, otherwise in
this test's ``tmp_path/screenshots`` (pytest keeps the newest three runs' tmp_path).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.runs_db import RunsDatabase
from tests.ui.support import FAST, artifacts, browser, prepare, server

pytestmark = pytest.mark.timeout(400)


@pytest.fixture
def database(store_url: str) -> Iterator[RunsDatabase]:
    opened = RunsDatabase(store_url)
    yield opened


def _cells(page: Any, selector: str) -> list[str]:
    return [text.strip() for text in page.locator(selector).all_inner_texts()]


def test_each_page_shows_the_store(database: RunsDatabase, tmp_path: Path) -> None:
    prepared = prepare(database, tmp_path)
    shots = artifacts(tmp_path, f"pages-{database.dialect}")
    states = dict(
        (str(s), int(n))
        for s, n in database.query("SELECT state, COUNT(*) FROM oncewire_effects GROUP BY state")
    )
    assert states == {"done": 4, "rejected": 1, "dead": 1, "pending": 2}  # the preparation

    with server(database.url) as ui, browser() as chromium:
        page = chromium.new_page(viewport={"width": 1280, "height": 900})

        # Overview: every state's bar carries the store's count; the waiting kind, the
        # operator's effects, runs by status and the undelivered reply are listed.
        page.goto(ui.url + "/")
        bars = page.locator("#effects-by-state svg g[data-label]")
        shown = {
            g.get_attribute("data-label"): int(g.get_attribute("data-value") or -1)
            for g in bars.all()
        }
        assert {k: v for k, v in shown.items() if v} == states
        assert set(shown) == {
            "pending", "claimed", "uncertain", "done", "rejected", "dead", "cancelled"
        }  # fmt: skip
        assert _cells(page, "#waiting tr[data-kind] td:first-child") == ["later"]
        assert page.locator("#waiting tr[data-kind] td").nth(1).inner_text() == "2"
        attention = page.locator("#attention tr[data-key]")
        assert sorted(a.get_attribute("data-key") or "" for a in attention.all()) == [
            "doomed-1",
            "refuse-1",
        ]
        attempts = database.query(
            "SELECT COUNT(*), SUM(CASE WHEN redelivery THEN 1 ELSE 0 END) FROM oncewire_attempts"
        )[0]
        totals = json.loads(page.get_attribute("#attempts svg", "data-totals") or "{}")
        assert totals == {"first deliveries": attempts[0] - attempts[1], "redeliveries": 1}
        assert attempts[1] == 1  # flaky-1's second attempt
        runs = dict(database.query("SELECT status, COUNT(*) FROM oncewire_runs GROUP BY status"))
        assert {
            (r.get_attribute("data-status"), int(r.locator("td").nth(1).inner_text()))
            for r in page.locator("#runs-by-status tr[data-status]").all()
        } == set(runs.items())
        undelivered = page.locator("#undelivered tr[data-reply] td:nth-child(2)")
        assert undelivered.all_inner_texts() == [str(prepared.undelivered_inbound)]
        page.screenshot(path=str(shots / "overview.png"), full_page=True)

        # Effects: filtered by state, then one effect's attempt history with its redelivery.
        page.goto(ui.url + "/effects?state=done")
        assert sorted(_cells(page, "table.effects tr[data-key] td:nth-child(2)")) == [
            "flaky-1", "mail-0", "mail-1", "mail-2"
        ]  # fmt: skip
        assert "showing 4 of 4" in page.locator("#showing").inner_text()
        page.goto(ui.url + "/effects?kind=later")
        assert sorted(_cells(page, "table.effects tr[data-key] td:nth-child(2)")) == [
            "later-1",
            "later-2",
        ]
        page.goto(ui.url + "/effects")
        page.screenshot(path=str(shots / "effects.png"), full_page=True)
        page.click("text=flaky-1")
        page.wait_for_url("**/effect?key=flaky-1")
        stored = database.query(
            "SELECT a.outcome, a.redelivery FROM oncewire_attempts a "
            "JOIN oncewire_effects e ON e.id = a.effect_id WHERE e.key = ? ORDER BY a.fence",
            ("flaky-1",),
        )
        rows = page.locator("#attempts tr[data-outcome]")
        assert (
            [
                (r.get_attribute("data-outcome"), r.get_attribute("data-redelivery") == "yes")
                for r in rows.all()
            ]
            == [(o, bool(d)) for o, d in stored]
            == [("maybe_sent", False), ("done", True)]
        )
        assert page.locator("#effect-state").inner_text() == "done"
        assert page.locator("#actions").count() == 0  # read-only: no action is offered
        page.screenshot(path=str(shots / "effect.png"), full_page=True)

        page.goto(ui.url + "/receipts")
        assert _cells(page, "#receipts tr[data-key] td:first-child") == [
            k for (k,) in database.query("SELECT key FROM oncewire_receipts ORDER BY key")
        ]
        page.screenshot(path=str(shots / "receipts.png"), full_page=True)

        # Chats: the inbound messages and the ambiguous send followed by the marked copy.
        page.goto(ui.url + "/chats")
        inbound = database.query("SELECT id, status FROM oncewire_inbound ORDER BY id")
        assert [
            (int(r.get_attribute("data-inbound") or -1), r.locator("td").nth(5).inner_text())
            for r in page.locator("#inbound tr[data-inbound]").all()
        ] == [(int(i), str(s)) for i, s in inbound]
        page.screenshot(path=str(shots / "chats.png"), full_page=True)
        page.goto(f"{ui.url}/chats/{prepared.acked_chat_inbound}")
        ops = database.query(
            "SELECT o.kind, o.state, o.marked FROM oncewire_reply_ops o "
            "JOIN oncewire_replies r ON r.id = o.reply_id WHERE r.inbound_id = ? ORDER BY o.seq",
            (prepared.acked_chat_inbound,),
        )
        assert [
            (
                r.get_attribute("data-kind"),
                r.get_attribute("data-state"),
                r.get_attribute("data-marked") == "yes",
            )
            for r in page.locator("#ops tr[data-kind]").all()
        ] == [(k, s, bool(m)) for k, s, m in ops]
        assert [(k, s, bool(m)) for k, s, m in ops] == [
            ("send", "ambiguous", False),
            ("send", "acked", True),
        ]
        assert page.locator("#ops-chart svg circle").count() == len(ops)
        page.screenshot(path=str(shots / "chat.png"), full_page=True)

        # Runs: the list, a verified run with its checkpoint and fork, a reconciled run.
        page.goto(ui.url + "/runs")
        assert _cells(page, "#runs tr[data-run] td:first-child") == ["run-a", "run-b"]
        page.screenshot(path=str(shots / "runs.png"), full_page=True)
        page.goto(ui.url + "/runs/run-b")
        assert page.locator("#verification").get_attribute("data-ok") == "yes"
        assert _cells(page, "#events tr[data-type] td:nth-child(3)") == [
            t for (t,) in database.query(
                "SELECT type FROM oncewire_run_events WHERE run_id = ? ORDER BY seq", ("run-b",)
            )
        ]  # fmt: skip
        assert _cells(page, "#checkpoints tr[data-checkpoint] td:first-child") == ["cp-b1"]
        assert [
            (r.get_attribute("data-branch"), r.locator("td").nth(1).inner_text())
            for r in page.locator("#branches tr[data-branch]").all()
        ] == [(b, p or "") for b, p in database.query(
            "SELECT branch, parent FROM oncewire_run_branches WHERE scope = ? ORDER BY created_at",
            ("scope-b",),
        )]  # fmt: skip
        page.screenshot(path=str(shots / "run.png"), full_page=True)
        page.goto(ui.url + "/runs/run-a")
        reports = database.query(
            "SELECT outcome FROM oncewire_run_reports WHERE subject_id = ?", ("run-a",)
        )
        assert [r.get_attribute("data-outcome") for r in page.locator("#reports tr").all()[1:]] == [
            o for (o,) in reports
        ] and reports
        assert (
            page.locator("#run-status").inner_text()
            == database.query("SELECT status FROM oncewire_runs WHERE run_id = ?", ("run-a",))[0][0]
        )

        # A page that does not exist says so.
        response = page.goto(ui.url + "/effects/no-such-key")
        assert response is not None and response.status == 404
        assert "no effect with key 'no-such-key'" in page.locator("#refusal").inner_text()
    pages = ("overview", "effects", "effect", "receipts", "chats", "chat", "runs", "run")
    assert sorted(p.name for p in shots.iterdir()) == sorted(f"{n}.png" for n in pages)


def test_pages_refresh_in_place(tmp_path: Path) -> None:
    """The overview shows an effect accepted after it loaded, without a reload: the page's
    script fetches its content again (a marker set on the window survives, so the document
    was not reloaded)."""
    from oncewire import Ledger

    db = str(tmp_path / "live.db")
    with Ledger(db) as ledger:
        ledger.accept("first", "mail", {})
    with server(db, *FAST) as ui, browser() as chromium:
        page = chromium.new_page()
        page.goto(ui.url + "/")
        pending = '#effects-by-state g[data-label="pending"]'
        assert page.get_attribute(pending, "data-value") == "1"
        page.evaluate("window.sameDocument = true")
        with Ledger(db) as ledger:
            ledger.accept("second", "mail", {})
            ledger.accept("third", "mail", {})
        page.wait_for_function(
            f"() => document.querySelector('{pending}').getAttribute('data-value') === '3'",
            timeout=20_000,
        )
        assert page.evaluate("window.sameDocument") is True
        assert int(page.get_attribute("#live-status", "data-refreshes") or 0) >= 1
        page.screenshot(path=str(artifacts(tmp_path, "live") / "overview-refreshed.png"))


def test_effects_page_and_a_run_that_fails_verification(
    database: RunsDatabase, tmp_path: Path
) -> None:
    """Paging follows the cursor of the last effect shown, newest first, with no effect twice
    or missed; a run whose history was edited around oncewire is shown as failing
    verification at its first bad event, whatever status the store claims."""
    from oncewire import Ledger

    with Ledger(database.url) as ledger:
        for i in range(120):
            ledger.accept(f"e-{i:03d}", "mail", {"i": i})
        ledger.runs.start("run-t", key="start", scope="scope-t", owner="w", lease_seconds=1e6)
    database.tamper(
        ("UPDATE oncewire_run_events SET payload = replace(payload, '\"w\"', '\"x\"')", ())
    )
    shots = artifacts(tmp_path, f"paging-{database.dialect}")
    with server(database.url) as ui, browser() as chromium:
        page = chromium.new_page()
        page.goto(ui.url + "/effects?kind=mail")
        seen: list[str] = []
        for number in range(1, 4):
            keys = _cells(page, "table.effects tr[data-key] td:nth-child(2)")
            assert "of 120" in page.locator("#showing").inner_text()
            seen += keys
            page.screenshot(path=str(shots / f"page-{number}.png"))
            if page.locator("#next-page").count() == 0:
                break
            page.click("#next-page")
            page.wait_for_load_state()
        assert len(seen) == len(set(seen)) == 120
        assert seen == [f"e-{i:03d}" for i in reversed(range(120))]

        page.goto(ui.url + "/runs/run-t")
        verdict = page.locator("#verification")
        assert verdict.get_attribute("data-ok") == "no"
        assert "FAILED verification at event 1" in verdict.inner_text()
        page.screenshot(path=str(shots / "tampered-run.png"), full_page=True)


def test_keyed_runs_without_the_key_leave_the_rest_of_the_overview(tmp_path: Path) -> None:
    from oncewire import Ledger

    db = str(tmp_path / "keyed.db")
    with Ledger(db, runs_key=b"k" * 32) as ledger:
        ledger.runs.start("run-k", key="start", scope="s", owner="w", lease_seconds=1e6)
        ledger.accept("e1", "mail", {})
    with server(db) as ui, browser() as chromium:
        page = chromium.new_page()
        page.goto(ui.url + "/")
        assert page.get_attribute('#effects-by-state g[data-label="pending"]', "data-value") == "1"
        assert "--key-env" in page.locator("#runs-error").inner_text()
        response = page.goto(ui.url + "/runs/run-k")
        assert response is not None and response.status == 409
        assert "configuration_error" in page.locator("#refusal").inner_text()
    with server(db, env={"ONCEWIRE_RUNS_KEY": "k" * 32}) as ui, browser() as chromium:
        page = chromium.new_page()
        page.goto(ui.url + "/runs/run-k")
        assert page.locator("#verification").get_attribute("data-ok") == "yes"
