"""Hostile stored values in a headless Chromium: nothing they say ever runs in the dashboard.

Keys, kinds, payloads, results, errors, receipts, chat ids and text, replies, run ids, scopes,
owners, checkpoints, branches and a lab evidence file are stored through oncewire's own APIs
(a real dispatcher, reply engine and run ledger) into a real SQLite file and a real PostgreSQL
schema, with values made to break out of HTML, attributes and script strings. The browser then
opens every page, waits for a live refresh on the lists (the server refreshes every 0.2 s here,
so each wait is short), opens every effect, chat and run from
the link its list renders, and presses every action (retry and cancel: dismissed first, which
must change nothing, then confirmed, which must change exactly that effect, read back in the
store), the filters, the pause switch and the lab's file picker.

Regression: an effect's page put the key inside a JavaScript string in an ``onsubmit``
attribute, so a key with ``'`` ran script in the dashboard's origin when retry or cancel was
pressed (and the form was submitted even when the confirmation was dismissed); keys such as
``a/../b`` or ``..`` could not be opened at all.

Throughout, the test asserts: no dialog opened but the app's own confirmation, word for word;
no payload's flag (``window.pwned``) is set; the browser reported no Content-Security-Policy
violation; and every request the page made went to the dashboard's own origin and to a path
it meant (its pages, its fragments, its static files, its two actions, the lab's renderer).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from oncewire import Ledger, Receipts
from oncewire.dispatch.dispatcher import Dispatcher
from oncewire.dispatch.retry import RetryPolicy
from oncewire.effects.outcomes import Done, MaybeSent, Rejected
from oncewire.lab.suites.replies_rig import BOT, Rig
from tests.support.runs_db import RunsDatabase
from tests.ui.support import FAST, artifacts, browser, server

pytestmark = pytest.mark.timeout(600)

FLAG = "window.pwned=1"
HOSTILE = (
    "'</script><img src=x onerror=alert(1)>",
    '";alert(1);//',
    "'+(window.pwned=1)+'",
    "'-alert(1)-'",
    f"');{FLAG};//",
    f"javascript:{FLAG}",
    f'"><svg onload="{FLAG}">',
    f"<script>{FLAG}</script>",
    f"' onmouseover='{FLAG}' x='",
    "{{ 7*7 }} ${7*7} <b>bold</b> &amp; &lt;",
    "a/../b",
    "..",
    ".",
    "a/b",
    "%2F",
    "x?y=1&z=2#frag",
    "line\u2028break\u2029end",
)
REJECT = "kind'</script><img src=x onerror=alert(1)>"
DOOM = 'kind";alert(1);//'
DONE = f"javascript:{FLAG}"
WAIT = f"<img src=x onerror={FLAG}>"
REASON = f"</textarea>'\"><img src=x onerror={FLAG}>"
CHATS = HOSTILE[:4]
RUNS = (*HOSTILE[:3], "a/../b", "..", "a/b")
CONFIRM = {"retry": "Retry {}?", "cancel": "Cancel {}? An attempt in flight may still land."}

# The pages the dashboard links to, and what each may carry in its query string.
PAGES = {
    "/": set(),
    "/effects": {"state", "kind", "after"},
    "/effect": {"key", "did"},
    "/receipts": {"after"},
    "/chats": {"after"},
    "/runs": {"status", "after"},
    "/run": {"id"},
    "/lab": set(),
}
STATIC = {
    "script": {"/static/dashboard.js"},
    "stylesheet": {"/static/dashboard.css", "/static/lab.css"},
    "other": {"/static/favicon.svg"},  # the icon, fetched by the browser itself
}
WATCH = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.cspViolations.push(e.violatedDirective + " " + e.blockedURI);
});
"""


@pytest.fixture
def database(store_url: str) -> Iterator[RunsDatabase]:
    opened = RunsDatabase(store_url)
    yield opened


