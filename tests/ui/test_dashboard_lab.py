"""The dashboard's lab page in a headless Chromium, on the evidence of a real lab run.

``oncewire lab`` runs a small torture run as a child process (real dispatchers, real SIGKILL)
and writes its evidence; ``oncewire ui --evidence`` shows it, and the page opens the same file
through its file input. The page renders through :mod:`oncewire.lab.report`: each scenario is
listed with its verdict, and the torture timeline draws one kill line per SIGKILL the evidence
records. A file that is not evidence is refused with a sentence and nothing rendered.
Screenshots are kept in ``$ONCEWIRE_ARTIFACTS/ui/lab/`` when ONCEWIRE_ARTIFACTS is set,
otherwise in the test's ``tmp_path/screenshots``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from oncewire import Ledger
from oncewire.ui.labview import MAX_DEPTH
from tests.ui.support import ONCEWIRE, artifacts, browser, fetch, server

pytestmark = pytest.mark.timeout(400)


def test_the_lab_page_shows_a_real_torture_run(tmp_path: Path) -> None:
    evidence_path = tmp_path / "ev.json"
    ran = subprocess.run(
        [ONCEWIRE, "lab", "--suite", "torture", "--operations", "40", "--kills", "2",
         "--output", str(evidence_path), "--quiet"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    evidence = json.loads(evidence_path.read_text(encoding="utf-8"))
    scenarios = evidence["suites"]["torture"]["scenarios"]
    kills = sum(len(s["details"]["kills"]) for s in scenarios.values())
    assert kills >= 2
    db = str(tmp_path / "app.db")
    Ledger(db).close()
    not_evidence = tmp_path / "not-evidence.json"
    not_evidence.write_text('{"hello": "world"}', encoding="utf-8")
    shots = artifacts(tmp_path, "lab")

    with server(db, "--evidence", str(evidence_path)) as ui, browser() as chromium:
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        page.goto(ui.url + "/lab")
        report = page.locator("#lab-report")
        assert report.locator("h2.evidence-name").all_inner_texts() == ["ev.json"]
        text = report.inner_text()
        for name, scenario in scenarios.items():
            assert name in text
            assert scenario["passed"]
        assert report.locator("svg.timeline line.kill").count() == kills
        assert report.locator("svg.timeline polyline.done").count() == len(scenarios)
        page.screenshot(path=str(shots / "preloaded.png"), full_page=True)

        # Opened through the page: refused when it is not evidence, shown when it is.
        page.set_input_files("#evidence", str(not_evidence))
        page.wait_for_function(
            "() => document.getElementById('lab-status').textContent.includes('not lab evidence')"
        )
        assert report.locator("svg.timeline line.kill").count() == kills  # left as it was
        page.set_input_files("#evidence", str(evidence_path))
        page.wait_for_function("() => document.getElementById('lab-status').textContent === ''")
        assert report.locator("h2.evidence-name").all_inner_texts() == ["ev.json"]
        assert report.locator("svg.timeline line.kill").count() == kills
        page.screenshot(path=str(shots / "opened.png"), full_page=True)


def test_a_file_that_is_not_evidence_stops_the_server_before_it_listens(tmp_path: Path) -> None:
    db = str(tmp_path / "app.db")
    Ledger(db).close()
    bad = tmp_path / "bad.json"
    bad.write_text('{"suites": {"torture": {"scenarios": []}}, "passed": true}', encoding="utf-8")
    ran = subprocess.run(
        [ONCEWIRE, "ui", "--db", db, "--port", "0", "--evidence", str(bad)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 1 and ran.stdout == ""
    assert "suite 'torture' has no 'scenarios' object" in ran.stderr


def _nested_evidence(depth: int) -> bytes:
    """Evidence whose options hold lists nested so that the file is ``depth`` levels deep
    (the file's object is 1, ``options`` 2)."""
    lists = depth - 2
    return (
        '{"passed": true, "backend": "sqlite", "seed": 1, "duration_seconds": 1.0, '
        f'"options": {{"deep": {"[" * lists}{"]" * lists}}}, '
        '"suites": {"s": {"passed": true, "scenarios": {"a": {"name": "a", "passed": true}}}}}'
    ).encode()


def test_deeply_nested_evidence_is_refused_or_rendered_never_a_500(tmp_path: Path) -> None:
    """Regression: /lab/render answered 500 for evidence nested deeper than the parser's or
    the renderer's recursion could go, and such a file given with --evidence crashed the
    start with a traceback."""
    db = str(tmp_path / "app.db")
    Ledger(db).close()
    as_json = {"Content-Type": "application/json"}
    with server(db) as ui:
        for depth in (MAX_DEPTH + 1, 950, 5_000, 200_000):
            answer = fetch(
                ui.url + "/lab/render", method="POST", body=_nested_evidence(depth), headers=as_json
            )
            assert answer.status == 400, (depth, answer.text[:300])
            assert f"nested too deeply: more than {MAX_DEPTH} levels" in answer.text
        within = fetch(
            ui.url + "/lab/render", method="POST", body=_nested_evidence(MAX_DEPTH), headers=as_json
        )
        assert within.status == 200 and 'class="oncewire-lab"' in within.text
    deep = tmp_path / "deep.json"
    deep.write_bytes(_nested_evidence(5_000))
    ran = subprocess.run(
        [ONCEWIRE, "ui", "--db", db, "--port", "0", "--evidence", str(deep)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 1 and ran.stdout == ""
    assert ran.stderr.count("\n") == 1 and "nested too deeply" in ran.stderr, ran.stderr
