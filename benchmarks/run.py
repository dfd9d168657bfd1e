#!/usr/bin/env python3
"""oncewire benchmarks: every figure against a baseline measured in the same run.

    .venv/bin/python benchmarks/run.py [--quick] [--repeat N] [--only NAME]... [--json FILE]
    .venv/bin/python benchmarks/run.py --backend postgresql --db URL [same options]

Each round runs every selected workload once, baselines first, in fresh files in one directory
(one disk, one set of pragmas). A workload compared with the raw SQLite floor is bracketed by two
floor measurements, just before and just after it, and compared with their mean. A figure's value
is the median over the rounds; its ratio is the median of the per-round ratios to its baseline,
so a figure and its baseline were always measured seconds apart. Progress goes to stderr, the
table to stdout.

With ``--backend postgresql`` the figures are PostgreSQL's (postgres.py): the floor is raw
psycopg on the same server, each workload runs in a schema of its own, dropped after it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
try:
    import oncewire
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(HERE.parent / "src"))
    import oncewire

import postgres as pg  # noqa: E402
import workloads as w  # noqa: E402
from common import PRAGMAS  # noqa: E402


@dataclass(frozen=True)
class Target:
    on: str  # "ratio" (to the baseline), "value", or "figure" (to another figure of the run)
    op: str  # ">=" or "<"
    threshold: float
    ref: str | None = None  # on="figure": the figure compared with, round by round
    fallback: float | None = None  # on="figure": a value to reach when ``ref`` was not measured

    def met(self, value: float, ratio: float | None) -> bool:
        measured = ratio if self.on in ("ratio", "figure") else value
        if measured is None:
            return False
        return measured >= self.threshold if self.op == ">=" else measured < self.threshold

    def text(self, figure: Figure) -> str:
        if self.on == "ratio":
            return f"{self.op} {self.threshold:g}x {figure.baseline}"
        if self.on == "figure":
            return f"{self.op} {self.threshold:g}x {self.ref}"
        return f"{self.op} {self.threshold:g} {figure.unit}"


@dataclass(frozen=True)
class Figure:
    name: str
    workload: str
    title: str
    unit: str
    baseline: str | None = None
    target: Target | None = None
    better: str = "higher"  # or "lower"
    optional: bool = False


def _ratio_target(threshold: float) -> Target:
    return Target("ratio", ">=", threshold)


FIGURES: list[Figure] = [
    Figure("floor", "floor", "raw SQLite, 1 INSERT + COMMIT per transaction", "commits/s"),
    Figure(
        "floor_batched",
        "floor_batched",
        "raw SQLite, {batch} INSERTs per COMMIT",
        "rows/s",
        "floor",
    ),
    Figure(
        "accept",
        "accept",
        "Ledger.accept, 1 per transaction",
        "effects/s",
        "floor",
        _ratio_target(0.8),
    ),
    Figure(
        "accept_sql",
        "accept_sql",
        "accept's own INSERT in raw sqlite3 (the real table and indexes), 1 per transaction",
        "effects/s",
        "floor",
    ),
    Figure(
        "e2e_single",
        "e2e_single",
        "accept 1/tx, then dispatch batch_size=1, no-op sink",
        "effects/s",
        "floor",
        _ratio_target(0.5),
    ),
    Figure(
        "e2e_batched",
        "e2e_batched",
        "accept {batch}/tx, then dispatch batch_size={batch}, no-op sink",
        "effects/s",
        "floor",
        _ratio_target(2.0),
    ),
    Figure(
        "e2e_single_receipts",
        "e2e_single_receipts",
        "as e2e_single, sink = ReceiptsSink: Receipts.run_once per effect (2nd file)",
        "effects/s",
        "floor",
        _ratio_target(0.5),
    ),
    Figure(
        "e2e_batched_receipts",
        "e2e_batched_receipts",
        "as e2e_batched, sink = ReceiptsSink: one receiver tx per batch (2nd file)",
        "effects/s",
        "floor",
        _ratio_target(2.0),
    ),
    Figure(
        "huey",
        "huey",
        "Huey SqliteHuey: enqueue 1/tx, then process (reference)",
        "tasks/s",
        "floor",
        optional=True,
    ),
    Figure(
        "start_first_process",
        "start",
        "no crash: new process -> first sink call",
        "s",
        better="lower",
    ),
    Figure(
        "recovery_first_process",
        "recovery",
        "after SIGKILL: new process -> first redelivery",
        "s",
        "start_first_process",
        Target("value", "<", 0.5),
        better="lower",
    ),
    Figure(
        "start_all_process",
        "start",
        "no crash: new process -> all {recovery} done",
        "s",
        better="lower",
    ),
    Figure(
        "recovery_all_process",
        "recovery",
        "after SIGKILL: new process -> all {recovery} done",
        "s",
        "start_all_process",
        better="lower",
    ),
    Figure(
        "start_first_run",
        "start",
        "no crash: Dispatcher.run() -> first sink call",
        "s",
        better="lower",
    ),
    Figure(
        "recovery_first_run",
        "recovery",
        "after SIGKILL: Dispatcher.run() -> first redelivery",
        "s",
        "start_first_run",
        Target("value", "<", 0.5),
        better="lower",
    ),
    Figure(
        "start_all_run",
        "start",
        "no crash: Dispatcher.run() -> all {recovery} done",
        "s",
        better="lower",
    ),
    Figure(
        "recovery_all_run",
        "recovery",
        "after SIGKILL: Dispatcher.run() -> all {recovery} done",
        "s",
        "start_all_run",
        better="lower",
    ),
]
BY_NAME = {figure.name: figure for figure in FIGURES}

# The order workloads run in within a round: baselines before what is compared with them.
WORKLOADS: dict[str, w.Workload] = {
    "floor": w.floor,
    "floor_batched": w.floor_batched,
    "accept": w.accept,
    "accept_sql": w.accept_sql,
    "e2e_single": w.e2e_single,
    "e2e_batched": w.e2e_batched,
    "e2e_single_receipts": w.e2e_single_receipts,
    "e2e_batched_receipts": w.e2e_batched_receipts,
    "huey": w.huey,
    "start": w.start,
    "recovery": w.recovery,
}

SIZES = {
    # single, batched, batch, recovery, recovery_batch
    "full": (3000, 30000, 100, 1000, 100),
    "quick": (200, 2000, 100, 1000, 100),
}

# -- PostgreSQL (--backend postgresql --db URL) ------------------------------------------------

PG_FIGURES: list[Figure] = [
    Figure(
        "floor",
        "floor",
        "raw PostgreSQL (psycopg 3), 1 INSERT + COMMIT per transaction",
        "commits/s",
    ),
    Figure(
        "floor_batched",
        "floor_batched",
        "raw PostgreSQL, {batch} INSERTs per COMMIT",
        "rows/s",
        "floor",
    ),
    Figure("accept", "accept", "Ledger.accept, 1 per transaction", "effects/s", "floor"),
    Figure(
        "pgqueuer_1",
        "pgqueuer_1",
        "PgQueuer {pgqueuer_batch}/dequeue, 1 worker process, {batched} no-op jobs (reference)",
        "jobs/s",
        "floor",
        optional=True,
    ),
    Figure(
        "pgqueuer_2",
        "pgqueuer_2",
        "as pgqueuer_1, 2 worker processes (reference)",
        "jobs/s",
        "floor",
        optional=True,
    ),
    Figure(
        "pgqueuer_2_batch",
        "pgqueuer_2_batch",
        "as pgqueuer_2, batch_size={batch} as oncewire's (reference)",
        "jobs/s",
        "floor",
        optional=True,
    ),
    Figure(
        "e2e_workers_1",
        "e2e_workers_1",
        "{batched} accepted ({batch}/tx) before the clock, 1 dispatcher process, "
        "batch_size={batch}, no-op sink",
        "effects/s",
        "floor",
    ),
    Figure(
        "e2e_workers_2",
        "e2e_workers_2",
        "as e2e_workers_1, 2 dispatcher processes",
        "effects/s",
        "floor",
        Target("figure", ">=", 1.0, ref="pgqueuer_2_batch", fallback=3000.0),
    ),
    Figure(
        "e2e_workers_4",
        "e2e_workers_4",
        "as e2e_workers_1, 4 dispatcher processes",
        "effects/s",
        "floor",
    ),
    Figure(
        "duplicates_pgqueuer",
        "duplicates",
        "PgQueuer, 2 workers, {failover} jobs, one SIGKILLed mid-run: executions beyond 1 per job",
        "jobs",
        better="lower",
        optional=True,
    ),
    Figure(
        "redeliveries_oncewire",
        "duplicates",
        "oncewire, the same kill: sink calls beyond 1 per key (each flagged redelivery)",
        "effects",
        better="lower",
    ),
    Figure(
        "duplicates_oncewire",
        "duplicates",
        "the same run, sink = Receipts.run_once: downstream rows beyond 1 per key",
        "effects",
        "redeliveries_oncewire",
        Target("value", "<", 1),
        better="lower",
    ),
    Figure(
        "failover_none",
        "failover",
        "2 workers, {failover} effects, sink sleeps {failover_delay_ms:g} ms: no kill, "
        "what worker 1 holds -> done",
        "s",
        better="lower",
    ),
    Figure(
        "failover_same_host",
        "failover",
        "the same, worker 1 SIGKILLed; same host, lease 30 s (pid checked at each reap, "
        "at most every 1 s): kill -> all it held done",
        "s",
        "failover_none",
        better="lower",
    ),
    Figure(
        "failover_lease_expiry",
        "failover",
        "the same, owners on another host, lease {lease_expiry:g} s: kill -> all it held done",
        "s",
        "failover_none",
        better="lower",
    ),
    Figure(
        "release_same_host",
        "failover",
        "failover_same_host: kill -> its claims released by the survivor (polled)",
        "s",
        "failover_none",
        better="lower",
    ),
    Figure(
        "release_lease_expiry",
        "failover",
        "failover_lease_expiry: kill -> its claims released by the survivor (polled)",
        "s",
        "failover_none",
        better="lower",
    ),
]

PG_WORKLOADS: dict[str, w.Workload] = {
    "floor": pg.floor,
    "floor_batched": pg.floor_batched,
    "accept": pg.accept,
    "pgqueuer_1": pg.pgqueuer_1,
    "pgqueuer_2": pg.pgqueuer_2,
    "pgqueuer_2_batch": pg.pgqueuer_2_batch,
    "e2e_workers_1": pg.e2e_workers_1,
    "e2e_workers_2": pg.e2e_workers_2,
    "e2e_workers_4": pg.e2e_workers_4,
    "duplicates": pg.duplicates,
    "failover": pg.failover,
}

PG_SIZES = {
    # single, batched, batch, failover
    "full": (3000, 50000, 100, 2000),
    "quick": (300, 1000, 100, 400),
}


@dataclass(frozen=True)
class Catalogue:
    backend: str
    figures: list[Figure]
    workloads: dict[str, w.Workload]

    @property
    def by_name(self) -> dict[str, Figure]:
        return {figure.name: figure for figure in self.figures}


CATALOGUES = {
    "sqlite": Catalogue("sqlite", FIGURES, WORKLOADS),
    "postgresql": Catalogue("postgresql", PG_FIGURES, PG_WORKLOADS),
}


def log(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


# -- selection ---------------------------------------------------------------------------------


def select_figures(only: Sequence[str], cat: Catalogue | None = None) -> list[Figure]:
    """The figures named (by figure or workload name), plus every baseline they need (and the
    figure a target compares with)."""
    cat = cat or CATALOGUES["sqlite"]
    by_name = cat.by_name
    if not only:
        return list(cat.figures)
    wanted: set[str] = set()
    for name in only:
        matches = [f.name for f in cat.figures if name in (f.name, f.workload)]
        if not matches:
            names = ", ".join(dict.fromkeys([*cat.workloads, *by_name]))
            raise SystemExit(f"run.py: unknown figure or workload {name!r} (one of: {names})")
        wanted.update(matches)
    pending = list(wanted)
    while pending:
        figure = by_name[pending.pop()]
        needed = [figure.baseline, figure.target.ref if figure.target else None]
        for other in needed:
            if other is not None and other not in wanted:
                wanted.add(other)
                pending.append(other)
    return [f for f in cat.figures if f.name in wanted]


# -- formatting --------------------------------------------------------------------------------


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value:.3f}"
    return f"{value:,.0f}"


def fmt_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def title(figure: Figure, params: dict[str, Any]) -> str:
    return figure.title.format(**params)


# -- environment -------------------------------------------------------------------------------


def filesystem_of(path: Path) -> str:
    """The filesystem type holding ``path`` (Linux), so a tmpfs run is not mistaken for a disk."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    target, best = str(path.resolve()), ("", "unknown")
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best[0]):
            best = (point, parts[2])
    return best[1]


