"""Run lab suites, write the evidence, print the report."""

from __future__ import annotations

import datetime as dt
import json
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oncewire import __version__
from oncewire.core.errors import ConfigurationError
from oncewire.lab.fixtures import Backend
from oncewire.lab.framework import LabContext, Progress, ScenarioResult
from oncewire.lab.suites import by_name

__all__ = ["format_report", "run_lab"]

EXPERIMENT = "oncewire-crash-lab-v1"


def _run(ctx: LabContext, names: Sequence[str]) -> dict[str, Any]:
    available = by_name()
    report: dict[str, Any] = {}
    for name in names:
        started = time.monotonic()
        ctx.progress.update(f"{name}: starting")
        results: list[ScenarioResult] = []
        try:
            for scenario in available[name].run(ctx):
                results.append(scenario)
                mark = "skip" if scenario.skipped else ("ok" if scenario.passed else "FAIL")
                ctx.progress.line(f"  {name}: {scenario.name} ... {mark}")
        except Exception as exc:  # a suite that crashes is a failed suite, with its error kept
            failed = ScenarioResult(f"{name}: suite error", passed=False)
            failed.failures.append(f"{type(exc).__name__}: {exc}")
            results.append(failed)
        report[name] = {
            "description": available[name].description,
            "passed": all(r.passed for r in results),
            "duration_seconds": round(time.monotonic() - started, 3),
            "scenarios": {r.name: r.as_dict() for r in results},
        }
    return report


def run_lab(
    names: Sequence[str] = (),
    *,
    directory: Path | None = None,
    seed: int = 1,
    options: dict[str, Any] | None = None,
    progress: Progress | None = None,
    backend: Backend | None = None,
) -> dict[str, Any]:
    available = by_name()
    chosen = list(names) or list(available)
    unknown = [n for n in chosen if n not in available]
    if unknown:
        raise ConfigurationError(
            f"unknown suite(s): {', '.join(unknown)} (available: {', '.join(available)})"
        )
    started = time.monotonic()
    began = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    progress = progress or Progress()
    backend = backend or Backend()
    if directory is not None:
        try:
            directory.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise ConfigurationError(
                f"--directory {directory} already exists; choose a fresh path"
            ) from None
        ctx = LabContext(directory, seed, options or {}, progress, backend, keep=True)
        report = _run(ctx, chosen)
    else:
        with tempfile.TemporaryDirectory(prefix="oncewire-lab-") as folder:
            ctx = LabContext(Path(folder), seed, options or {}, progress, backend)
            try:
                report = _run(ctx, chosen)
            finally:
                ctx.cleanup()
    return {
        "experiment": EXPERIMENT,
        "oncewire": __version__,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "system": platform.system(),
        "signal": "SIGKILL",
        "backend": backend.name,
        "seed": seed,
        "options": options or {},
        "started_at": began,
        "duration_seconds": round(time.monotonic() - started, 3),
        "directory": str(directory) if directory else None,
        "passed": all(s["passed"] for s in report.values()),
        "suites": report,
    }


def format_report(evidence: dict[str, Any]) -> str:
    lines = []
    counted = skipped = 0
    for name, result in evidence["suites"].items():
        lines.append(f"{name}: {'pass' if result['passed'] else 'FAIL'} ({result['description']})")
        for scenario in result["scenarios"].values():
            if scenario["skipped"]:
                skipped += 1
                lines.append(f"  {scenario['name']}: n/a ({scenario['skipped']})")
                continue
            counted += 1
            summary = json.dumps(scenario["summary"], sort_keys=True)
            lines.append(f"  {scenario['name']}: {summary}")
            for failure in scenario["failures"]:
                lines.append(f"    FAILED: {failure}")
    verdict = "PASS" if evidence["passed"] else "FAIL"
    lines.append(
        f"{verdict}: {counted} scenarios in {len(evidence['suites'])} suite(s)"
        + (f", {skipped} not applicable" if skipped else "")
        + f"; real SIGKILL; {evidence['backend']}; seed {evidence['seed']};"
        + f" {evidence['duration_seconds']:.1f}s"
    )
    return "\n".join(lines)


def main_exit_code(evidence: dict[str, Any]) -> int:
    return 0 if evidence["passed"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main_exit_code(run_lab()))
