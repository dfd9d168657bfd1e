"""Suite ``torture``: many effects, a dispatcher SIGKILLed at random moments, then drained.

Seeded (``--seed``): the kill times and the sink's misbehaviour (refusals before writing,
answers lost after committing) are drawn from it, so a failing run can be replayed. Runs once
with receipts and once without. Invariants, read from both stores:

* no effect lost: every accepted key is in the outbox, every effect terminal, none claimed;
* with receipts: exactly one ticket per done key (at most one for a dead one);
* without receipts: every ticket beyond the first for a key carries the redelivery flag.

The evidence keeps a timeline for the report's chart: effects done, counted in the caller's
store every so often while the dispatchers run (at most ``MAX_POINTS`` samples: past that every
other one is dropped and the interval doubles), and the time each SIGKILL was sent.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from oncewire.lab.fixtures import StorePair, accept_all, rows, snapshot
from oncewire.lab.framework import LabContext, Progress, ScenarioResult, Suite

__all__ = ["SUITE", "run_torture"]

DEFAULT_OPERATIONS = 400
DEFAULT_KILLS = 8
MAX_POINTS = 300
FIRST_INTERVAL_SECONDS = 0.1


class Timeline:
    """Effects done over time, sampled from the caller's store in a thread of its own."""

    def __init__(
        self,
        stores: StorePair,
        name: str,
        progress: Progress,
        total: Callable[[], int],
        kills: Callable[[], int],
        kills_wanted: int,
    ) -> None:
        self.stores = stores
        self.name = name
        self.progress = progress
        self.total = total
        self.kills = kills
        self.kills_wanted = kills_wanted
        self.started = time.monotonic()
        self.interval = FIRST_INTERVAL_SECONDS
        self.points: list[tuple[float, int, int]] = []  # (seconds, effects done, kills so far)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lab-timeline", daemon=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # a read that failed is a point not taken, never a guess
                continue

    def sample(self) -> None:
        found = rows(
            self.stores.dialect,
            self.stores.caller,
            "SELECT COUNT(*) AS n FROM oncewire_effects WHERE state = 'done'",
        )
        done, kills, at = int(found[0]["n"]), self.kills(), self.elapsed()
        with self._lock:
            self.points.append((round(at, 3), done, kills))
            if len(self.points) > MAX_POINTS:
                self.points = self.points[::2]
                self.interval *= 2
        self.progress.update(
            f"  {self.name}: {done}/{self.total()} effects done, "
            f"{kills}/{self.kills_wanted} kills, {at:.1f}s",
            scenario=self.name,
            done=done,
            total=self.total(),
            kills=kills,
            elapsed_seconds=round(at, 3),
        )

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            points = list(self.points)
        return {
            "total": self.total(),
            "t": [p[0] for p in points],
            "done": [p[1] for p in points],
            "kills": [p[2] for p in points],
        }


def _scenario(ctx: LabContext, deduplicate: bool) -> ScenarioResult:
    seed = ctx.seed
    operations = int(ctx.options.get("operations") or DEFAULT_OPERATIONS or 0)
    kills_option = ctx.options.get("kills")
    kills_wanted = DEFAULT_KILLS if kills_option is None else int(kills_option)
    mode = "dedup" if deduplicate else "no_dedup"
    result = ScenarioResult(f"torture[{mode}]")
    stores = ctx.stores("torture", mode)
    keys = accept_all(stores, operations)
    rng = random.Random(f"torture/{seed}/{mode}")
    args = [*stores.args(), "--seed", str(seed), "--concurrency", "2"]
    if not deduplicate:
        args.append("--no-deduplication")

    kills: list[dict[str, Any]] = []
    finished_early = 0
    timeline = Timeline(
        stores, result.name, ctx.progress, lambda: len(keys), lambda: len(kills), kills_wanted
    )
    timeline.start()
    for round_number in range(kills_wanted * 3):
        if len(kills) >= kills_wanted:
            break
        delay = rng.uniform(0.005, 0.25)
        process = ctx.spawn("torture", args)
        assert process.stdout is not None
        process.stdout.readline()  # "ready": imports done, stores open, about to dispatch
        time.sleep(delay)
        signalled_at = None
        if process.poll() is None:
            signalled_at = timeline.elapsed()
            process.send_signal(signal.SIGKILL)
        process.communicate()
        if process.returncode == -signal.SIGKILL:
            kills.append(
                {
                    "round": round_number,
                    "pid": process.pid,
                    "after_seconds": round(delay, 3),
                    "at_seconds": round(signalled_at or timeline.elapsed(), 3),
                }
            )
        else:
            finished_early += 1
            result.require(
                process.returncode == 0, f"a dispatcher failed: exit {process.returncode}"
            )
            # It drained before the kill landed: give the next round fresh work to interrupt.
            keys += accept_all(stores, max(20, operations // max(1, kills_wanted)), len(keys))
    try:
        final = ctx.child("torture", args, deadline_seconds=300)
    finally:
        timeline.stop()
    result.processes.append(final)
    result.require(final.exit_code == 0, f"the final dispatcher failed: {final.stderr[-500:]}")

    after = snapshot(stores)
    effects = {e["key"]: e for e in after["effects"]}
    result.require(sorted(effects) == keys, "an accepted effect is missing from the outbox")
    states = Counter(e["state"] for e in after["effects"])
    result.require(
        set(states) <= {"done", "dead"}, f"effects left in non-terminal states: {dict(states)}"
    )
    per_key = Counter(t["operation_id"] for t in after["tickets"])
    result.require(set(per_key) <= set(keys), "a ticket names a key that was never accepted")
    if deduplicate:
        for key, effect in effects.items():
            count = per_key.get(key, 0)
            if effect["state"] == "done":
                result.require(count == 1, f"{key}: {count} tickets for a done effect")
            else:
                result.require(count <= 1, f"{key}: {count} tickets for a dead effect")
    else:
        for key, effect in effects.items():
            if effect["state"] == "done":
                result.require(per_key.get(key, 0) >= 1, f"{key}: done without a ticket")
        seen: set[str] = set()
        for ticket in after["tickets"]:
            if ticket["operation_id"] in seen:
                result.require(
                    ticket["redelivery"] == 1,
                    f"ticket {ticket['id']} duplicates {ticket['operation_id']} unflagged",
                )
            seen.add(ticket["operation_id"])
    result.require(len(kills) >= min(1, kills_wanted), "no kill landed while work remained")
    result.summary = {
        "seed": seed,
        "operations": len(keys),
        "lost": len(set(keys) - set(effects)),
        "kills": len(kills),
        "finished_before_kill": finished_early,
        "states": dict(states),
        "tickets": len(after["tickets"]),
        "duplicates": sum(n - 1 for n in per_key.values()),
        "flagged_redeliveries": sum(t["redelivery"] for t in after["tickets"]),
        "max_attempts_used": max((e["attempts"] for e in after["effects"]), default=0),
    }
    result.details = {"kills": kills, "timeline": timeline.as_dict()}
    return result


def run_torture(ctx: LabContext) -> Iterator[ScenarioResult]:
    yield _scenario(ctx, True)
    yield _scenario(ctx, False)


SUITE = Suite(
    "torture",
    "seeded random SIGKILLs of a busy dispatcher, with and without receipts",
    run_torture,
    key_numbers=(
        "operations",
        "kills",
        "states.done",
        "states.dead",
        "lost",
        "duplicates",
        "flagged_redeliveries",
    ),
)