def _store_hostile(database: RunsDatabase, folder: Path) -> None:
    """Every kind of value the pages show, hostile, stored the way an application stores it."""
    url = database.url
    with Ledger(url) as ledger:
        for i, text in enumerate(HOSTILE):
            kind = (REJECT, DOOM, DONE)[i % 3]
            ledger.accept(
                text, kind, {"text": text, text: [text, {"deeper": text}]}, max_attempts=1
            )
        sinks = {
            REJECT: lambda attempt: Rejected(attempt.key),
            DOOM: lambda attempt: MaybeSent(attempt.key),
            DONE: lambda attempt: Done({"echo": attempt.key, attempt.key: attempt.key}),
        }
        Dispatcher(ledger, sinks, retry=RetryPolicy(base_seconds=0.01, jitter=0.0)).run(
            until_idle=True, handle_signals=False
        )
        for text in HOSTILE[:4]:
            ledger.accept(f"wait {text}", WAIT, {"text": text})  # pending: cancel is offered
        for i, run_id in enumerate(RUNS):
            scope = f"scope {i} {run_id}"
            ledger.runs.start(
                run_id,
                key="start",
                scope=scope,
                params={"note": run_id},
                owner=f"owner {run_id}",
                lease_seconds=1e6,
            )
            ledger.runs.checkpoint(f"cp {run_id}", scope=scope, reason=run_id)
            ledger.runs.fork(scope=scope, checkpoint_id=f"cp {run_id}", branch=f"fork {run_id}")
    with Receipts(url) as receipts:
        for text in HOSTILE[:5]:
            receipts.run_once(text, {"text": text}, lambda tx, text=text: {"echo": text})
    with Rig(folder / "rig", db=url) as rig:
        for text in CHATS:
            admitted = rig.ledger.inbound.admit("fk_tg", BOT, text, text, {"text": text})
            rig.answer(admitted.inbound.id, f"answer {text}", "off")


class Audit:
    """What the page did, and the checks on it: dialogs, requests, console, violations."""

    def __init__(self, page: Any, origin: str, database: RunsDatabase) -> None:
        self.page = page
        self.origin = origin
        self.database = database
        self.requests: list[tuple[str, str, str, str]] = []
        self.dialogs: list[tuple[str, str]] = []
        self.unexpected: list[tuple[str, str]] = []
        self.expected: list[tuple[str, bool]] = []
        self.console: list[str] = []
        page.on("request", self._request)
        page.on("dialog", self._dialog)
        page.on("console", lambda message: self.console.append(message.text))
        page.add_init_script(WATCH)

    def _request(self, request: Any) -> None:
        entry = (request.method, request.url, request.resource_type, request.post_data or "")
        self.requests.append(entry)

    def _dialog(self, dialog: Any) -> None:
        seen = (dialog.type, dialog.message)
        self.dialogs.append(seen)
        wanted = self.expected.pop(0) if self.expected else None
        if wanted is None or seen != ("confirm", wanted[0]):
            self.unexpected.append(seen)
            dialog.dismiss()
        elif wanted[1]:
            dialog.accept()
        else:
            dialog.dismiss()

    def expect(self, message: str, *, accept: bool) -> None:
        self.expected.append((message, accept))

    def meant(self, request: tuple[str, str, str, str], keys: set[str]) -> bool:
        """Whether the dashboard means its page to make this request (``keys``: the effects'
        keys in the store, the only ones an effect's page is opened with)."""
        method, url, kind, body = request
        parts = urlsplit(url)
        if f"{parts.scheme}://{parts.netloc}" != self.origin:
            return False
        query = parse_qs(parts.query, keep_blank_values=True)
        if kind in STATIC:
            return method == "GET" and parts.path in STATIC[kind] and not parts.query
        if method == "POST":
            if kind == "document" and parts.path in ("/effect/retry", "/effect/cancel"):
                form = parse_qs(body, keep_blank_values=True)
                return not parts.query and set(form) <= {"csrf", "key", "reason"}
            return kind == "fetch" and parts.path == "/lab/render"
        chat = re.fullmatch(r"/chats/\d+", parts.path) is not None
        if method != "GET" or (parts.path not in PAGES and not chat):
            return False
        allowed = set() if chat else set(PAGES[parts.path])
        if kind == "fetch":  # the live refresh: the page's own address, as a fragment
            if query.pop("fragment", None) != ["1"]:
                return False
        elif kind != "document":
            return False
        if parts.path == "/effect":
            return query.get("key", [""])[0] in keys and set(query) <= allowed
        if parts.path == "/run":
            return query.get("id", [""])[0] in RUNS and set(query) <= allowed
        return set(query) <= allowed

    def stored_keys(self) -> set[str]:
        return {k for (k,) in self.database.query("SELECT key FROM oncewire_effects")}

    def check(self) -> None:
        """Nothing ran, nothing was refused by the policy, nothing unmeant was requested."""
        assert self.page.evaluate("window.pwned") is None
        assert self.page.evaluate("window.cspViolations") == []
        refused = [m for m in self.console if "Refused" in m or "Security Policy" in m]
        assert refused == []
        assert self.unexpected == [] and self.expected == []
        keys = self.stored_keys()  # read once: every request so far is judged against it
        unmeant = [r for r in self.requests if not self.meant(r, keys)]
        assert unmeant == []

    def visit(self, path: str) -> None:
        response = self.page.goto(self.origin + path)
        assert response is not None and response.status == 200, path
        self.check()

    def refreshed(self) -> None:
        """Wait for the page's next live refresh (one that succeeded), then check."""
        before = int(self.page.get_attribute("#live-status", "data-refreshes") or 0)
        self.page.wait_for_function(
            f"() => Number(document.getElementById('live-status').dataset.refreshes) > {before}",
            timeout=20_000,
        )
        assert "refresh failed" not in self.page.locator("#live-status").inner_text()
        self.check()

    def posts(self, verb: str, key: str) -> int:
        return sum(
            1
            for method, url, _, body in self.requests
            if method == "POST"
            and urlsplit(url).path == f"/effect/{verb}"
            and parse_qs(body).get("key") == [key]
        )


