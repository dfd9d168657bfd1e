"""The lab page: an evidence file (``oncewire lab --output ev.json``) read back for a person.

Each suite with its verdict, each scenario with its summary figures, the invariants that
failed (the evidence's ``failures``), the child processes it ran and how many of them were
SIGKILLed, and for the torture suite a chart of the kills (the delay after which each round's
dispatcher was killed). Only what the file says: nothing is recomputed from a store.
"""

from __future__ import annotations

import json
import signal
from typing import Any

from markupsafe import Markup

from oncewire.ui import charts
from oncewire.ui.guard import Refusal

__all__ = ["parse", "report"]

MAX_BYTES = 64 * 1024 * 1024


def parse(raw: bytes, name: str) -> dict[str, Any]:
    """Evidence JSON, or a :class:`Refusal` saying what is wrong with the file."""
    if len(raw) > MAX_BYTES:
        raise Refusal(413, f"{name} is larger than {MAX_BYTES // (1024 * 1024)} MiB")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise Refusal(400, f"{name} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("suites"), dict):
        raise Refusal(
            400,
            f"{name} is not lab evidence: no 'suites' object (oncewire lab --output writes one)",
        )
    for suite, result in data["suites"].items():
        if not isinstance(result, dict) or not isinstance(result.get("scenarios"), dict):
            raise Refusal(400, f"{name}: suite {suite!r} has no 'scenarios' object")
    return data


def _killed(process: dict[str, Any]) -> bool:
    return process.get("exit_code") == -signal.SIGKILL


def _scenario(s: dict[str, Any]) -> dict[str, Any]:
    processes = [p for p in s.get("processes") or [] if isinstance(p, dict)]
    kills = (s.get("details") or {}).get("kills") if isinstance(s.get("details"), dict) else None
    kills = [k for k in kills or [] if isinstance(k, dict)]
    chart = Markup("")
    if kills:
        chart = charts.columns(
            "seconds each round's dispatcher ran before its SIGKILL (ms)",
            [f"r{k.get('round', i)}" for i, k in enumerate(kills)],
            [
                charts.Series(
                    "ms before the kill",
                    "#dc2626",
                    [int(1000 * float(k.get("after_seconds") or 0)) for k in kills],
                )
            ],
            every=1,
        )
    return {
        "name": str(s.get("name", "")),
        "passed": bool(s.get("passed")),
        "skipped": s.get("skipped") or "",
        "summary": sorted((str(k), json.dumps(v)) for k, v in (s.get("summary") or {}).items()),
        "failures": [str(f) for f in s.get("failures") or []],
        "processes": len(processes),
        "killed": sum(1 for p in processes if _killed(p)) + len(kills),
        "roles": sorted({str(p.get("role", "")) for p in processes}),
        "duration": s.get("duration_seconds"),
        "chart": chart,
    }


def report(data: dict[str, Any]) -> dict[str, Any]:
    """The page's view of one evidence file."""
    suites = []
    for name, result in data["suites"].items():
        scenarios = [_scenario(s) for s in result["scenarios"].values() if isinstance(s, dict)]
        suites.append(
            {
                "name": name,
                "description": result.get("description", ""),
                "passed": bool(result.get("passed")),
                "duration": result.get("duration_seconds"),
                "scenarios": scenarios,
                "killed": sum(s["killed"] for s in scenarios),
                "chart": charts.bars(
                    f"{name}: scenarios",
                    [
                        ("passed", sum(1 for s in scenarios if s["passed"] and not s["skipped"])),
                        ("failed", sum(1 for s in scenarios if not s["passed"])),
                        ("not applicable", sum(1 for s in scenarios if s["skipped"])),
                    ],
                    colours={"passed": "#16a34a", "failed": "#dc2626", "not applicable": "#9ca3af"},
                ),
            }
        )
    return {
        "passed": bool(data.get("passed")),
        "meta": [
            (k, str(data[k]))
            for k in ("backend", "seed", "signal", "oncewire", "python", "started_at")
            if k in data
        ],
        "duration": data.get("duration_seconds"),
        "suites": suites,
        "killed": sum(s["killed"] for s in suites),
    }
