"""What ``oncewire lab`` shows a person, checked against a real lab run's evidence.

Each test runs the lab as a child process (real children, real SIGKILL) and reads what it
printed and wrote: the table on stdout must hold every scenario with its verdict and the key
numbers its suite declares, equal to the evidence JSON; the HTML report must parse, name
every scenario with its verdict, draw one kill marker per SIGKILL the evidence records, and
load nothing from elsewhere; the torture timeline must end where the store it kept ends.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from contextlib import closing
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.crash

VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "wbr", "source"}
SVG_EMPTY = {"line", "polyline", "rect", "circle", "path"}  # written self-closing


def lab(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    ran = subprocess.run(
        [sys.executable, "-m", "oncewire", "lab", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return ran


def rows_of(table: str) -> dict[tuple[str, str], list[str]]:
    """(suite, scenario) -> the row's words, continuation lines included."""
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["suite", "scenario", "verdict", "time"]
    rows: dict[tuple[str, str], list[str]] = {}
    current: list[str] | None = None
    for line in lines[1:-1]:
        if line.startswith(" "):
            assert current is not None, line
            current += line.split()
            continue
        words = line.split()
        current = rows[(words[0], words[1])] = words[2:]
    return rows


def expected_numbers(suite: dict[str, Any], scenario: dict[str, Any]) -> list[str]:
    """``label=value`` for each declared key number the scenario has (ints and words only)."""
    found = []
    for path in suite["key_numbers"]:
        value: Any = scenario["summary"]
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            continue
        assert isinstance(value, int | str), (path, value)
        found.append(f"{path.rsplit('.', 1)[-1]}={value}")
    return found


def check_table(stdout: str, evidence: dict[str, Any]) -> None:
    rows = rows_of(stdout.strip())
    seen = set()
    for suite_name, suite in evidence["suites"].items():
        assert suite["key_numbers"], f"{suite_name} declares no key numbers"
        for name, scenario in suite["scenarios"].items():
            words = rows[(suite_name, name)]
            seen.add((suite_name, name))
            assert words[0] == ("pass" if scenario["passed"] else "FAIL")
            numbers = expected_numbers(suite, scenario)
            assert numbers, f"{name}: no key number shown"
            for number in numbers:
                assert number in words, (name, number, words)
    assert set(rows) == seen
    assert max(len(line) for line in stdout.splitlines()[:-1]) <= 100


