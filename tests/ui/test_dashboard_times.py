"""The dashboard shows, and lets an operator cancel, an effect whose stored times no date has.

A real ``oncewire ui`` child process on a real SQLite file and a real PostgreSQL schema, read
over plain HTTP (the pages are server-rendered; no browser is needed to read them). The times
are written into the row around oncewire, as SQL can: far past the limits an accept keeps to,
infinite, and on PostgreSQL NaN. Regression: ``delay_seconds=1e300`` was accepted and then the
effect's page failed with OverflowError, so it could not be cancelled from the dashboard.
"""

from __future__ import annotations

import math
import re
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

from oncewire import Dispatcher, Ledger, MaybeSent
from tests.support.runs_db import RunsDatabase
from tests.ui.support import server

pytestmark = pytest.mark.timeout(300)

ABSURD = {"year-3170900": 99_999_999_999_999.0, "1e300": 1e300, "inf": math.inf}


@pytest.fixture
def database(store_url: str) -> Iterator[RunsDatabase]:
    opened = RunsDatabase(store_url)
    yield opened


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.read().decode("utf-8")


def _odd_row(database: RunsDatabase, value: float) -> None:
    """An effect with one attempt recorded, then every time of both rows made ``value``."""
    with Ledger(database.url) as ledger:
        ledger.accept("odd", "mail", {"n": 1})
        Dispatcher(ledger, {"mail": lambda a: MaybeSent("timed out")}).run(
            until_idle=True, handle_signals=False, idle_horizon_seconds=0
        )
    database.execute(
        (
            "UPDATE oncewire_effects SET not_before = ?, deadline = ?, created_at = ?, "
            "updated_at = ? WHERE key = ?",
            (value, value, value, value, "odd"),
        ),
        ("UPDATE oncewire_attempts SET started_at = ?, finished_at = ?", (value, value)),
    )


@pytest.mark.parametrize("name", [*ABSURD, "nan"])
def test_an_effect_with_absurd_stored_times_is_shown_and_cancelled(
    database: RunsDatabase, name: str
) -> None:
    if name == "nan" and database.dialect == "sqlite":
        pytest.skip("SQLite stores NaN as NULL, which not_before refuses")
    value = math.nan if name == "nan" else ABSURD[name]
    _odd_row(database, value)
    with server(database.url, "--allow-actions") as ui:
        for path in ("/", "/effects", "/effects/odd"):
            status, page = _get(ui.url + path)
            assert status == 200, (path, page)
            assert "odd" in page or path == "/", path
        _, page = _get(ui.url + "/effects/odd")
        assert "(not a date)" in page
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        body = urllib.parse.urlencode(
            {"csrf": csrf.group(1), "key": "odd", "reason": "parked for ever"}
        )
        request = urllib.request.Request(
            ui.url + "/effect/cancel",
            data=body.encode(),
            headers={"Origin": ui.url, "Sec-Fetch-Site": "same-origin"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:  # follows the 303
            assert response.status == 200
            assert "cancel: now cancelled" in response.read().decode("utf-8")
    (row,) = database.query(
        "SELECT state, last_error FROM oncewire_effects WHERE key = ?", ("odd",)
    )
    assert (row["state"], row["last_error"]) == ("cancelled", "parked for ever")
