"""Suite ``torture``: many effects, dispatchers SIGKILLed at random moments, then drained.

``--workers N`` dispatcher processes (one by default) work the same outbox at once. Each kill
lands when a seeded number of effects is finished (the marks are drawn up front, spread over
the first 90 % of the work), so a long run's kills are spread over it whatever the machine's
speed, and always while work remains; the victim is a random worker that is dispatching, and
it is replaced at once. After the last kill the workers drain what is left and leave, and one
more dispatcher must find nothing to claim.

Seeded (``--seed``): the marks, the victims and the sink's misbehaviour (refusals before
writing, answers lost after committing) are drawn from it. Runs once with receipts and once
without. Invariants, read from both stores as set-based statements (a run of 10,000 effects is
checked in one query, not a loop over keys):

* no effect lost: every accepted operation has its effect, every effect is terminal;
* no ticket for a key that was never accepted, no effect done without its ticket;
* with receipts: one ticket per key, one receipt per ticketed key, and each done effect's
  result names its ticket;
* without receipts: every ticket beyond the first for a key carries the redelivery flag.

The evidence keeps a timeline for the report's chart: effects done, counted in the caller's
store every so often while the dispatchers run (at most ``MAX_POINTS`` samples: past that every
other one is dropped and the interval doubles), and the time each SIGKILL was sent.
"""

from __future__ import annotations

import random
import select
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from oncewire.lab.fixtures import StorePair, accept_all, reading_both, rows
from oncewire.lab.framework import LabContext, Progress, ScenarioResult, Suite

__all__ = ["SUITE", "Workers", "check_stores", "run_torture"]

DEFAULT_OPERATIONS = 400
DEFAULT_KILLS = 8
DEFAULT_WORKERS = 1
DRAIN_DEADLINE_SECONDS = 600.0
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


class Workers:
    """The dispatcher processes of one run: ``size`` of them dispatch until the work is done.

    Each worker starts as a spare (``--standby``): it imports oncewire, opens both stores, says
    "ready" and waits for SIGUSR1. The lab keeps one spare more than ``size``, so a worker
    killed (or one that left early) is replaced at once by a spare told to go, as a supervisor
    would restart it, without the run waiting for a new Python process to import oncewire.
    Only a dispatching worker is a kill's target.
    """

    def __init__(self, ctx: LabContext, args: list[str], size: int, folder: Path) -> None:
        self.ctx, self.args, self.size, self.folder = ctx, [*args, "--standby"], size, folder
        self.live: list[subprocess.Popen[str]] = []  # dispatching
        self.spares: list[subprocess.Popen[str]] = []  # starting or waiting for SIGUSR1
        self.ready: set[int] = set()  # spares that said "ready"
        self.started = 0
        self.retired = 0  # spares ended unused when the kills were over
        self.exits: Counter[int] = Counter()  # exit codes of the workers that left by themselves
        self.failures: list[str] = []

    def fill(self, *, spare: bool = True) -> None:
        """Tell ready spares to go while fewer than ``size`` dispatch; keep one spare more."""
        for waiting in [p for p in self.spares if p.pid in self.ready]:
            if len(self.live) >= self.size:
                break
            waiting.send_signal(signal.SIGUSR1)
            self.spares.remove(waiting)
            self.live.append(waiting)
        while len(self.live) + len(self.spares) < self.size + int(spare):
            self.spares.append(
                self.ctx.spawn("torture", self.args, stderr_to=self.folder / "workers.log")
            )
            self.started += 1

    def poll(self) -> None:
        """Note the spares that said "ready" and collect the processes that left."""
        for spare in list(self.spares):
            if spare.pid not in self.ready and _readable(spare):
                assert spare.stdout is not None
                if spare.stdout.readline().strip() == "ready":
                    self.ready.add(spare.pid)
            if spare.poll() is not None:
                self.spares.remove(spare)
                self._collect(spare)
        for process in list(self.live):
            if process.poll() is not None:
                self.live.remove(process)
                self._collect(process)

    def _collect(self, process: subprocess.Popen[str]) -> None:
        process.communicate()
        self.ready.discard(process.pid)
        self.exits[process.returncode] += 1
        if process.returncode != 0:
            self.failures.append(f"worker {process.pid} exited {process.returncode}")

    def targets(self) -> list[subprocess.Popen[str]]:
        return [p for p in self.live if p.poll() is None]

    def kill(self, victim: subprocess.Popen[str]) -> None:
        victim.send_signal(signal.SIGKILL)
        victim.communicate()
        self.live.remove(victim)

    def retire_spares(self) -> None:
        """End the spares that never dispatched (SIGTERM: they are waiting, holding nothing)."""
        for spare in self.spares:
            spare.terminate()
            spare.communicate()
        self.retired += len(self.spares)
        self.spares.clear()

    def wait(self, deadline_seconds: float) -> None:
        """Let the dispatching workers finish (each leaves when nothing is left to do)."""
        self.retire_spares()
        deadline = time.monotonic() + deadline_seconds
        while self.live and time.monotonic() < deadline:
            self.poll()
            time.sleep(0.02)
        for process in list(self.live):  # past the deadline: a failure, never left running
            process.kill()
            process.communicate()
            self.live.remove(process)
            self.failures.append(f"worker {process.pid} still running after {deadline_seconds}s")