def git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args],
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment() -> dict[str, Any]:
    return {
        "oncewire": oncewire.__version__,
        "oncewire_path": str(Path(oncewire.__file__).resolve().parent),
        "git_commit": git("rev-parse", "HEAD"),
        # Uncommitted changes under src/ at the start of the run (None outside a checkout).
        "source_modified": None
        if (status := git("status", "--porcelain", "--", "src")) is None
        else bool(status),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


# -- running -----------------------------------------------------------------------------------


def run_rounds(
    figures: list[Figure],
    args: argparse.Namespace,
    workdir: Path,
    params: dict[str, Any],
    cat: Catalogue | None = None,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str], dict[str, dict[str, Any]]]:
    """Run every round. Returns per-figure samples (value + details), the notes of skipped
    workloads, and the pragmas each engine was seen to run with.

    A workload compared with the floor is bracketed: the floor is measured again right after it,
    and its baseline for that round is the mean of the floors just before and just after. On a
    machine whose speed drifts (a neighbour starts a build), the comparison stays local.
    """
    cat = cat or CATALOGUES["sqlite"]
    by_name = cat.by_name
    wanted = {f.name for f in figures}
    order = [name for name in cat.workloads if any(f.workload == name for f in figures)]
    samples: dict[str, list[dict[str, Any]]] = {f.name: [] for f in figures}
    skipped: dict[str, str] = {}
    pragmas: dict[str, dict[str, Any]] = {}

    def run_one(round_no: int, name: str, label: str) -> dict[str, w.Sample] | None:
        where = workdir / f"r{round_no}-{label}"
        where.mkdir()
        ctx = w.Context(
            workdir=where,
            single=params["single"],
            batched=params["batched"],
            batch=params["batch"],
            recovery=params.get("recovery", 0),
            recovery_batch=params.get("recovery_batch", 0),
            url=getattr(args, "db", None),
            failover=params.get("failover", 0),
            keep=args.keep,
        )
        prefix = f"[{round_no}/{args.repeat}]"
        log(f"{prefix} {label} ...")
        started = time.perf_counter()
        try:
            produced = cat.workloads[name](ctx)
        except w.Skip as exc:
            skipped[name] = str(exc)
            log(f"{prefix} {label}: skipped: {exc}")
            return None
        finally:
            pragmas.update(ctx.pragmas)
            skipped.update(ctx.notes)
            if not args.keep:
                shutil.rmtree(where, ignore_errors=True)
        elapsed = time.perf_counter() - started
        for figure_name, sample in produced.items():
            if figure_name in wanted:
                unit = by_name[figure_name].unit
                log(f"{prefix}   {figure_name:<24} {fmt_value(sample.value, unit):>10} {unit}")
        log(f"{prefix} {label} took {elapsed:.1f} s")
        return produced

    for round_no in range(1, args.repeat + 1):
        floor_before: float | None = None
        for name in order:
            if name in skipped:
                continue
            produced = run_one(round_no, name, name)
            if produced is None:
                continue
            if name == "floor":
                floor_before = produced["floor"].value
            bracketed = name != "floor" and any(
                f in wanted and by_name[f].baseline == "floor" for f in produced
            )
            extra: dict[str, Any] = {}
            if bracketed:
                after = run_one(round_no, "floor", f"floor-after-{name}")
                assert after is not None
                floor_after = after["floor"].value
                samples["floor"].append(
                    {"value": floor_after, **after["floor"].details, "after": name}
                )
                before = floor_after if floor_before is None else floor_before
                extra = {
                    "baseline_value": (before + floor_after) / 2,
                    "floor_before": before,
                    "floor_after": floor_after,
                }
                floor_before = floor_after
            for figure_name, sample in produced.items():
                if figure_name not in wanted:
                    continue
                figure_extra = extra if by_name[figure_name].baseline == "floor" else {}
                samples[figure_name].append(
                    {"value": sample.value, **sample.details, **figure_extra}
                )
    return samples, skipped, pragmas


