"""Run lab suites, write the evidence, print the report."""

from __future__ import annotations

import datetime as dt
import inspect
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
from oncewire.lab.report import render_text
from oncewire.lab.suites import by_name

__all__ = ["format_report", "run_lab"]

EXPERIMENT = "oncewire-crash-lab-v1"


def _run(ctx: LabContext, names: Sequence[str]) -> dict[str, Any]:
    available = by_name()
    report: dict[str, Any] = {}
    for number, name in enumerate(names, 1):
        suite = available[name]
        started = time.monotonic()
        ctx.progress.line(
            f"[{number}/{len(names)}] {name}: {suite.description}", suite=name, event="started"
        )
        results: list[ScenarioResult] = []
        try:
            produced = suite.run(ctx)
            one_by_one = inspect.isgenerator(produced)
            last = started
            for scenario in produced:
                now = time.monotonic()
                if one_by_one and not scenario.duration_seconds:
                    # Yielded as it finished: the time since the previous one is its own.
                    scenario.duration_seconds = now - last
                last = now
                results.append(scenario)
                _say_scenario(ctx, name, scenario, now - started)
        except Exception as exc:  # a suite that crashes is a failed suite, with its error kept
            failed = ScenarioResult(f"{name}: suite error", passed=False)
            failed.failures.append(f"{type(exc).__name__}: {exc}")
            results.append(failed)
            _say_scenario(ctx, name, failed, time.monotonic() - started)
        passed = all(r.passed for r in results)
        elapsed = time.monotonic() - started
        ctx.progress.line(
            f"[{number}/{len(names)}] {name}: {'pass' if passed else 'FAIL'} "
            f"({len(results)} scenarios, {elapsed:.1f}s)",
            suite=name,
            event="finished",
            passed=passed,
            elapsed_seconds=round(elapsed, 3),
        )
        report[name] = {
            "description": suite.description,
            "passed": passed,
            "duration_seconds": round(elapsed, 3),
            "key_numbers": list(suite.key_numbers),
            "scenarios": {r.name: r.as_dict() for r in results},
        }
    return report


def _say_scenario(ctx: LabContext, suite: str, scenario: ScenarioResult, elapsed: float) -> None:
    mark = "n/a" if scenario.skipped else ("pass" if scenario.passed else "FAIL")
    took = f"{scenario.duration_seconds:.1f}s, " if scenario.duration_seconds else ""
    ctx.progress.line(
        f"  {suite}: {scenario.name} {mark} ({took}{elapsed:.1f}s into the suite)",
        suite=suite,
        scenario=scenario.name,
        verdict=mark,
        elapsed_seconds=round(elapsed, 3),
    )


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
    """The readable table (see :func:`oncewire.lab.report.render_text`)."""
    return render_text(evidence)


def main_exit_code(evidence: dict[str, Any]) -> int:
    return 0 if evidence["passed"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main_exit_code(run_lab()))
