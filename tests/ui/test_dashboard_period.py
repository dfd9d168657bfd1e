"""``oncewire ui --refresh-seconds``: how often a page fetches its data again.

A bad value (not a plain decimal number, nan or inf, outside 0.1 to 3600) is refused in one line
before anything starts: no store opened, nothing listening, no JSON line. A good one is written
into every page as ``data-refresh-ms`` on ``#live``, and a real Chromium then refreshes at that
period: each refresh's request is timed in the page, from the end of the refresh before it (the
page waits the period after a refresh has finished) to its start.
"""

from __future__ import annotations

import math
import re
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.cli import main
from oncewire.core.errors import ConfigurationError
from oncewire.ui import period
from tests.ui.support import ONCEWIRE, browser, fetch, server

pytestmark = pytest.mark.timeout(300)

WANTED = "a number of seconds from 0.1 to 3600"
BAD = (
    "abc",
    "",
    " ",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "1e400",
    "0",
    "0.09",
    "0.0999",
    "-1",
    "-0.5",
    "3600.001",
    "3601",
    "1e4",
    "1_0",
    "0x10",
    "2s",
    "2,5",
    "\u0662",  # an Arabic-Indic digit two: float() would take it
)
SLACK_MS = 300  # how late a timer may fire on a loaded machine, at the median
EARLY_MS = 5  # how early one may seem to, from the clock's coarseness

# Times each refresh in the page: when its request starts (the script's fetch) and when it has
# been swapped in (the status line's count changes), in milliseconds since navigation.
TIMES = """
window.refreshTimes = { starts: [], ends: [] };
(function () {
  var original = window.fetch;
  window.fetch = function () {
    window.refreshTimes.starts.push(performance.now());
    return original.apply(this, arguments);
  };
  document.addEventListener("DOMContentLoaded", function () {
    var status = document.getElementById("live-status");
    if (!status) { return; }
    new MutationObserver(function () { window.refreshTimes.ends.push(performance.now()); })
      .observe(status, { attributes: true, attributeFilter: ["data-refreshes"] });
  });
})();
"""


def _store(tmp_path: Path) -> str:
    db = str(tmp_path / "period.db")
    with Ledger(db) as ledger:
        ledger.accept("e-1", "mail", {"n": 1})
    return db


def test_the_period_is_parsed_and_checked() -> None:
    assert period.parse("0.1") == 0.1 and period.parse("3600") == 3600.0
    assert period.parse("2") == period.DEFAULT_SECONDS == 2.0
    assert [period.parse(t) for t in (".5", "1e1", "+5", " 3 ", "0.25")] == [0.5, 10, 5, 3, 0.25]
    assert [period.milliseconds(s) for s in (0.1, 0.2, 0.25, 2, 3600)] == [
        100,
        200,
        250,
        2000,
        3_600_000,
    ]
    for text in BAD:
        with pytest.raises(ConfigurationError, match=re.escape(f"not {text!r}")):
            period.parse(text)
    for value in (math.nan, math.inf, -math.inf, 0.0, 0.0999, 3600.001, -2, True, "2", None):
        with pytest.raises(ConfigurationError, match="the refresh period must be"):
            period.check(value)  # type: ignore[arg-type]