def _effect(database: RunsDatabase, key: str) -> tuple[Any, ...]:
    rows = database.query(
        "SELECT state, attempts, last_error, updated_at FROM oncewire_effects WHERE key = ?",
        (key,),
    )
    assert len(rows) == 1
    return tuple(rows[0])


def _act(audit: Audit, key: str, verb: str, *, wait_refresh: bool) -> None:
    """Press the action: dismissed first (nothing sent, nothing changed), then confirmed."""
    page, database = audit.page, audit.database
    message = CONFIRM[verb].format(key)
    before, url = _effect(database, key), page.url
    if verb == "cancel":
        page.fill("#actions input[name=reason]", REASON)
    audit.expect(message, accept=False)
    page.click(f"#{verb}")
    assert audit.expected == [] and audit.dialogs[-1] == ("confirm", message)
    if wait_refresh:  # proof the page stayed: it refreshes in place once the focus leaves
        page.evaluate("document.activeElement.blur()")
        audit.refreshed()
    assert page.url == url and audit.posts(verb, key) == 0
    assert _effect(database, key) == before
    if verb == "cancel":
        page.fill("#actions input[name=reason]", REASON)
    audit.expect(message, accept=True)
    with page.expect_navigation():
        page.click(f"#{verb}")
    assert audit.posts(verb, key) == 1
    assert parse_qs(urlsplit(page.url).query)["key"] == [key]
    state, _, last_error, _ = _effect(database, key)
    assert page.locator("#did").inner_text() == f"{verb}: now {state}"
    assert page.locator("#effect-state").inner_text() == state
    if verb == "retry":
        assert state == "pending"
    else:
        assert (state, last_error) == ("cancelled", REASON)
    audit.check()


def _evidence(folder: Path) -> Path:
    text = HOSTILE[0]
    evidence = {
        "passed": False,
        "backend": text,
        "seed": text,
        "duration_seconds": 1.0,
        "options": {"note": text},
        "suites": {
            text: {
                "passed": False,
                "description": text,
                "key_numbers": ["n"],
                "scenarios": {
                    text: {
                        "name": text,
                        "passed": False,
                        "duration_seconds": 0.5,
                        "summary": {"n": text},
                        "failures": [text],
                        "processes": [{"role": text, "pid": text, "armed": text, "exit_code": -9}],
                    }
                },
            }
        },
    }
    path = folder / "ev'\"><img src=x onerror=alert(1)>.json"
    path.write_text(json.dumps(evidence), encoding="utf-8")
    return path


