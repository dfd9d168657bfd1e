"""The lab report's renderers on evidence a passing run never produces: a failed scenario, a cell
that does not apply, a name too long for its column, text that must be escaped, and evidence
written before suites declared their key numbers. (A real run's table and page are checked in
tests/e2e/test_lab_report.py.)"""

from __future__ import annotations

from typing import Any

from oncewire.lab.report import STYLE, key_numbers, render_fragment, render_html, render_text

LONG = "a_scenario_whose_name_is_longer_than_the_scenario_column[no_dedup]"


def scenario(name: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": name,
        "passed": True,
        "skipped": None,
        "summary": {},
        "failures": [],
        "processes": [],
        "details": {},
        "duration_seconds": 1.25,
    }
    return {**base, **fields}


def evidence() -> dict[str, Any]:
    failed = scenario(
        "lost_one",
        passed=False,
        summary={"kills": 2, "states": {"done": 9}, "note": "x"},
        failures=["op-00007: 0 tickets for a done effect <script>alert(1)</script> " * 3],
        processes=[
            {"role": "torture", "pid": 41, "exit_code": -9, "armed": None, "duration_seconds": 0.2},
            {"role": "torture", "pid": 42, "exit_code": 0, "armed": None, "duration_seconds": 3},
        ],
    )
    return {
        "passed": False,
        "backend": "sqlite",
        "seed": 3,
        "duration_seconds": 12.0,
        "oncewire": "0.1.0",
        "suites": {
            "torture": {
                "description": "d",
                "passed": False,
                "duration_seconds": 5.0,
                "key_numbers": ["kills", "states.done", "states.dead"],
                "scenarios": {
                    "lost_one": failed,
                    LONG: scenario(LONG, summary={"kills": 1, "states": {"done": 10}}),
                    "n_a": scenario("n_a", skipped="receipts are not on the path", passed=True),
                },
            },
            "older": {  # evidence from before key numbers: the first numeric fields
                "description": "d",
                "passed": True,
                "scenarios": {
                    "s": scenario("s", summary={"label": "x", "a": 1, "b": 2.5, "ok": True})
                },
            },
        },
    }


def test_the_table_shows_failures_skips_and_long_names_within_100_columns() -> None:
    text = render_text(evidence())
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines)
    failed = next(i for i, line in enumerate(lines) if line.startswith("torture  lost_one"))
    assert lines[failed].split()[2:] == ["FAIL", "1.2s", "kills=2", "done=9"]  # no dead: absent
    assert lines[failed + 1].startswith("    FAILED: op-00007: 0 tickets")
    assert any(line.startswith(f"torture  {LONG}") for line in lines)
    long_row = lines[lines.index(next(x for x in lines if LONG in x)) + 1]
    assert long_row.split()[:3] == ["pass", "1.2s", "kills=1"]
    assert any("n/a" in line and "(receipts are not" in line for line in lines)
    assert any(line.split()[:5] == ["older", "s", "pass", "1.2s", "a=1"] for line in lines)
    older = evidence()["suites"]["older"]
    assert key_numbers(older, older["scenarios"]["s"]) == [("a", 1), ("b", 2.5)]
    # Three counted: the cell that does not apply is never a pass.
    assert lines[-1] == (
        "FAIL: 3 scenarios in 2 suite(s), 1 not applicable; real SIGKILL; sqlite; seed 3; 12.0s"
    )


def test_the_page_escapes_text_opens_failures_and_embeds_as_a_fragment() -> None:
    page = render_html(evidence())
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<details open><summary>lost_one" in page
    assert page.count("<details open>") == 1  # only the failed scenario is opened
    assert "killed by SIGKILL" in page and "exit 0" in page
    assert '<span class="na">receipts are not on the path</span>' in page  # why n/a, in its row
    fragment = render_fragment(evidence())
    assert fragment.startswith('<div class="oncewire-lab">') and fragment in page
    assert STYLE in page and "<style>" not in fragment
