"""The lab's evidence made readable: the table a terminal prints and a self-contained HTML page.

Everything here reads only the evidence mapping (what :func:`oncewire.lab.runner.run_lab`
returns and ``oncewire lab --output`` writes), never the suites or the stores, so an evidence
file from an earlier run renders the same way, and a web page can embed the same HTML through
:func:`render_fragment` (with :data:`STYLE` in its head). The page needs nothing from outside:
inline CSS, inline SVG charts, no script, no external address.

Each suite names the summary fields that matter (``Suite.key_numbers``, copied into the
evidence as ``key_numbers``); the renderers show those and nothing they would have to guess.
Evidence written before suites named theirs falls back to the first few numeric fields.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

__all__ = [
    "STYLE",
    "format_value",
    "key_numbers",
    "render_fragment",
    "render_html",
    "render_text",
    "summary_line",
    "verdict_of",
]

_FALLBACK_NUMBERS = 4
_NARROWEST = 36  # the narrowest numbers column worth keeping the numbers in
_KILLED = -9  # -SIGKILL, as subprocess reports a child killed by it


# -- shared pieces ---------------------------------------------------------------------------
def verdict_of(scenario: Mapping[str, Any]) -> str:
    """``pass``, ``FAIL`` or ``n/a`` (a cell that does not apply: never counted as a pass)."""
    if scenario.get("skipped"):
        return "n/a"
    return "pass" if scenario.get("passed") else "FAIL"


def format_value(value: Any) -> str:
    """A summary value as the table prints it: numbers as they are, lists joined by commas."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return ",".join(f"{k}:{format_value(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ",".join(format_value(v) for v in value)
    return str(value)


def _lookup(summary: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    value: Any = summary
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def key_numbers(suite: Mapping[str, Any], scenario: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(label, value)`` for each key number the suite declares that this scenario has.

    A declared field may be a dotted path into the summary (``states.done``, labelled
    ``done``); a field a scenario does not report is left out rather than shown as zero. A
    suite that declares none (or evidence from before suites declared them) shows the first
    few numeric fields of each summary.
    """
    summary = scenario.get("summary") or {}
    declared: Sequence[str] = suite.get("key_numbers") or ()
    if not declared:
        declared = [
            name
            for name, value in summary.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        ][:_FALLBACK_NUMBERS]
    found = []
    for path in declared:
        present, value = _lookup(summary, path)
        if present:
            found.append((path.rsplit(".", 1)[-1], value))
    return found


def _counts(evidence: Mapping[str, Any]) -> tuple[int, int]:
    counted = skipped = 0
    for suite in evidence["suites"].values():
        for scenario in suite["scenarios"].values():
            if scenario.get("skipped"):
                skipped += 1
            else:
                counted += 1
    return counted, skipped


def summary_line(evidence: Mapping[str, Any]) -> str:
    """The last line: PASS or FAIL, how many scenarios, the backend, the seed, the time."""
    counted, skipped = _counts(evidence)
    verdict = "PASS" if evidence["passed"] else "FAIL"
    return (
        f"{verdict}: {counted} scenarios in {len(evidence['suites'])} suite(s)"
        + (f", {skipped} not applicable" if skipped else "")
        + f"; real SIGKILL; {evidence['backend']}; seed {evidence['seed']};"
        + f" {evidence['duration_seconds']:.1f}s"
    )


def _seconds(value: Any) -> str:
    return f"{value:.1f}s" if isinstance(value, int | float) and value > 0 else "-"


# -- the text table --------------------------------------------------------------------------
def render_text(evidence: Mapping[str, Any], width: int = 100) -> str:
    """The table ``oncewire lab`` prints: suite, scenario, verdict, time and key numbers, one
    row per scenario (long rows wrap under their numbers), each failure under its scenario,
    then the PASS/FAIL line."""
    rows = []
    for suite_name, suite in evidence["suites"].items():
        for scenario in suite["scenarios"].values():
            numbers = [f"{label}={format_value(v)}" for label, v in key_numbers(suite, scenario)]
            if scenario.get("skipped"):
                numbers = [f"({scenario['skipped']})"]
            rows.append((suite_name, scenario, numbers))
    suite_w = max([len("suite")] + [len(r[0]) for r in rows])
    scenario_w = min(44, max([len("scenario")] + [len(r[1]["name"]) for r in rows]))
    head = f"{'suite':<{suite_w}}  {'scenario':<{scenario_w}}  verdict  {'time':>6}  "
    # Numbers that do not fit go on under the numbers column, or under the scenario's when the
    # names leave the numbers too narrow a column to read.
    under = len(head) if width - len(head) >= _NARROWEST else suite_w + 4
    lines = [head + "key numbers"]
    for suite_name, scenario, numbers in rows:
        name, shown_suite = scenario["name"], suite_name
        if len(name) > scenario_w:  # the whole name on a line of its own, the row under it
            lines.append(f"{suite_name:<{suite_w}}  {name}")
            name = shown_suite = ""
        row = (
            f"{shown_suite:<{suite_w}}  {name:<{scenario_w}}  {verdict_of(scenario):<7}  "
            f"{_seconds(scenario.get('duration_seconds')):>6}  "
        )
        wrapped = textwrap.wrap(
            " ".join(numbers),
            width,
            initial_indent=" " * len(row),
            subsequent_indent=" " * under,
            break_long_words=False,
            break_on_hyphens=False,
        ) or [""]
        lines.append((row + wrapped[0][len(row) :]).rstrip())
        lines += wrapped[1:]
        for failure in scenario.get("failures") or []:
            lines += textwrap.wrap(
                f"FAILED: {failure}",
                width,
                initial_indent="    ",
                subsequent_indent="      ",
                break_long_words=False,
                break_on_hyphens=False,
            )
    lines.append(summary_line(evidence))
    return "\n".join(lines)


# -- the HTML page ---------------------------------------------------------------------------
STYLE = """
.oncewire-lab { font: 14px/1.4 system-ui, sans-serif; color: #1b1f24; max-width: 70rem; }
.oncewire-lab h1 { font-size: 1.4rem; } .oncewire-lab h2 { font-size: 1.15rem; margin-top: 2rem; }
.oncewire-lab table { border-collapse: collapse; margin: .5rem 0; }
.oncewire-lab th, .oncewire-lab td { border-bottom: 1px solid #d0d7de; padding: .2rem .6rem;
  text-align: left; vertical-align: top; }
.oncewire-lab td.n { text-align: right; font-variant-numeric: tabular-nums; }
.oncewire-lab .pass, .oncewire-lab .PASS { color: #116329; font-weight: 600; }
.oncewire-lab .FAIL { color: #b3261e; font-weight: 700; }
.oncewire-lab figcaption { color: #57606a; }
.oncewire-lab .na { color: #6e7781; }
.oncewire-lab dl.meta { display: grid; grid-template-columns: max-content auto; gap: .1rem 1rem; }
.oncewire-lab dl.meta dt { color: #57606a; } .oncewire-lab dl.meta dd { margin: 0; }
.oncewire-lab .num { display: inline-block; margin-right: .8rem; white-space: nowrap; }
.oncewire-lab .num b { font-variant-numeric: tabular-nums; }
.oncewire-lab details { margin: .3rem 0 .3rem 1rem; }
.oncewire-lab ul.failures { color: #b3261e; }
.oncewire-lab svg { display: block; margin: .5rem 0; background: #f6f8fa; }
.oncewire-lab svg text { font: 11px system-ui, sans-serif; fill: #57606a; }
.oncewire-lab svg .done { fill: none; stroke: #0969da; stroke-width: 2; }
.oncewire-lab svg .kill { stroke: #b3261e; stroke-width: 1.5; stroke-dasharray: 4 3; }
.oncewire-lab svg .bar { fill: #0969da; } .oncewire-lab svg .bar.failed { fill: #b3261e; }
.oncewire-lab svg .axis { stroke: #8c959f; }
"""


def _css_class(verdict: str) -> str:
    return "na" if verdict == "n/a" else verdict


def _verdict_html(verdict: str) -> str:
    return f'<span class="{_css_class(verdict)}">{escape(verdict)}</span>'


def _exit_text(process: Mapping[str, Any]) -> str:
    code = process.get("exit_code")
    if process.get("timed_out"):
        return f"timed out, killed (exit {code})"
    if code == _KILLED:
        return "killed by SIGKILL"
    if code is None:
        return "still running"
    if isinstance(code, int) and code < 0:
        return f"killed by signal {-code}"
    return f"exit {code}"


def _header(evidence: Mapping[str, Any]) -> str:
    verdict = "PASS" if evidence["passed"] else "FAIL"
    counted, skipped = _counts(evidence)
    options = {k: v for k, v in (evidence.get("options") or {}).items() if v is not None}
    meta = [
        ("verdict", _verdict_html(verdict)),
        (
            "scenarios",
            escape(f"{counted} in {len(evidence['suites'])} suite(s)")
            + (escape(f", {skipped} not applicable") if skipped else ""),
        ),
        ("backend", escape(str(evidence.get("backend")))),
        ("seed", escape(str(evidence.get("seed")))),
        ("started", escape(str(evidence.get("started_at", "-")))),
        ("duration", escape(f"{evidence.get('duration_seconds', 0):.1f}s")),
        ("signal", escape(str(evidence.get("signal", "SIGKILL")))),
        ("options", escape(format_value(options) if options else "defaults")),
        (
            "versions",
            escape(
                f"oncewire {evidence.get('oncewire')}, Python {evidence.get('python')}, "
                f"SQLite {evidence.get('sqlite')}"
            ),
        ),
        ("platform", escape(str(evidence.get("platform", "-")))),
    ]
    rows = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in meta)
    return (
        f"<header><h1>oncewire crash lab: {_verdict_html(verdict)}</h1>"
        f'<dl class="meta">{rows}</dl></header>'
    )


def _numbers_html(numbers: Iterable[tuple[str, Any]]) -> str:
    return "".join(
        f'<span class="num">{escape(label)} <b>{escape(format_value(value))}</b></span>'
        for label, value in numbers
    )


def _numbers_cell(suite: Mapping[str, Any], scenario: Mapping[str, Any]) -> str:
    if scenario.get("skipped"):
        return f'<span class="na">{escape(str(scenario["skipped"]))}</span>'
    return _numbers_html(key_numbers(suite, scenario))


def _durations_chart(scenarios: Sequence[Mapping[str, Any]]) -> str:
    """Horizontal bars: how long each scenario took (only scenarios that kept their time)."""
    timed = [s for s in scenarios if (s.get("duration_seconds") or 0) > 0]
    if len(timed) < 2:
        return ""
    longest = max(s["duration_seconds"] for s in timed)
    bar_h, label_w, chart_w = 16, 260, 360
    height = bar_h * len(timed) + 24
    parts = [
        "<figure><figcaption>time per scenario</figcaption>",
        f'<svg class="durations" role="img" width="{label_w + chart_w + 60}" '
        f'height="{height}" viewBox="0 0 {label_w + chart_w + 60} {height}">'
        "<title>time per scenario</title>",
    ]
    for i, scenario in enumerate(timed):
        y = 8 + i * bar_h
        w = max(1.0, chart_w * scenario["duration_seconds"] / longest)
        failed = " failed" if verdict_of(scenario) == "FAIL" else ""
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 11}" text-anchor="end">'
            f"{escape(scenario['name'][:40])}</text>"
            f'<rect class="bar{failed}" x="{label_w}" y="{y + 2}" width="{w:.1f}" '
            f'height="{bar_h - 4}"/>'
            f'<text x="{label_w + w + 4:.1f}" y="{y + 11}">'
            f"{scenario['duration_seconds']:.1f}s</text>"
        )
    parts.append("</svg></figure>")
    return "".join(parts)


def _timeline_chart(scenario: Mapping[str, Any]) -> str:
    """Effects done over time, with a dashed line at each SIGKILL (the torture suite's)."""
    details = scenario.get("details") or {}
    timeline = details.get("timeline")
    if not isinstance(timeline, Mapping) or not timeline.get("t"):
        return ""
    times = [float(t) for t in timeline["t"]]
    done = [int(d) for d in timeline["done"]]
    kills = [k for k in details.get("kills") or [] if "at_seconds" in k]
    total = int(timeline.get("total") or 0)
    end = max([times[-1], *(float(k["at_seconds"]) for k in kills)]) or 1.0
    top = max(total, max(done), 1)
    left, right, upper, lower, w, h = 48, 16, 14, 30, 640, 240
    plot_w, plot_h = w - left - right, h - upper - lower

    def x(t: float) -> float:
        return left + plot_w * t / end

    def y(n: float) -> float:
        return upper + plot_h * (1 - n / top)

    points = " ".join(f"{x(t):.1f},{y(n):.1f}" for t, n in zip(times, done, strict=False))
    caption = (
        f"{escape(scenario['name'])}: effects done over time ({done[-1]} of {total}),"
        f" {len(kills)} SIGKILL(s)"
    )
    parts = [
        f"<figure><figcaption>{caption}</figcaption>",
        f'<svg class="timeline" role="img" width="{w}" height="{h}" viewBox="0 0 {w} {h}">',
        f"<title>{escape(scenario['name'])}: effects done over time, "
        f"{len(kills)} SIGKILL(s)</title>",
        f'<line class="axis" x1="{left}" y1="{upper + plot_h}" x2="{left + plot_w}" '
        f'y2="{upper + plot_h}"/>',
        f'<line class="axis" x1="{left}" y1="{upper}" x2="{left}" y2="{upper + plot_h}"/>',
        f'<text x="{left - 4}" y="{y(top) + 4:.1f}" text-anchor="end">{top}</text>',
        f'<text x="{left - 4}" y="{upper + plot_h + 4}" text-anchor="end">0</text>',
        f'<text x="{left}" y="{h - 10}">0s</text>',
        f'<text x="{left + plot_w}" y="{h - 10}" text-anchor="end">{end:.1f}s</text>',
        f'<text x="{left + plot_w / 2:.0f}" y="{h - 10}" text-anchor="middle">'
        "effects done (blue) and each SIGKILL (red, dashed)</text>",
    ]
    for number, kill in enumerate(kills, 1):
        at = float(kill["at_seconds"])
        parts.append(
            f'<line class="kill" x1="{x(at):.1f}" y1="{upper}" x2="{x(at):.1f}" '
            f'y2="{upper + plot_h}"><title>SIGKILL {number} at {at:.2f}s '
            f"(pid {escape(str(kill.get('pid')))})</title></line>"
        )
    parts.append(f'<polyline class="done" points="{points}"/>')
    parts.append("</svg></figure>")
    return "".join(parts)


def _processes_html(processes: Sequence[Mapping[str, Any]]) -> str:
    if not processes:
        return ""
    rows = "".join(
        "<tr>"
        f"<td>{escape(str(p.get('role')))}</td>"
        f'<td class="n">{escape(str(p.get("pid")))}</td>'
        f"<td>{escape(str(p.get('armed') or '-'))}</td>"
        f"<td>{escape(_exit_text(p))}</td>"
        f'<td class="n">{escape(_seconds(p.get("duration_seconds")))}</td>'
        "</tr>"
        for p in processes
    )
    return (
        '<table class="processes"><thead><tr><th>process</th><th>pid</th>'
        "<th>armed crash point</th><th>ended</th><th>time</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _scenario_details(scenario: Mapping[str, Any]) -> str:
    verdict = verdict_of(scenario)
    failures = scenario.get("failures") or []
    if scenario.get("skipped"):
        outcome = f'<p class="na">not applicable: {escape(str(scenario["skipped"]))}</p>'
    elif failures:
        items = "".join(f"<li>{escape(str(f))}</li>" for f in failures)
        outcome = f'<ul class="failures">{items}</ul>'
    else:
        outcome = '<p class="pass">every invariant held</p>'
    opened = " open" if verdict == "FAIL" else ""
    return (
        f"<details{opened}><summary>{escape(scenario['name'])}: {_verdict_html(verdict)}"
        f"</summary>{outcome}"
        f"{_processes_html(scenario.get('processes') or [])}</details>"
    )


def _suite_html(name: str, suite: Mapping[str, Any]) -> str:
    scenarios = list(suite["scenarios"].values())
    verdict = "pass" if suite.get("passed") else "FAIL"
    rows = "".join(
        f"<tr><td>{escape(s['name'])}</td><td>{_verdict_html(verdict_of(s))}</td>"
        f'<td class="n">{escape(_seconds(s.get("duration_seconds")))}</td>'
        f"<td>{_numbers_cell(suite, s)}</td></tr>"
        for s in scenarios
    )
    charts = "".join(_timeline_chart(s) for s in scenarios)
    return (
        f'<section class="suite" id="suite-{escape(name)}">'
        f"<h2>{escape(name)}: {_verdict_html(verdict)}</h2>"
        f"<p>{escape(str(suite.get('description', '')))}; "
        f"{escape(_seconds(suite.get('duration_seconds')))}</p>"
        '<table class="scenarios"><thead><tr><th>scenario</th><th>verdict</th><th>time</th>'
        f"<th>key numbers</th></tr></thead><tbody>{rows}</tbody></table>"
        f"{charts}{_durations_chart(scenarios)}"
        f"{''.join(_scenario_details(s) for s in scenarios)}</section>"
    )


def render_fragment(evidence: Mapping[str, Any]) -> str:
    """The report as one ``<div class="oncewire-lab">``, for a page that brings :data:`STYLE`."""
    suites = "".join(_suite_html(n, s) for n, s in evidence["suites"].items())
    return (
        f'<div class="oncewire-lab">{_header(evidence)}{suites}'
        f"<p>{escape(summary_line(evidence))}</p></div>"
    )


def render_html(evidence: Mapping[str, Any]) -> str:
    """A whole page: the fragment with its style, nothing loaded from anywhere else."""
    verdict = "PASS" if evidence["passed"] else "FAIL"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>oncewire crash lab: {verdict}</title><style>{STYLE}</style></head>"
        f"<body>{render_fragment(evidence)}</body></html>\n"
    )
