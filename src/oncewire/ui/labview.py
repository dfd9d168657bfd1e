"""The lab page: an evidence file (``oncewire lab --output ev.json``) read back for a person.

Rendered by :func:`oncewire.lab.report.render_fragment`, the same renderer as
``oncewire lab --report`` (suites and scenarios with their verdicts, the key numbers each suite
names, the invariants that failed, each child process and how it ended, SIGKILLs included, and
the torture run's effects done over time with a line at each kill), so the dashboard never
shows a second reading of the same file. This module only checks that a file is evidence
before it is rendered, and turns what is wrong with it into a sentence. A file nested deeper
than :data:`MAX_DEPTH` (the payload limit; evidence the lab writes is a few levels deep) is
refused with a 400 whether the parser runs out of recursion on it or the depth is measured
after parsing (without recursion), so the renderer never walks a value deeper than that.
"""

from __future__ import annotations

import json
from typing import Any

from oncewire.core.extras import refusal

try:
    from markupsafe import Markup
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("ui", "oncewire ui", exc) from exc

from oncewire.core.limits import MAX_DEPTH
from oncewire.lab.report import STYLE, render_fragment
from oncewire.ui.guard import Refusal

__all__ = ["MAX_BYTES", "MAX_DEPTH", "STYLE", "parse", "report"]

MAX_BYTES = 64 * 1024 * 1024


def _deeper_than(data: Any, limit: int) -> bool:
    """Whether lists and objects in ``data`` nest more than ``limit`` deep (walked without
    recursion; ``[]`` is 1 deep)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                return True
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    return False


def parse(raw: bytes, name: str) -> dict[str, Any]:
    """Evidence JSON, or a :class:`Refusal` saying what is wrong with the file."""
    if len(raw) > MAX_BYTES:
        raise Refusal(413, f"{name} is larger than {MAX_BYTES // (1024 * 1024)} MiB")
    too_deep = Refusal(400, f"{name} is nested too deeply: more than {MAX_DEPTH} levels")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise too_deep from None
    except ValueError as exc:
        raise Refusal(400, f"{name} is not JSON: {exc}") from None
    if _deeper_than(data, MAX_DEPTH):
        raise too_deep
    if not isinstance(data, dict) or not isinstance(data.get("suites"), dict):
        raise Refusal(
            400,
            f"{name} is not lab evidence: no 'suites' object (oncewire lab --output writes one)",
        )
    if "passed" not in data:
        raise Refusal(400, f"{name} is not lab evidence: no overall 'passed' verdict")
    for suite, result in data["suites"].items():
        if not isinstance(result, dict) or not isinstance(result.get("scenarios"), dict):
            raise Refusal(400, f"{name}: suite {suite!r} has no 'scenarios' object")
        for scenario in result["scenarios"].values():
            if not isinstance(scenario, dict) or not isinstance(scenario.get("name"), str):
                raise Refusal(400, f"{name}: suite {suite!r} has a scenario without a name")
    return data


def report(data: dict[str, Any], name: str = "the evidence") -> Markup:
    """The lab's own HTML for one evidence file (escaped by the renderer)."""
    try:
        return Markup(render_fragment(data))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise Refusal(
            400, f"{name} cannot be shown: a field is missing or of the wrong type ({exc!r})"
        ) from None