class Page(HTMLParser):
    """The tags of a page, with a check that every element opened is closed in order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[tuple[str, dict[str, str], tuple[str, ...]]] = []  # tag, attrs, parents
        self.text: list[tuple[tuple[str, ...], str]] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}, tuple(self.stack)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}, tuple(self.stack)))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append((tuple(self.stack), data))


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    page.close()
    assert page.errors == [] and page.stack == [], page.errors or page.stack
    return page


def check_page(html: str, evidence: dict[str, Any]) -> Page:
    page = parse(html)
    names = {tag for tag, _, _ in page.tags}
    assert not names & {"script", "link", "img", "iframe", "object", "embed"}
    for _, attrs, _ in page.tags:
        for key, value in attrs.items():
            assert key not in ("src", "href") and "url(" not in value, (key, value)
    assert "http://" not in html and "https://" not in html and "url(" not in html
    assert "svg" in names
    # The scenario tables: every scenario, with its verdict.
    # The scenario tables come first: a scenario's first cell is its name, the next its verdict.
    cells = [d.strip() for parents, d in page.text if "td" in parents and d.strip()]
    for suite in evidence["suites"].values():
        for name, scenario in suite["scenarios"].items():
            verdict = "pass" if scenario["passed"] else "FAIL"
            at = cells.index(name)
            assert cells[at + 1] == verdict, (name, cells[at : at + 2])
    return page


def test_the_outbox_suite_prints_a_table_and_writes_a_page(tmp_path: Path) -> None:
    ran = lab(tmp_path, "--suite", "outbox", "--output", "ev.json", "--report", "r.html")
    evidence = json.loads((tmp_path / "ev.json").read_text(encoding="utf-8"))
    scenarios = evidence["suites"]["outbox"]["scenarios"]
    assert len(scenarios) == 5
    check_table(ran.stdout, evidence)
    assert ran.stdout.strip().splitlines()[-1].startswith("PASS: 5 scenarios in 1 suite(s)")
    # Progress on stderr: the suite, then each scenario's verdict as it finished, timed.
    progress = ran.stderr.splitlines()
    assert progress[0].startswith("[1/1] outbox: ")
    for name in scenarios:
        assert any(line.strip().startswith(f"outbox: {name} pass (") for line in progress), name
    assert progress[-1].startswith("[1/1] outbox: pass (5 scenarios, ")
    assert all(s["duration_seconds"] > 0 for s in scenarios.values())

    page = check_page((tmp_path / "r.html").read_text(encoding="utf-8"), evidence)
    # Each scenario's processes, with how they ended: the armed ones killed by SIGKILL.
    shown = " ".join(data for _, data in page.text)
    killed = [p for s in scenarios.values() for p in s["processes"] if p["exit_code"] == -9]
    assert killed and shown.count("killed by SIGKILL") == len(killed)
    assert all(p["armed"] and p["armed"] in shown for p in killed)


def test_a_small_torture_run_charts_its_kills_and_ends_where_the_store_does(
    tmp_path: Path,
) -> None:
    ran = lab(
        tmp_path,
        "--suite",
        "torture",
        "--operations",
        "60",
        "--kills",
        "3",
        "--seed",
        "4",
        "--directory",
        "kept",
        "--output",
        "ev.json",
        "--report",
        "r.html",
    )
    evidence = json.loads((tmp_path / "ev.json").read_text(encoding="utf-8"))
    check_table(ran.stdout, evidence)
    page = check_page((tmp_path / "r.html").read_text(encoding="utf-8"), evidence)
    markers = [parents for _, attrs, parents in page.tags if attrs.get("class") == "kill"]
    assert all("svg" in parents for parents in markers)
    scenarios = evidence["suites"]["torture"]["scenarios"]
    kills = [k for s in scenarios.values() for k in s["details"]["kills"]]
    assert len(markers) == len(kills) == sum(s["summary"]["kills"] for s in scenarios.values())
    assert len(kills) >= 2  # one per scenario at least: the chart has something to show
    lines = [attrs for tag, attrs, _ in page.tags if tag == "polyline"]
    assert len(lines) == len(scenarios)
    for (mode, scenario), line in zip(
        (("dedup", scenarios["torture[dedup]"]), ("no_dedup", scenarios["torture[no_dedup]"])),
        lines,
        strict=True,
    ):
        timeline = scenario["details"]["timeline"]
        assert 2 <= len(timeline["t"]) <= 300
        assert len(line["points"].split()) == len(timeline["t"])
        assert timeline["t"] == sorted(timeline["t"])
        assert timeline["done"] == sorted(timeline["done"])  # done effects never come back
        assert timeline["kills"][-1] == scenario["summary"]["kills"]
        for kill in scenario["details"]["kills"]:
            assert 0 < kill["at_seconds"] <= timeline["t"][-1]
        # The last sample was read after the final dispatcher: the store the lab kept agrees.
        caller = tmp_path / "kept" / "torture" / mode / "caller.sqlite"
        with closing(sqlite3.connect(caller)) as db:
            (done,) = db.execute(
                "SELECT COUNT(*) FROM oncewire_effects WHERE state = 'done'"
            ).fetchone()
            (total,) = db.execute("SELECT COUNT(*) FROM oncewire_effects").fetchone()
        assert timeline["done"][-1] == done == scenario["summary"]["states"]["done"]
        assert timeline["total"] == total == scenario["summary"]["operations"]
        assert scenario["summary"]["lost"] == 0


def test_json_keeps_stdout_pure_log_records_stay_json_and_quiet_keeps_stderr_empty(
    tmp_path: Path,
) -> None:
    args = ("--suite", "torture", "--operations", "20", "--kills", "1", "--output", "ev.json")
    ran = lab(tmp_path, *args, "--json", "--log-format", "json")
    evidence = json.loads(ran.stdout)
    assert evidence == json.loads((tmp_path / "ev.json").read_text(encoding="utf-8"))
    # Progress as log records, one JSON object per line, each verdict with its fields.
    records = [json.loads(line) for line in ran.stderr.splitlines()]
    verdicts = {r["scenario"]: r["verdict"] for r in records if "verdict" in r}
    assert verdicts == {"torture[dedup]": "pass", "torture[no_dedup]": "pass"}
    assert all(r["logger"] == "oncewire.lab" for r in records)
    quiet = lab(tmp_path, *args, "--quiet", "--report", "r.txt")
    assert quiet.stderr == ""
    # A report file that is not .html holds the table, as printed.
    assert (tmp_path / "r.txt").read_text(encoding="utf-8") == quiet.stdout
    check_table(quiet.stdout, json.loads((tmp_path / "ev.json").read_text(encoding="utf-8")))