def test_hostile_values_never_run_in_the_dashboard(database: RunsDatabase, tmp_path: Path) -> None:
    _store_hostile(database, tmp_path)
    keys = sorted(k for (k,) in database.query("SELECT key FROM oncewire_effects"))
    assert len(keys) == len(HOSTILE) + 4
    shots = artifacts(tmp_path, f"hostile-{database.dialect}")
    with server(database.url, "--allow-actions", *FAST) as ui, browser() as chromium:
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        audit = Audit(page, ui.url, database)

        audit.visit("/")
        audit.refreshed()
        attention = database.query(
            "SELECT key FROM oncewire_effects WHERE state IN ('dead', 'rejected')"
        )
        shown = [r.get_attribute("data-key") for r in page.locator("#attention tr[data-key]").all()]
        assert sorted(shown) == sorted(k for (k,) in attention) and shown
        page.screenshot(path=str(shots / "overview.png"), full_page=True)

        audit.visit("/effects")
        audit.refreshed()
        rows = page.locator("table.effects tr[data-key]")
        listed = [r.get_attribute("data-key") for r in rows.all()]
        assert sorted(listed) == keys
        page.click("#live-pause")  # the pause switch: checked, and nothing else happens
        assert page.is_checked("#live-pause")
        page.click("#live-pause")
        audit.check()
        page.screenshot(path=str(shots / "effects.png"), full_page=True)

        # The filter form, with a hostile kind typed in. The kind first: typing keeps the focus
        # in the form, so no refresh replaces it before it is sent (choosing an option through
        # Playwright does not take the focus, as a person's click would).
        page.fill("#filter input[name=kind]", REJECT)
        page.select_option("#filter select[name=state]", "rejected")
        with page.expect_navigation():
            page.click("#filter button")
        filtered = database.query(
            "SELECT key FROM oncewire_effects WHERE state = 'rejected' AND kind = ?", (REJECT,)
        )
        assert (
            sorted(
                r.get_attribute("data-key")
                for r in page.locator("table.effects tr[data-key]").all()
            )
            == sorted(k for (k,) in filtered)
            and filtered
        )
        audit.check()

        # Every effect, opened from its link in the list, and its action.
        acted = set()
        for key in keys:
            audit.visit("/effects")
            row = page.locator("table.effects tr[data-key]").nth(listed.index(key))
            assert row.get_attribute("data-key") == key
            with page.expect_navigation():
                row.locator("a").click()
            assert page.locator("#effect-key").inner_text() == key
            assert parse_qs(urlsplit(page.url).query)["key"] == [key]
            stored = database.query("SELECT payload FROM oncewire_effects WHERE key = ?", (key,))
            assert json.loads(page.locator("#payload").inner_text()) == json.loads(stored[0][0])
            audit.check()
            state = _effect(database, key)[0]
            verb = {"dead": "retry", "rejected": "retry", "pending": "cancel"}.get(state)
            if verb is None:
                assert state == "done"
                assert "no action applies" in page.locator("#actions").inner_text()
                continue
            _act(audit, key, verb, wait_refresh=verb not in acted)
            acted.add(verb)
        assert acted == {"retry", "cancel"}
        page.screenshot(path=str(shots / "effect.png"), full_page=True)

        audit.visit("/receipts")
        audit.refreshed()
        assert sorted(
            r.get_attribute("data-key") for r in page.locator("#receipts tr[data-key]").all()
        ) == sorted(k for (k,) in database.query("SELECT key FROM oncewire_receipts"))

        audit.visit("/chats")
        audit.refreshed()
        inbound = database.query("SELECT id, chat FROM oncewire_inbound ORDER BY id")
        assert [c for _, c in inbound] == list(CHATS)
        for number, (inbound_id, chat) in enumerate(inbound):
            audit.visit("/chats")
            with page.expect_navigation():
                page.locator("#inbound tr[data-inbound] a").nth(number).click()
            assert urlsplit(page.url).path == f"/chats/{inbound_id}"
            assert chat in page.locator("h1").inner_text()
            assert page.locator("#reply td").last.inner_text() == f"answer {chat}"
            audit.check()
        page.screenshot(path=str(shots / "chat.png"), full_page=True)

        audit.visit("/runs")
        audit.refreshed()
        stored_runs = [r for (r,) in database.query("SELECT run_id FROM oncewire_runs")]
        assert sorted(stored_runs) == sorted(RUNS)
        for number in range(len(RUNS)):
            audit.visit("/runs")
            link = page.locator("#runs tr[data-run]").nth(number)
            run_id = link.get_attribute("data-run")
            with page.expect_navigation():
                link.locator("a").click()
            assert page.locator("h1 code").inner_text() == run_id
            assert page.locator("#verification").get_attribute("data-ok") == "yes"
            assert page.locator("#branches tr[data-branch]").count() == 2  # the scope and its fork
            audit.check()
        page.screenshot(path=str(shots / "run.png"), full_page=True)
        audit.visit("/runs")
        page.fill("form input[name=status]", HOSTILE[0])
        with page.expect_navigation():
            page.click("form button")
        assert "no runs" in page.locator("#live").inner_text()
        audit.check()

        # The lab: a hostile evidence file (its name too), opened through the file picker.
        audit.visit("/lab")
        evidence = _evidence(tmp_path)
        page.set_input_files("#evidence", str(evidence))
        page.wait_for_function("() => document.getElementById('lab-status').textContent === ''")
        report = page.locator("#lab-report")
        assert report.locator("h2.evidence-name").all_inner_texts() == [evidence.name]
        assert HOSTILE[0] in report.locator("section.suite h2").inner_text()
        page.screenshot(path=str(shots / "lab.png"), full_page=True)
        audit.check()

        assert [d for d in audit.dialogs if d[0] != "confirm"] == []
        assert len(audit.requests) > 50  # the audit saw the traffic it judged