def summarise(
    figures: list[Figure],
    samples: dict[str, list[dict[str, Any]]],
    skipped: dict[str, str],
    params: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """Medians per figure. A figure without a baseline is its own (ratio 1)."""
    results: dict[str, dict[str, Any]] = {}
    for figure in figures:
        rounds = samples[figure.name]
        baseline = figure.baseline or figure.name
        entry: dict[str, Any] = {
            "title": title(figure, params),
            "workload": figure.workload,
            "unit": figure.unit,
            "better": figure.better,
            "baseline": baseline,
            "target": figure.target.text(figure) if figure.target else None,
        }
        base_rounds = samples.get(baseline, [])
        if not rounds or not base_rounds:
            entry.update(
                value=None,
                ratio=None,
                met=None,
                skipped=True,
                note=skipped.get(figure.name) or skipped.get(figure.workload, "not measured"),
            )
            results[figure.name] = entry
            continue
        values = [r["value"] for r in rounds]
        if baseline == figure.name:
            bases = values
        elif all("baseline_value" in r for r in rounds):  # bracketed by floors
            bases = [r["baseline_value"] for r in rounds]
        else:  # a baseline workload that ran right before, once per round
            bases = [b["value"] for b in base_rounds]
        ratios = [v / b for v, b in zip(values, bases, strict=True) if b > 0]
        value = statistics.median(values)
        ratio = statistics.median(ratios) if ratios else None
        commits = rounds[0].get("commits_per_effect")
        entry.update(
            value=value,
            ratio=ratio,
            baseline_value=statistics.median(bases),
            met=figure.target.met(value, ratio) if figure.target else None,
            target_detail=(
                {
                    "on": figure.target.on,
                    "op": figure.target.op,
                    "threshold": figure.target.threshold,
                }
                if figure.target
                else None
            ),
            # The ratio to the floor that an implementation would reach if each of its commits
            # cost exactly one floor commit and nothing else cost anything: 1 / commits per item.
            commit_bound=round(1 / commits, 3) if commits and baseline == "floor" else None,
            skipped=False,
            runs=values,
            ratios=ratios,
            rounds=rounds,
        )
        results[figure.name] = entry
    for figure in figures:  # targets set against another figure of the same run
        target, entry = figure.target, results[figure.name]
        if target is None or target.on != "figure" or entry["skipped"]:
            continue
        ref = results.get(target.ref or "")
        if ref is None or ref["skipped"]:
            if target.fallback is None:
                entry["met"] = None
                continue
            fallback = Target("value", target.op, target.fallback)
            entry["target"] = f"{fallback.text(figure)} ({target.ref} not measured)"
            entry["met"] = fallback.met(entry["value"], None)
            continue
        pairs = zip(entry["runs"], ref["runs"], strict=False)
        versus = [v / r for v, r in pairs if r > 0]
        entry["target_ratio"] = statistics.median(versus) if versus else None
        entry["met"] = target.met(entry["value"], entry["target_ratio"])
    return results


PHASES = {
    "accept_rate": "accept",
    "dispatch_rate": "dispatch",
    "enqueue_rate": "enqueue",
    "process_rate": "process",
}


def table(results: dict[str, dict[str, Any]], header: list[str]) -> str:
    rows = [("figure", "value", "unit", "vs", "ratio", "bound", "target", "met", "what")]
    for name, r in results.items():
        if r["skipped"]:
            rows.append((name, "skipped", r["unit"], "-", "-", "-", "-", "-", r["title"]))
            continue
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        bound = "-" if r.get("commit_bound") is None else f"{r['commit_bound']:.2f}x"
        rows.append(
            (
                name,
                fmt_value(r["value"], r["unit"]),
                r["unit"],
                "(itself)" if r["baseline"] == name else r["baseline"],
                fmt_ratio(r["ratio"]),
                bound,
                (r["target"] or "-")
                + (f" ({r['target_ratio']:.2f}x)" if r.get("target_ratio") is not None else ""),
                met,
                r["title"],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {1, 4, 5}
    lines = list(header)
    for index, row in enumerate(rows):
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths).rstrip())
    phases = []
    for name, r in results.items():
        parts = [
            f"{label} {statistics.median(x[key] for x in r['rounds']):,.0f}/s"
            for key, label in PHASES.items()
            if not r["skipped"] and key in r["rounds"][0]
        ]
        if parts:
            phases.append(f"  {name}: {', '.join(parts)}")
    if phases:
        lines += ["", "phases (medians):", *phases]
    notes = [f"  {name}: {r['note']}" for name, r in results.items() if r["skipped"]]
    if notes:
        lines += ["", "skipped:", *notes]
    return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmarks/run.py",
        description="oncewire throughput and recovery, each against a baseline from the same run.",
    )
    parser.add_argument(
        "--backend",
        choices=sorted(CATALOGUES),
        default="sqlite",
        help="which figures: SQLite's (default) or PostgreSQL's (needs --db)",
    )
    parser.add_argument(
        "--db",
        metavar="URL",
        help="postgresql://... a database the run may create and drop schemas in",
    )
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument(
        "--repeat", type=int, default=3, metavar="N", help="rounds; report medians (default 3)"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="a figure or workload to run (repeatable); baselines come along",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    parser.add_argument(
        "--dir", metavar="DIR", help="where the database files go (default: a new temp directory)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the database files")
    parser.add_argument("--single", type=int, metavar="N", help="effects per 1-per-tx workload")
    parser.add_argument("--batched", type=int, metavar="N", help="effects per batched workload")
    parser.add_argument("--recovery", type=int, metavar="N", help="effects claimed, then killed")
    parser.add_argument(
        "--failover", type=int, metavar="N", help="effects in the PostgreSQL kill workloads"
    )
    parser.add_argument("--list", action="store_true", help="list the figures and exit")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.backend == "postgresql" and not args.db and not args.list:
        parser.error("--backend postgresql needs --db URL")
    if args.db and args.backend != "postgresql":
        parser.error("--db is for --backend postgresql")
    for option in ("single", "batched", "recovery", "failover"):
        value = getattr(args, option)
        if value is not None and value < 1:
            parser.error(f"--{option} must be at least 1")
    return args


def redact(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def parameters(args: argparse.Namespace) -> dict[str, Any]:
    size = "quick" if args.quick else "full"
    if args.backend == "postgresql":
        single, batched, batch, failover = PG_SIZES[size]
        return {
            "single": args.single or single,
            "batched": args.batched or batched,
            "batch": batch,
            "failover": args.failover or failover,
            "failover_delay_ms": pg.FAILOVER_SINK_DELAY * 1000,
            "failover_batch": pg.FAILOVER_BATCH,
            "lease_expiry": pg.LEASE_EXPIRY_SECONDS,
            "pgqueuer_batch": pg.PGQUEUER_BATCH,
        }
    single, batched, batch, recovery, recovery_batch = SIZES[size]
    return {
        "single": args.single or single,
        "batched": args.batched or batched,
        "batch": batch,
        "recovery": args.recovery or recovery,
        "recovery_batch": recovery_batch,
    }


METHOD = {
    "sqlite": (
        "each round runs every selected workload once, baselines first, in fresh "
        "files in one directory; a workload compared with the floor is bracketed by "
        "floor measurements just before and after it and compared with their mean; "
        "value = median over rounds (the floor: over all its measurements); ratio = "
        "median of the per-round ratios. End-to-end workloads are sequential: "
        "accept all, then "
        "Dispatcher.run(until_idle=True); the clock runs from the first accept to "
        "the return of run(), when every effect is done and recorded."
    ),
    "postgresql": (
        "each round runs every selected workload once, baselines first, each in a new schema "
        "on one server, dropped after it; a workload compared with the floor is bracketed by "
        "floor measurements just before and after it and compared with their mean; value = "
        "median over rounds; ratio = median of the per-round ratios. Worker workloads: the "
        "effects (jobs) are accepted (enqueued) before the clock; worker processes connect, "
        "then start together; the clock runs from that start to the last settlement recorded "
        "in the database (oncewire: MAX(updated_at); PgQueuer: MAX(created) of its log), and "
        "the database is checked for every effect done."
    ),
}


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    cat = CATALOGUES[args.backend]
    params = parameters(args)
    if args.list:
        for figure in cat.figures:
            print(f"{figure.name:<24} ({figure.workload}) {title(figure, params)}")
        return 0
    if any(key.startswith("ONCEWIRE_CRASH") for key in os.environ):
        log("run.py: a crash point is armed in the environment (ONCEWIRE_CRASH*); unset it first")
        return 2
    figures = select_figures(args.only, cat)
    server: dict[str, Any] = {}
    if args.backend == "postgresql":
        try:
            import psycopg

            with psycopg.connect(args.db, autocommit=True, connect_timeout=10) as conn:
                server = pg.server_settings(conn)
        except Exception as exc:
            log(f"run.py: cannot use the PostgreSQL server at {redact(args.db)}: {exc}")
            return 1
        wrong = {k: server[k] for k, v in pg.DURABILITY.items() if server[k] != v}
        if wrong:
            log(f"run.py: the server runs with {wrong}, not {pg.DURABILITY}: not comparable")
            return 2

    if args.dir:
        root = Path(args.dir)
        root.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="oncewire-bench-", dir=root))
    else:
        workdir = Path(tempfile.mkdtemp(prefix="oncewire-bench-"))
    env = environment()
    if server:
        env["postgresql"] = server["server_version"]
    fs = filesystem_of(workdir)
    where = f"server {redact(args.db)}" if args.db else f"files in {workdir} ({fs})"
    log(f"oncewire benchmarks: {len(figures)} figures, {args.repeat} round(s), {where}")
    started = time.perf_counter()
    try:
        samples, skipped, pragmas = run_rounds(figures, args, workdir, params, cat)
    except w.BenchmarkError as exc:
        log(f"run.py: {exc}")
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    results = summarise(figures, samples, skipped, params)
    elapsed = time.perf_counter() - started

    header = [
        f"oncewire {env['oncewire']} benchmarks ({args.backend}), median of {args.repeat} "
        f"round(s), {elapsed:.0f} s in all",
        f"Python {env['python']}, "
        + (f"PostgreSQL {server['server_version']}" if server else f"SQLite {env['sqlite']}")
        + f", {env['platform']}, {env['cpu_count']} CPUs, {env['date']}",
        f"oncewire from {env['oncewire_path']}"
        + (f", commit {env['git_commit'][:12]}" if env["git_commit"] else "")
        + (", with uncommitted changes under src/" if env["source_modified"] else ""),
    ]
    if server:
        settings = ", ".join(f"{k}={v}" for k, v in server.items() if k != "server_version")
        header.append(
            f"server: {redact(args.db)}, a new schema per workload; {settings} "
            f"(checked on {', '.join(sorted(pragmas)) or 'no'} connections)"
        )
    else:
        shown = {**PRAGMAS, "synchronous": f"FULL ({PRAGMAS['synchronous']})"}
        pragma_text = ", ".join(f"{k}={v}" for k, v in shown.items())
        header.append(
            f"files: {workdir} ({fs}); every engine ran with {pragma_text} "
            f"({', '.join(sorted(pragmas)) or 'none'})"
        )
    header += [
        "ratio: median of per-round ratios to the baseline (vs; the floor is measured just "
        "before and after each workload compared with it)",
        "bound: the ratio if every commit cost one floor commit and nothing else cost anything",
        "",
    ]
    print(table(results, header))

    if args.json:
        document = {
            "environment": env,
            "parameters": {
                **params,
                "backend": args.backend,
                "repeat": args.repeat,
                "quick": args.quick,
                "only": args.only,
                "workdir": str(workdir),
                **(
                    {"server": redact(args.db), "server_settings": server}
                    if server
                    else {"filesystem": fs, "pragmas": PRAGMAS}
                ),
                "pragmas_seen": pragmas,
                "method": METHOD[args.backend],
            },
            "elapsed_seconds": elapsed,
            "figures": results,
        }
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
