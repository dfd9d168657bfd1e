"""Suite ``group``: eight threads sharing commits (``group_commit=True``), killed at the commit.

A child process runs eight threads on one ledger opened with ``group_commit=True``; each thread
writes its caller row and accepts its effect in one transaction, again and again, and some
callers raise inside their block (rolled back alone). Each thread journals what it did
(:mod:`oncewire.lab.children.group`): ``wrote`` inside the block, ``ok`` after the transaction
returned, ``failed`` after a refused one raised. The child is SIGKILLed at the shared commit's
crash points (before the commit; after it, before any caller of the group is released) and at
random moments. Then the lab reads the caller's store directly:

* for every caller, its row and its effect both exist or neither does;
* every caller that returned (``ok``) is durable, every refused one (``failed``) left nothing;
* nothing is stored that no caller wrote;
* at ``before_commit`` some written caller is lost (the commit never ran), at ``after_commit``
  some durable caller was never told (the kill came between the commit and the release), so the
  kill really fell inside the window it names.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

from oncewire.lab.fixtures import StorePair, rows
from oncewire.lab.framework import LabContext, ProcessRecord, ScenarioResult, Suite

__all__ = ["CHILD", "POINTS", "SUITE", "durable_callers", "read_journal", "run_group"]

CHILD = "oncewire.lab.children.group"
KILLED = -signal.SIGKILL
POINTS = ("storage.group_commit.before_commit", "storage.group_commit.after_commit")
THREADS = 8
PER_THREAD = 40
FAIL_EVERY = 7
HIT = 6  # the shared commit that dies: past the first few, with groups under way
RANDOM_KILLS = 3


def read_journal(path: Path) -> dict[str, set[str]]:
    """The journal's keys by event (``wrote``, ``ok``, ``failed``); a torn last line is
    ignored (the kill cut it)."""
    events: dict[str, set[str]] = {"wrote": set(), "ok": set(), "failed": set()}
    if not path.exists():
        return events
    for line in path.read_text(encoding="utf-8").splitlines():
        event, _, key = line.partition(" ")
        if event in events and key:
            events[event].add(key)
    return events


def durable_callers(pair: StorePair) -> tuple[set[str], set[str]]:
    """The keys of the caller rows and of the effects in the caller's store, read directly, in
    one statement: one snapshot of both tables. Read in two, a transaction the killed process
    had sent its COMMIT for, which the server finishes after the kill, could commit between
    the reads and show a row without its effect that was never stored so."""
    both = rows(
        pair.dialect,
        pair.caller,
        "SELECT 'operation' AS what, id AS key FROM operations "
        "UNION ALL SELECT 'effect' AS what, key FROM oncewire_effects",
    )
    operations = {str(r["key"]) for r in both if r["what"] == "operation"}
    effects = {str(r["key"]) for r in both if r["what"] == "effect"}
    return operations, effects


def _args(pair: StorePair, journal: Path, run: str) -> list[str]:
    return [
        "--caller",
        pair.caller,
        "--journal",
        str(journal),
        "--run",
        run,
        "--threads",
        str(THREADS),
        "--per-thread",
        str(PER_THREAD),
        "--fail-every",
        str(FAIL_EVERY),
    ]


def _check(result: ScenarioResult, pair: StorePair, journal: Path) -> dict[str, Any]:
    """The invariants every cell holds, from the store and the journal; the figures."""
    events = read_journal(journal)
    operations, effects = durable_callers(pair)
    half = sorted(operations ^ effects)
    result.require(not half, f"a caller row without its effect or the reverse: {half[:10]}")
    durable = operations & effects
    lost = sorted(events["ok"] - durable)
    result.require(not lost, f"callers that returned are not durable: {lost[:10]}")
    kept = sorted(events["failed"] & (operations | effects))
    result.require(not kept, f"refused callers left rows: {kept[:10]}")
    invented = sorted((operations | effects) - events["wrote"])
    result.require(not invented, f"rows that no caller wrote: {invented[:10]}")
    return {
        "durable": len(durable),
        "returned": len(events["ok"]),
        "refused": len(events["failed"]),
        "durable_untold": len(durable - events["ok"]),
        "written_lost": len(events["wrote"] - durable - events["failed"]),
        "half_written": len(half),
    }


def _crash_cell(ctx: LabContext, point: str) -> ScenarioResult:
    short = point.rsplit(".", 1)[-1]
    result = ScenarioResult(f"{short}[{ctx.backend.name}]")
    pair = ctx.stores("group", short)
    folder = ctx.root / "group" / short
    journal, token = folder / "journal.txt", folder / "crash.token"
    record = ctx.child(
        "accept", _args(pair, journal, "r0"), arm=f"{point}@{HIT}", token=token, module=CHILD
    )
    result.processes.append(record)
    result.require(record.exit_code == KILLED, f"the child did not die from SIGKILL: {record}")
    result.require(token.exists(), f"{point} was never reached")
    summary = _check(result, pair, journal)
    if short == "before_commit":
        result.require(
            summary["written_lost"] >= 1, "no written caller was lost: the kill was not before it"
        )
    else:
        result.require(
            summary["durable_untold"] >= 1,
            "no durable caller was left untold: the kill was not between commit and release",
        )
    result.summary = {"point": point, "exit_code": record.exit_code, **summary}
    return result


def _random_cell(ctx: LabContext) -> ScenarioResult:
    result = ScenarioResult(f"random_kills[{ctx.backend.name}]")
    rng = random.Random(f"group/{ctx.seed}")
    pair = ctx.stores("group", "random")
    journal = ctx.root / "group" / "random" / "journal.txt"
    kills = 0
    for run in range(RANDOM_KILLS + 1):
        last = run == RANDOM_KILLS
        started = time.monotonic()
        process = ctx.spawn("accept", _args(pair, journal, f"r{run}"), module=CHILD)
        if not last:
            # Killed once it has told a random number of callers, mid-stream.
            told = rng.randint(5, THREADS * PER_THREAD // 2)
            deadline = time.monotonic() + 60
            while (
                sum(key.startswith(f"r{run}-") for key in read_journal(journal)["ok"]) < told
                and process.poll() is None
            ):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.002)
            process.send_signal(signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=120)
        kills += process.returncode == KILLED
        result.processes.append(
            ProcessRecord(
                role="accept",
                argv=[CHILD, f"r{run}"],
                pid=process.pid,
                exit_code=process.returncode,
                response=stdout.strip().splitlines()[-1] if stdout.strip() else None,
                stderr=stderr[-2000:],
                duration_seconds=round(time.monotonic() - started, 4),
            )
        )
        if last:
            result.require(process.returncode == 0, f"the last run failed: {stderr[-500:]}")
            result.require(
                '"errors": []' in stdout, f"a caller of the last run failed: {stdout[-500:]}"
            )
    result.require(kills >= 1, "no run was killed")
    result.summary = {"kills": kills, **_check(result, pair, journal)}
    return result


def run_group(ctx: LabContext) -> list[ScenarioResult]:
    results = []
    for point in POINTS:
        ctx.progress.update(f"group: {point}")
        results.append(_crash_cell(ctx, point))
    ctx.progress.update("group: random kills")
    results.append(_random_cell(ctx))
    return results


SUITE = Suite(
    "group",
    "eight threads sharing commits, SIGKILLed at the shared commit and at random",
    run_group,
    key_numbers=("exit_code", "kills", "durable", "returned", "refused", "durable_untold"),
)