def _readable(process: subprocess.Popen[str]) -> bool:
    assert process.stdout is not None
    return bool(select.select([process.stdout], [], [], 0)[0])


def _terminal(query: Callable[[str], list[dict[str, Any]]]) -> int:
    found = query("SELECT COUNT(*) AS n FROM {c}oncewire_effects WHERE state IN ('done', 'dead')")
    return int(found[0]["n"])


# Read from both stores at the end, each one statement over every key (see reading_both).
COUNTS = """
SELECT
  (SELECT COUNT(*) FROM {c}operations) AS operations,
  (SELECT COUNT(*) FROM {c}oncewire_effects) AS effects,
  (SELECT COUNT(*) FROM {c}operations o
     WHERE NOT EXISTS (SELECT 1 FROM {c}oncewire_effects e WHERE e.key = o.id)) AS lost,
  (SELECT COUNT(*) FROM {c}oncewire_effects e
     WHERE NOT EXISTS (SELECT 1 FROM {c}operations o WHERE o.id = e.key)) AS unaccepted,
  (SELECT COUNT(*) FROM {c}oncewire_effects WHERE state NOT IN ('done', 'dead')) AS open,
  (SELECT COALESCE(MAX(attempts), 0) FROM {c}oncewire_effects) AS max_attempts_used,
  (SELECT COUNT(*) FROM {d}tickets) AS tickets,
  (SELECT COUNT(DISTINCT operation_id) FROM {d}tickets) AS ticketed_keys,
  (SELECT COALESCE(SUM(redelivery), 0) FROM {d}tickets) AS flagged_redeliveries,
  (SELECT COUNT(*) FROM {d}tickets t
     WHERE NOT EXISTS (SELECT 1 FROM {c}operations o WHERE o.id = t.operation_id)) AS stray,
  (SELECT COUNT(*) FROM {c}oncewire_effects e WHERE e.state = 'done'
     AND NOT EXISTS (SELECT 1 FROM {d}tickets t WHERE t.operation_id = e.key))
     AS done_without_ticket,
  (SELECT COUNT(*) FROM (SELECT redelivery,
       ROW_NUMBER() OVER (PARTITION BY operation_id ORDER BY id) AS n FROM {d}tickets) x
     WHERE x.n > 1 AND x.redelivery = 0) AS unflagged_duplicates,
  (SELECT COUNT(*) FROM {d}oncewire_receipts) AS receipts,
  (SELECT COUNT(*) FROM {d}oncewire_receipts r
     WHERE NOT EXISTS (SELECT 1 FROM {d}tickets t WHERE t.operation_id = r.key))
     AS receipts_without_ticket,
  (SELECT COUNT(*) FROM {c}oncewire_effects e JOIN {d}tickets t ON t.operation_id = e.key
     WHERE e.state = 'done' AND e.result <> '{{"ticket_id":' || t.id || '}}')
     AS results_not_naming_their_ticket
"""
STATES = "SELECT state, COUNT(*) AS n FROM {c}oncewire_effects GROUP BY state ORDER BY state"


def check_stores(
    result: ScenarioResult, pair: StorePair, accepted: int, deduplicate: bool
) -> tuple[dict[str, int], dict[str, int]]:
    """The invariants, read from both stores; returns the counts and the effects' states."""
    with reading_both(pair) as query:
        counts = {k: int(v) for k, v in query(COUNTS)[0].items()}
        states = {row["state"]: int(row["n"]) for row in query(STATES)}
    result.require(
        counts["operations"] == counts["effects"] == accepted,
        f"{accepted} accepted, {counts['operations']} operations, {counts['effects']} effects",
    )
    result.require(counts["lost"] == 0, f"{counts['lost']} accepted effect(s) missing")
    result.require(counts["unaccepted"] == 0, "an effect has no operation row")
    result.require(counts["open"] == 0, f"effects left in states other than done or dead: {states}")
    result.require(counts["stray"] == 0, f"{counts['stray']} ticket(s) name unaccepted keys")
    result.require(
        counts["done_without_ticket"] == 0,
        f"{counts['done_without_ticket']} effect(s) done without a ticket",
    )
    if deduplicate:
        duplicates = counts["tickets"] - counts["ticketed_keys"]
        result.require(duplicates == 0, f"{duplicates} duplicate ticket(s) despite receipts")
        result.require(
            counts["receipts"] == counts["ticketed_keys"] and not counts["receipts_without_ticket"],
            f"{counts['receipts']} receipts for {counts['ticketed_keys']} ticketed keys",
        )
        result.require(
            counts["results_not_naming_their_ticket"] == 0,
            f"{counts['results_not_naming_their_ticket']} result(s) do not name their ticket",
        )
    else:
        result.require(
            counts["unflagged_duplicates"] == 0,
            f"{counts['unflagged_duplicates']} duplicate ticket(s) arrived unflagged",
        )
    return counts, states