def test_a_bad_period_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import oncewire.ui.server

    started: list[Any] = []
    monkeypatch.setattr(oncewire.ui.server, "serve", lambda *a, **k: started.append(a))
    missing = tmp_path / "never.db"  # the store is not even looked for
    for text in BAD:
        code = main(["ui", "--db", str(missing), "--port", "0", "--refresh-seconds", text])
        out, err = capsys.readouterr()
        assert (code, out) == (1, ""), text
        assert (
            err
            == f"error: --refresh-seconds must be {WANTED}, not {text!r} [configuration_error]\n"
        )
    assert started == [] and not missing.exists()

    # The real command, on a store it could serve: no JSON line (the one it prints once
    # listening), one line on stderr, exit 1.
    db = _store(tmp_path)
    for text in ("nan", "0.05", "soon"):
        ran = subprocess.run(
            [ONCEWIRE, "ui", "--db", db, "--port", "0", "--refresh-seconds", text],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (ran.returncode, ran.stdout) == (1, ""), ran.stderr
        assert ran.stderr == (
            f"error: --refresh-seconds must be {WANTED}, not {text!r} [configuration_error]\n"
        )


def test_the_python_api_refuses_a_bad_period(tmp_path: Path) -> None:
    from oncewire.ui.app import create_app
    from oncewire.ui.guard import Guard
    from oncewire.ui.server import serve

    missing, db = tmp_path / "never.db", _store(tmp_path)
    for value in (math.nan, 0.05, 3601.0):
        with pytest.raises(ConfigurationError, match="the refresh period must be"):
            serve(
                str(missing),
                host="127.0.0.1",
                port=0,
                token=None,
                allow_actions=False,
                runs_key=None,
                evidence=[],
                refresh_seconds=value,
            )
        with Ledger(db) as ledger, pytest.raises(ConfigurationError):
            create_app(
                ledger, Guard(token=None, allow_actions=False), db_label="x", refresh_seconds=value
            )
    assert not missing.exists()


def test_the_help_explains_the_option() -> None:
    ran = subprocess.run([ONCEWIRE, "ui", "--help"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0
    text = " ".join(ran.stdout.split())
    assert "--refresh-seconds SECONDS How often each page fetches its data again" in text
    assert "(0.1 to 3600; decimals allowed). [default: 2]" in text


PAGES = ("/", "/effects", "/effect?key=e-1", "/receipts", "/chats", "/runs", "/threads", "/lab")


def test_every_page_carries_the_period(tmp_path: Path) -> None:
    db = _store(tmp_path)
    # Every page by default; the overview at each bound (the same template serves them all).
    for args, ms, paths in (
        ((), "2000", PAGES),
        (("--refresh-seconds", "0.1"), "100", PAGES[:1]),
        (("--refresh-seconds", "3600"), "3600000", PAGES[:1]),
    ):
        with server(db, *args) as ui:
            for path in paths:
                whole = fetch(ui.url + path)
                assert whole.status == 200, path
                assert whole.text.count("data-refresh-ms") == 1, path
                assert f'<div id="live" data-refresh-ms="{ms}">' in whole.text, path
                part = fetch(ui.url + path + ("&" if "?" in path else "?") + "fragment=1")
                assert part.status == 200 and "data-refresh-ms" not in part.text, path


def _times(page: Any) -> tuple[list[float], list[float]]:
    times = page.evaluate("window.refreshTimes")
    return list(times["starts"]), list(times["ends"])


def _waits(page: Any) -> list[float]:
    """How long the page waited after each refresh before it started the next one."""
    starts, ends = _times(page)
    assert len(ends) in (len(starts), len(starts) - 1)  # every refresh done, one maybe under way
    return [start - end for end, start in zip(ends, starts[1:], strict=False)]


def test_the_browser_refreshes_at_the_period(tmp_path: Path) -> None:
    db = _store(tmp_path)
    # Each page's server, the attribute its page is given, and the period it must refresh at.
    with (
        server(db) as default,
        server(db, "--refresh-seconds", "0.2") as fast,
        server(db, "--refresh-seconds", "0.7") as slower,
        browser() as chromium,
    ):
        context, pages = chromium.new_context(), {}
        for name, ui in (("default", default), ("bad", fast), ("slower", slower), ("fast", fast)):
            page = context.new_page()
            page.add_init_script(TIMES)
            if name == "bad":  # the page's attribute changed in transit: the script keeps 2 s

                def rewrite(route: Any) -> None:
                    answer = route.fetch()
                    body = answer.text().replace('data-refresh-ms="200"', 'data-refresh-ms="50"')
                    assert 'data-refresh-ms="50"' in body
                    route.fulfill(response=answer, body=body)

                page.route(ui.url + "/", rewrite)
            page.goto(ui.url + "/")
            assert page.evaluate("document.hidden") is False
            pages[name] = page

        # The fast page: eight refreshes, each started 0.2 s after the one before had finished.
        fast_page = pages["fast"]
        fast_page.wait_for_function("() => window.refreshTimes.ends.length >= 8", timeout=20_000)
        waits = _waits(fast_page)
        assert len(waits) >= 7
        assert min(waits) >= 200 - EARLY_MS, waits
        assert statistics.median(waits) <= 200 + SLACK_MS, waits

        # The slower page: 0.7 s apart, in the same time.
        slower_page = pages["slower"]
        slower_page.wait_for_function("() => window.refreshTimes.ends.length >= 3", timeout=20_000)
        waits = _waits(slower_page)
        assert len(waits) >= 2
        assert min(waits) >= 700 - EARLY_MS, waits
        assert statistics.median(waits) <= 700 + SLACK_MS, waits

        # Two seconds: by default, and when the page's attribute is out of range.
        for name in ("default", "bad"):
            page = pages[name]
            page.wait_for_function("() => window.refreshTimes.ends.length >= 1", timeout=20_000)
            starts, _ = _times(page)
            assert starts[0] >= 2000 - EARLY_MS, (name, starts)
            assert len(starts) == 1 or starts[1] - starts[0] >= 2000 - EARLY_MS, (name, starts)

        for name, page in pages.items():
            # Read at once, in the page: every refresh timed is one the status line counted.
            shown, timed = page.evaluate(
                "() => [Number(document.getElementById('live-status').dataset.refreshes),"
                " window.refreshTimes.ends.length]"
            )
            assert shown == timed >= 1, name
            assert "refresh failed" not in page.locator("#live-status").inner_text(), name
