"""Every effect key and run id opens in the dashboard, whatever it looks like as a path.

Regression: an effect's link was ``/effects/KEY`` with the key's slashes left as they were, so
a browser resolved ``a/../b`` to ``/effects/b``, and ``..`` or ``.`` to another page
altogether: such an effect could not be opened (nor retried or cancelled), and run ids the
same. Links now carry the key in the query string (``/effect?key=...``, ``/run?id=...``).
Checked in a headless Chromium against ``oncewire ui`` on a real SQLite file and a real
PostgreSQL schema: each link the lists render is followed, the page must show that very
effect or run, and retry and cancel act on it (read back in the store); typed addresses
``/effects/KEY`` still answer for keys a path can carry.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest

from oncewire import Ledger
from tests.support.runs_db import RunsDatabase
from tests.ui.support import browser, fetch, server

pytestmark = pytest.mark.timeout(300)

PATHLIKE = (
    "a/../b",
    "..",
    ".",
    "../x",
    "a/./b",
    "a/b",
    "a//b",
    "/leading",
    "trailing/",
    "%2F",
    "a%2Fb",
    "%2e%2e",
    "x?y=1#z",
    "retry",
    "x/retry",
    "x/cancel",
    "effects/x",
    "é/ü",
)
CANNOT_BE_A_PATH = {"..", ".", "%2e%2e"}  # a browser resolves these segments away


@pytest.fixture
def database(store_url: str) -> Iterator[RunsDatabase]:
    opened = RunsDatabase(store_url)
    yield opened


def test_every_key_and_run_id_opens(database: RunsDatabase) -> None:
    with Ledger(database.url) as ledger:
        for key in PATHLIKE:
            ledger.accept(key, "mail", {"key": key})
        for i, run_id in enumerate(PATHLIKE[:8]):
            ledger.runs.start(run_id, key="start", scope=f"s{i}", owner="w", lease_seconds=1e6)
    with server(database.url, "--allow-actions") as ui, browser() as chromium:
        page = chromium.new_page()
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(ui.url + "/effects")
        links = {
            row.get_attribute("data-key"): row.locator("a").evaluate("a => a.href")
            for row in page.locator("table.effects tr[data-key]").all()
        }
        assert set(links) == set(PATHLIKE)
        for key, href in links.items():
            response = page.goto(href)
            assert response is not None and response.status == 200, (key, href)
            assert page.locator("#effect-key").inner_text() == key, href
            if key not in CANNOT_BE_A_PATH:  # the address typed by a person
                typed = fetch(f"{ui.url}/effects/{quote(key, safe='')}")
                assert typed.status == 200 and 'id="effect-key"' in typed.text, key

        # Cancel, then retry, each pressed on the page it opened, for the keys that broke;
        # the store says each acted on that effect.
        def stored(key: str) -> tuple[str, str | None]:
            rows = database.query(
                "SELECT state, last_error FROM oncewire_effects WHERE key = ?", (key,)
            )
            return (rows[0][0], rows[0][1])

        for key in ("a/../b", "..", ".", "x/retry"):
            page.goto(links[key])
            with page.expect_navigation():
                page.click("#cancel")
            assert page.locator("#effect-key").inner_text() == key
            assert stored(key) == ("cancelled", "cancelled from the dashboard")
            with page.expect_navigation():
                page.click("#retry")
            assert page.locator("#did").inner_text() == "retry: now pending"
            assert page.locator("#effect-key").inner_text() == key
            assert stored(key)[0] == "pending"
        states = database.query("SELECT state, COUNT(*) FROM oncewire_effects GROUP BY state")
        assert [tuple(r) for r in states] == [("pending", len(PATHLIKE))]

        page.goto(ui.url + "/runs")
        runs = {
            row.get_attribute("data-run"): row.locator("a").evaluate("a => a.href")
            for row in page.locator("#runs tr[data-run]").all()
        }
        assert set(runs) == set(PATHLIKE[:8])
        for run_id, href in runs.items():
            response = page.goto(href)
            assert response is not None and response.status == 200, (run_id, href)
            assert page.locator("h1 code").inner_text() == run_id
            assert page.locator("#verification").get_attribute("data-ok") == "yes"