def _scenario(ctx: LabContext, deduplicate: bool) -> ScenarioResult:
    seed = ctx.seed
    operations = int(ctx.options.get("operations") or DEFAULT_OPERATIONS)
    kills_option = ctx.options.get("kills")
    kills_wanted = DEFAULT_KILLS if kills_option is None else int(kills_option)
    size = int(ctx.options.get("workers") or DEFAULT_WORKERS)
    mode = "dedup" if deduplicate else "no_dedup"
    result = ScenarioResult(f"torture[{mode}]")
    stores = ctx.stores("torture", mode)
    folder = ctx.root / "torture" / mode
    accepted = len(accept_all(stores, operations))
    rng = random.Random(f"torture/{seed}/{mode}")
    args = [*stores.args(), "--seed", str(seed), "--concurrency", "2"]
    if not deduplicate:
        args.append("--no-deduplication")
    # Each kill lands when this many effects are finished: spread over the run whatever the
    # machine's speed, and always while work remains.
    marks = sorted(int(rng.uniform(0.02, 0.9) * operations) for _ in range(kills_wanted))

    kills: list[dict[str, Any]] = []
    topped_up = 0
    workers = Workers(ctx, args, size, folder)
    timeline = Timeline(
        stores, result.name, ctx.progress, lambda: accepted, lambda: len(kills), kills_wanted
    )
    timeline.start()
    began = time.monotonic()
    try:
        with reading_both(stores) as query:
            workers.fill()
            while marks and not workers.failures:
                workers.poll()
                finished = _terminal(query)
                if finished >= accepted:
                    # Everything finished before the next mark: fresh work for the kills left.
                    more = max(20, operations // max(1, kills_wanted))
                    accepted += len(accept_all(stores, more, accepted))
                    topped_up += more
                targets = workers.targets() if finished >= marks[0] else []
                if targets:
                    victim = rng.choice(targets)
                    at = timeline.elapsed()
                    workers.kill(victim)
                    marks.pop(0)
                    kills.append(
                        {"pid": victim.pid, "at_seconds": round(at, 3), "effects_done": finished}
                    )
                workers.fill()
                time.sleep(0.005)
            # No kill left: the last replacement (or, with no kills, every worker) dispatches.
            deadline = time.monotonic() + DRAIN_DEADLINE_SECONDS
            while len(workers.live) < size and not workers.failures:
                workers.poll()
                workers.fill(spare=False)
                if time.monotonic() > deadline or _terminal(query) >= accepted:
                    break
                time.sleep(0.005)
        workers.wait(DRAIN_DEADLINE_SECONDS)
        dispatching = time.monotonic() - began
        final = ctx.child("torture", args, deadline_seconds=DRAIN_DEADLINE_SECONDS)
    finally:
        workers.wait(0)
        timeline.stop()
    result.processes.append(final)
    result.require(final.exit_code == 0, f"the final dispatcher failed: {final.stderr[-500:]}")
    claimed = ((final.response or {}).get("stats") or {}).get("claimed")
    result.require(claimed == 0, f"the final dispatcher still found work: claimed {claimed}")
    for failure in workers.failures:
        result.require(False, failure)
    result.require(len(kills) == kills_wanted, f"{len(kills)} of {kills_wanted} kills landed")

    counts, states = check_stores(result, stores, accepted, deduplicate)
    result.summary = {
        "seed": seed,
        "workers": size,
        "operations": accepted,
        "topped_up": topped_up,
        "lost": counts["lost"],
        "kills": len(kills),
        "worker_starts": workers.started,
        "spares_retired": workers.retired,
        "states": states,
        "tickets": counts["tickets"],
        "duplicates": counts["tickets"] - counts["ticketed_keys"],
        "flagged_redeliveries": counts["flagged_redeliveries"],
        "unflagged_duplicates": counts["unflagged_duplicates"],
        "receipts": counts["receipts"],
        "max_attempts_used": counts["max_attempts_used"],
        "dispatch_seconds": round(dispatching, 1),
    }
    result.details = {
        "kills": kills,
        "worker_exits": {str(code): n for code, n in sorted(workers.exits.items())},
        "timeline": timeline.as_dict(),
    }
    return result


def run_torture(ctx: LabContext) -> Iterator[ScenarioResult]:
    yield _scenario(ctx, True)
    yield _scenario(ctx, False)


SUITE = Suite(
    "torture",
    "seeded random SIGKILLs of busy dispatchers (--workers), with and without receipts",
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
