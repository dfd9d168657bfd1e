"""Who may read the dashboard and who may act through it, in a real headless Chromium against
``oncewire ui`` child processes, on a real SQLite file and a real PostgreSQL schema.

Retry and cancel are refused without ``--allow-actions``, and with it without the page's CSRF
token or from another origin; each refusal is checked against the store (state, attempts and
``updated_at`` read around oncewire are unchanged). Beyond loopback the server refuses to start
without a token; with one, nothing is shown without it. Screenshots are kept in
``$ONCEWIRE_ARTIFACTS/ui/<test>/`` when ONCEWIRE_ARTIFACTS is set, otherwise in the test's
``tmp_path/screenshots``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from tests.support.runs_db import RunsDatabase
from tests.ui.support import ONCEWIRE, artifacts, browser, server

pytestmark = pytest.mark.timeout(300)

TOKEN = "s3cret-token-for-the-dashboard"


@pytest.fixture
def database(store_url: str) -> Iterator[RunsDatabase]:
    opened = RunsDatabase(store_url)
    with Ledger(opened.url) as ledger:
        ledger.accept("stopped", "mail", {"n": 1})
        ledger.effects.cancel("stopped", "held by the operator")
        ledger.accept("waiting", "mail", {"n": 2})
    yield opened


def _row(database: RunsDatabase, key: str) -> tuple[Any, ...]:
    rows = database.query(
        "SELECT state, attempts, last_error, updated_at FROM oncewire_effects WHERE key = ?",
        (key,),
    )
    assert len(rows) == 1
    return tuple(rows[0])


def _post(page: Any, path: str, body: str) -> tuple[int, str]:
    """POST a form from inside the page (same origin, with the page's cookies)."""
    result = page.evaluate(
        """async ([path, body]) => {
            const r = await fetch(path, {method: "POST", body: body,
                headers: {"Content-Type": "application/x-www-form-urlencoded"}});
            return [r.status, await r.text()];
        }""",
        [path, body],
    )
    return int(result[0]), str(result[1])


def test_actions_are_refused_without_the_flag(database: RunsDatabase, tmp_path: Path) -> None:
    before = {key: _row(database, key) for key in ("stopped", "waiting")}
    with server(database.url) as ui, browser() as chromium:
        page = chromium.new_page()
        page.goto(ui.url + "/effects/stopped")
        assert page.locator("#actions").count() == 0
        assert "read-only" in page.locator("header").inner_text()
        for path, key in (("/effect/retry", "stopped"), ("/effect/cancel", "waiting")):
            status, text = _post(page, path, f"csrf=anything&key={key}&reason=x")
            assert status == 403 and "actions are off" in text
        page.screenshot(path=str(artifacts(tmp_path, "read-only") / "effect.png"))
    assert {key: _row(database, key) for key in before} == before


def test_actions_need_the_csrf_token_and_this_origin(
    database: RunsDatabase, tmp_path: Path
) -> None:
    before = {key: _row(database, key) for key in ("stopped", "waiting")}
    shots = artifacts(tmp_path, f"actions-{database.dialect}")
    with server(database.url, "--allow-actions") as ui, browser() as chromium:
        page = chromium.new_page()
        page.goto(ui.url + "/effects/stopped")
        csrf = page.get_attribute("#actions input[name=csrf]", "value")
        assert csrf
        for body in ("key=stopped", "csrf=&key=stopped", "csrf=wrong-token&key=stopped"):
            status, text = _post(page, "/effect/retry", body)
            assert status == 403 and "CSRF" in text
        # The right token from another origin (a page elsewhere that learned it) is refused.
        foreign = page.request.post(
            ui.url + "/effect/retry",
            headers={"Origin": "http://elsewhere.example", "Content-Type": "text/plain"},
            data=f"csrf={csrf}&key=stopped",
        )
        assert foreign.status == 403 and "another origin" in foreign.text()
        assert {key: _row(database, key) for key in before} == before

        # The page's own button, confirmed: back to pending, through the outbox's retry.
        page.on("dialog", lambda dialog: dialog.accept())
        page.click("#retry")
        page.wait_for_url("**/effect?key=stopped&did=*")
        assert "retry: now pending" in page.locator("#did").inner_text()
        assert _row(database, "stopped")[:2] == ("pending", 0)
        page.screenshot(path=str(shots / "retried.png"))

        page.goto(ui.url + "/effects/waiting")
        page.fill("#actions input[name=reason]", "not needed any more")
        page.click("#cancel")
        page.wait_for_url("**/effect?key=waiting&did=*")
        state, _, last_error, _ = _row(database, "waiting")
        assert (state, last_error) == ("cancelled", "not needed any more")
        assert page.locator("#effect-state").inner_text() == "cancelled"
        page.screenshot(path=str(shots / "cancelled.png"))

        # A done effect offers nothing, and retrying it anyway is refused by the outbox.
        with Ledger(database.url) as ledger:
            ledger.accept("finished", "mail", {})
        database.execute(
            ("UPDATE oncewire_effects SET state = 'done' WHERE key = ?", ("finished",))
        )
        finished = _row(database, "finished")
        page.goto(ui.url + "/effects/finished")
        assert "no action applies" in page.locator("#actions").inner_text()
        status, text = _post(page, "/effect/retry", f"csrf={csrf}&key=finished")
        assert status == 409 and "invalid_state" in text
        assert _row(database, "finished") == finished


def test_a_token_guards_every_page(tmp_path: Path) -> None:
    db = str(tmp_path / "guarded.db")
    with Ledger(db) as ledger:
        ledger.accept("k1", "mail", {})
    with server(db, "--token", TOKEN) as ui, browser() as chromium:
        context = chromium.new_context()
        page = context.new_page()
        response = page.goto(ui.url + "/effects")
        assert response is not None and response.status == 401
        assert "needs its token" in page.locator("#refusal").inner_text()
        assert "k1" not in page.content()
        page.screenshot(path=str(artifacts(tmp_path, "token") / "refused.png"))

        wrong = page.goto(ui.url + "/effects?token=not-the-token-at-all")
        assert wrong is not None and wrong.status == 401

        page.goto(f"{ui.url}/effects?token={TOKEN}")
        assert page.url == ui.url + "/effects"  # the token left the address bar
        assert page.locator("tr[data-key=k1]").count() == 1
        assert [c["name"] for c in context.cookies()] == ["oncewire_ui_token"]

        api = chromium.new_context().request
        assert api.get(ui.url + "/effects").status == 401
        bearer = api.get(ui.url + "/effects", headers={"Authorization": f"Bearer {TOKEN}"})
        assert bearer.status == 200 and "k1" in bearer.text()


def test_a_loopback_server_answers_only_loopback_host_names(tmp_path: Path) -> None:
    db = str(tmp_path / "host.db")
    Ledger(db).close()
    with server(db) as ui, browser() as chromium:
        api = chromium.new_context().request
        assert api.get(ui.url + "/").status == 200
        rebound = api.get(ui.url + "/", headers={"Host": "attacker.example"})
        assert rebound.status == 403 and "loopback host names" in rebound.text()


def _start(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ONCEWIRE, "ui", *args], capture_output=True, text=True, timeout=60, env={"PATH": ""}
    )


def test_the_server_refuses_to_start_exposed(tmp_path: Path) -> None:
    db = str(tmp_path / "exposed.db")
    Ledger(db).close()
    exposed = _start("--db", db, "--host", "0.0.0.0", "--port", "0")
    assert exposed.returncode == 1 and exposed.stdout == ""
    assert "refusing to listen on 0.0.0.0 without --token" in exposed.stderr
    short = _start("--db", db, "--token", "short", "--port", "0")
    assert short.returncode == 1 and "at least 16 characters" in short.stderr
    missing = _start("--db", db, "--port", "0", "--evidence", str(tmp_path / "none.json"))
    assert missing.returncode == 1 and "cannot read" in missing.stderr


def test_without_the_extra_it_names_the_extra(tmp_path: Path) -> None:
    db = str(tmp_path / "noextra.db")
    Ledger(db).close()
    code = (
        "import sys; sys.modules['jinja2'] = None\n"
        "from oncewire.cli import main\n"
        f"sys.exit(main(['ui', '--db', {db!r}, '--port', '0']))\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 1 and ran.stdout == ""
    assert ran.stderr == (
        "error: oncewire ui needs the 'ui' extra: pip install 'oncewire[ui]' "
        "(jinja2 not installed) [missing_extra]\n"
    )
