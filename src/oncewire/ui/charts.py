"""Charts as inline SVG, drawn on the server from numbers the pages already read.

No chart library and no script: a page that shows a chart shows it in the HTML it is served,
so the live refresh (which swaps a page's content for a fresh rendering) redraws the charts
with the data. Every label goes through :func:`markupsafe.escape`; each chart carries a
``<title>`` and ``data-*`` attributes with its figures, so a reader (or a test) can check
what was drawn against the store.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from oncewire.core.extras import refusal

try:
    from markupsafe import Markup, escape
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("ui", "oncewire ui", exc) from exc

__all__ = ["Series", "bars", "columns", "timeline"]

_FONT = 'font-family="system-ui, sans-serif" font-size="11"'


@dataclass(frozen=True, slots=True)
class Series:
    """One stacked layer of a column chart: a name, a colour and one value per column."""

    name: str
    colour: str
    values: Sequence[int]


def bars(title: str, items: Sequence[tuple[str, int]], *, colours: dict[str, str]) -> Markup:
    """Horizontal bars, one per ``(label, value)``; a value of 0 still gets its row."""
    width, label_w, row_h = 420, 110, 20
    top = max((v for _, v in items), default=0) or 1
    height = row_h * max(1, len(items)) + 4
    parts = [
        f'<svg class="chart bars" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" data-chart="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    for i, (label, value) in enumerate(items):
        y = i * row_h + 2
        bar = 0 if value == 0 else max(2, int((width - label_w - 50) * value / top))
        colour = colours.get(label, "#6b7280")
        parts.append(
            f'<g data-label="{escape(label)}" data-value="{value}">'
            f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end" {_FONT}>{escape(label)}</text>'
            f'<rect x="{label_w}" y="{y + 2}" width="{bar}" height="{row_h - 6}" '
            f'fill="{colour}"/>'
            f'<text x="{label_w + bar + 4}" y="{y + 13}" {_FONT}>{value}</text></g>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def columns(
    title: str, labels: Sequence[str], series: Sequence[Series], *, every: int = 10
) -> Markup:
    """Stacked columns over time: one column per label (a time bucket), one layer per series.

    Only every ``every``-th label is written under the axis, so the axis stays readable.
    """
    width, height, left, bottom = 640, 170, 36, 22
    n = max(1, len(labels))
    totals = [sum(s.values[i] for s in series) for i in range(len(labels))]
    top = max(totals, default=0) or 1
    plot_h = height - bottom - 8
    step = (width - left - 4) / n
    parts = [
        f'<svg class="chart columns" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" data-chart="{escape(title)}" '
        + f'data-totals="{escape(json.dumps({s.name: sum(s.values) for s in series}))}">',
        f"<title>{escape(title)}</title>",
        f'<line x1="{left}" y1="{8 + plot_h}" x2="{width - 4}" y2="{8 + plot_h}" stroke="#999"/>',
        f'<text x="{left - 4}" y="16" text-anchor="end" {_FONT}>{top}</text>',
        f'<text x="{left - 4}" y="{8 + plot_h}" text-anchor="end" {_FONT}>0</text>',
    ]
    for i, label in enumerate(labels):
        x = left + i * step
        base: float = 8 + plot_h
        for s in series:
            value = s.values[i]
            if value:
                h = max(1.0, plot_h * value / top)
                base -= h
                parts.append(
                    f'<rect x="{x + 1:.1f}" y="{base:.1f}" width="{max(1.0, step - 2):.1f}" '
                    f'height="{h:.1f}" fill="{s.colour}"><title>{escape(label)}: {value} '
                    f"{escape(s.name)}</title></rect>"
                )
        if i % every == 0:
            parts.append(f'<text x="{x:.1f}" y="{height - 6}" {_FONT}>{escape(label)}</text>')
    legend_x = left + 6
    for s in series:
        parts.append(
            f'<rect x="{legend_x}" y="4" width="9" height="9" fill="{s.colour}"/>'
            f'<text x="{legend_x + 12}" y="12" {_FONT}>{escape(s.name)}</text>'
        )
        legend_x += 14 + 7 * len(s.name) + 16
    parts.append("</svg>")
    return Markup("".join(parts))


def timeline(
    title: str, points: Sequence[tuple[float, str, str, str]], *, colours: dict[str, str]
) -> Markup:
    """Marks on one time axis: ``(time, lane, label, kind)``; a lane per distinct ``lane``.

    Used for a reply's wire operations (a lane per message slot, a mark per operation
    coloured by its state) and for a torture run's kills.
    """
    lanes = sorted({lane for _, lane, _, _ in points})
    width, lane_h, left = 640, 26, 70
    height = lane_h * max(1, len(lanes)) + 24
    times = [t for t, _, _, _ in points]
    start, end = (min(times), max(times)) if times else (0.0, 1.0)
    span = (end - start) or 1.0
    parts = [
        f'<svg class="chart timeline" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" data-chart="{escape(title)}" '
        f'data-marks="{len(points)}">',
        f"<title>{escape(title)}</title>",
    ]
    for i, lane in enumerate(lanes):
        y = i * lane_h + 14
        parts.append(
            f'<text x="{left - 6}" y="{y + 4}" text-anchor="end" {_FONT}>{escape(lane)}</text>'
            f'<line x1="{left}" y1="{y}" x2="{width - 10}" y2="{y}" stroke="#ddd"/>'
        )
    for t, lane, label, kind in points:
        x = left + (width - left - 20) * (t - start) / span
        y = lanes.index(lane) * lane_h + 14
        colour = colours.get(kind, "#6b7280")
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y}" r="6" fill="{colour}" data-kind="{escape(kind)}">'
            f"<title>{escape(label)}</title></circle>"
        )
    parts.append(
        f'<text x="{left}" y="{height - 4}" {_FONT}>0 s</text>'
        f'<text x="{width - 10}" y="{height - 4}" text-anchor="end" {_FONT}>'
        f"+{span if times else 0:.2f} s</text></svg>"
    )
    return Markup("".join(parts))
