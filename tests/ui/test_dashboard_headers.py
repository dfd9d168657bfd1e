"""The headers every response of ``oncewire ui`` carries, and what they make a browser do.

Regression: the dashboard sent no Content-Security-Policy and no framing policy, so a page on
any site could frame a tokenless loopback dashboard, and markup that got past escaping would
have run. Every kind of response is fetched over HTTP from a real server (pages, fragments,
static files, redirects, refusals of each kind, 404s, a token server's 401); then a headless
Chromium shows that a page elsewhere cannot frame the dashboard and that an inline event
handler added to a dashboard page is refused by the policy and does not run.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from oncewire import Ledger
from tests.ui.support import Answer, browser, fetch, server

pytestmark = pytest.mark.timeout(300)

TOKEN = "s3cret-token-for-the-dashboard"
HEADERS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def _policy(value: str) -> dict[str, list[str]]:
    directives = [part.split() for part in value.split(";") if part.strip()]
    return {d[0]: d[1:] for d in directives}


def _check_headers(name: str, answer: Answer) -> None:
    headers = {k.lower(): v for k, v in answer.headers.items()}
    for header, value in HEADERS.items():
        assert headers.get(header) == value, (name, header, headers)
    policy = _policy(headers.get("content-security-policy", ""))
    assert policy.get("frame-ancestors") == ["'none'"], (name, policy)
    assert policy.get("script-src") == ["'self'"], (name, policy)
    assert policy.get("default-src") == ["'none'"], (name, policy)
    assert "'unsafe-inline'" not in str(policy) and "'unsafe-eval'" not in str(policy)


def test_every_response_carries_the_headers(tmp_path: Path) -> None:
    db = str(tmp_path / "headers.db")
    with Ledger(db) as ledger:
        ledger.accept("k", "mail", {"n": 1})
        ledger.accept("other", "mail", {"n": 2})
    json_type = {"Content-Type": "application/json"}
    answers: dict[str, tuple[int, Answer]] = {}
    with server(db, "--allow-actions") as ui:
        page = fetch(ui.url + "/effect?key=k")
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert found is not None
        csrf = found.group(1)
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        for name, status, path, method, body, headers in [
            ("overview", 200, "/", "GET", None, {}),
            ("overview fragment", 200, "/?fragment=1", "GET", None, {}),
            ("overview HEAD", 200, "/", "HEAD", None, {}),
            ("effects", 200, "/effects?state=pending", "GET", None, {}),
            ("effect", 200, "/effect?key=k", "GET", None, {}),
            ("effect fragment", 200, "/effect?key=k&fragment=1", "GET", None, {}),
            ("effect by path", 200, "/effects/k", "GET", None, {}),
            ("receipts", 200, "/receipts", "GET", None, {}),
            ("chats", 200, "/chats", "GET", None, {}),
            ("runs", 200, "/runs", "GET", None, {}),
            ("threads", 200, "/threads", "GET", None, {}),
            ("threads fragment", 200, "/threads?fragment=1", "GET", None, {}),
            ("lab", 200, "/lab", "GET", None, {}),
            ("script", 200, "/static/dashboard.js", "GET", None, {}),
            ("style", 200, "/static/dashboard.css", "GET", None, {}),
            ("lab style", 200, "/static/lab.css", "GET", None, {}),
            ("icon", 200, "/static/favicon.svg", "GET", None, {}),
            ("no such static file", 404, "/static/nope.js", "GET", None, {}),
            ("no such page", 404, "/nowhere", "GET", None, {}),
            ("no such effect", 404, "/effect?key=missing", "GET", None, {}),
            ("no such chat", 404, "/chats/999", "GET", None, {}),
            ("no such run", 404, "/run?id=missing", "GET", None, {}),
            ("no such thread", 404, "/thread?id=missing", "GET", None, {}),
            ("no thread id", 400, "/thread", "GET", None, {}),
            ("no key", 400, "/effect", "GET", None, {}),
            ("bad filter", 400, "/effects?state=bogus", "GET", None, {}),
            ("bad cursor", 400, "/effects?after=-1", "GET", None, {}),
            ("POST to a page", 405, "/", "POST", b"", form),
            ("unknown action", 404, "/effect/delete", "POST", b"key=k", form),
            ("action without CSRF", 403, "/effect/cancel", "POST", b"key=k", form),
            ("action from elsewhere", 403, "/effect/cancel", "POST",
             f"key=k&csrf={csrf}".encode(), {**form, "Origin": "null",
                                             "Sec-Fetch-Site": "cross-site"}),
            ("action without a key", 400, "/effect/cancel", "POST", f"csrf={csrf}".encode(), form),
            ("action", 303, "/effect/cancel", "POST", f"key=k&csrf={csrf}".encode(), form),
            ("action refused by the outbox", 409, "/effect/cancel", "POST",
             f"key=k&csrf={csrf}".encode(), form),
            ("lab render, not JSON", 415, "/lab/render", "POST", b"x",
             {"Content-Type": "text/plain"}),
            ("lab render, not evidence", 400, "/lab/render", "POST", b"{}", json_type),
            ("another host name", 403, "/", "GET", None, {"Host": "attacker.example"}),
        ]:  # fmt: skip
            answers[name] = (
                status,
                fetch(ui.url + path, method=method, body=body, headers=headers),
            )
    with server(db, "--token", TOKEN) as ui:
        answers["without the token"] = (401, fetch(ui.url + "/effects"))
        answers["with ?token="] = (303, fetch(f"{ui.url}/effects?token={TOKEN}"))
        answers["with a bearer token"] = (
            200,
            fetch(ui.url + "/effects", headers={"Authorization": f"Bearer {TOKEN}"}),
        )
    for name, (status, answer) in answers.items():
        assert answer.status == status, (name, answer.status, answer.text[:300])
        _check_headers(name, answer)
    assert answers["script"][1].headers["content-type"].startswith("text/javascript")
    assert answers["style"][1].headers["content-type"].startswith("text/css")
    assert answers["lab style"][1].headers["content-type"].startswith("text/css")
    assert "Sec-Fetch-Site: cross-site" in answers["action from elsewhere"][1].text
    # Only the one action that was let through changed the store.
    with sqlite3.connect(db) as conn:
        states = dict(conn.execute("SELECT key, state FROM oncewire_effects").fetchall())
    assert states == {"k": "cancelled", "other": "pending"}


@contextmanager
def _elsewhere(html: str) -> Iterator[str]:
    """Another origin on this machine (another port), serving one page: the address."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = html.encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    # A short poll: shutdown() waits for the serving loop's next look (0.5 s by default).
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def test_no_page_elsewhere_can_frame_the_dashboard(tmp_path: Path) -> None:
    db = str(tmp_path / "frame.db")
    Ledger(db).close()
    with server(db) as ui, browser() as chromium:
        framing = f'<!doctype html><title>elsewhere</title><iframe src="{ui.url}/"></iframe>'
        with _elsewhere(framing) as elsewhere:
            page = chromium.new_page()
            page.goto(elsewhere)  # waits for the frame to load, or to be refused
            framed = [frame.url for frame in page.frames if frame != page.main_frame]
            assert len(framed) == 1 and not framed[0].startswith(ui.url), framed
            assert page.frame_locator("iframe").locator("#live").count() == 0


def test_markup_that_got_past_escaping_would_not_run(tmp_path: Path) -> None:
    """Defence in depth: an inline event handler put into a dashboard page is refused by the
    page's policy (reported as a violation) and never runs."""
    db = str(tmp_path / "inline.db")
    Ledger(db).close()
    with server(db) as ui, browser() as chromium:
        page = chromium.new_page()
        page.goto(ui.url + "/")
        inject = """() => new Promise(function (resolve) {
            document.addEventListener("securitypolicyviolation", function (e) {
                resolve(e.violatedDirective);
            });
            var box = document.createElement("div");
            box.innerHTML = '<img src="/no-such-image" onerror="window.pwned = 1">';
            box.firstChild.addEventListener("error", function () {
                if (window.pwned === 1) { resolve("it ran"); }  // after the page's own handler
            });
            document.getElementById("live").appendChild(box);
        })"""
        with page.expect_console_message(lambda m: "inline event handler" in m.text) as said:
            violated = page.evaluate(inject)
        assert violated == "script-src-attr"
        assert "Content Security Policy" in said.value.text
        assert page.evaluate("window.pwned") is None
