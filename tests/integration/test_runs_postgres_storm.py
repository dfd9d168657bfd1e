"""A storm on one PostgreSQL store: eight threads, each with its own ledger, start, command,
terminate, checkpoint, revert, hold and release barriers, renew and reconcile runs across three
scopes at random for a few seconds. Every refusal must be a typed run error (never a storage
error, a deadlock or a lock timeout), and afterwards the database holds its invariants and every
run's history verifies."""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from oncewire import Ledger
from oncewire.core.errors import RunError, StaleFence, StorageError
from tests.support.pg import fresh_schema, server_url

WORKERS = 8
SECONDS = 6.0
MAX_SECONDS = 45.0
MIN_EVENTS = 50
CANDIDATE: dict[str, Any] = {
    "candidate_id": "c-1",
    "snapshot_sha256": "a" * 64,
    "evidence_sha256": "e" * 64,
    "artifact_set_sha256": "b" * 64,
    "artifact_ids": ["artifact-1"],
    "version_ids": ["version-1"],
}
OPS = {
    "start": 6,
    "candidate": 4,
    "propose": 8,
    "terminate": 3,
    "checkpoint": 2,
    "revert": 1,
    "hold": 0.3,
    "release": 2,
    "reconcile": 1,
    "renew": 2,
}


@pytest.fixture
def url() -> Iterator[str]:
    with fresh_schema(server_url(), "storm") as schema_url:
        yield schema_url


class Worker:
    def __init__(self, ledger: Ledger, wid: int) -> None:
        self.ledger, self.wid = ledger, wid
        self.rng = random.Random(wid)
        self.checkpoints: dict[str, list[str]] = collections.defaultdict(list)
        self.held: dict[str, str] = {}
        self.refusals: collections.Counter[str] = collections.Counter()
        self.failures: list[str] = []
        self.steps = 0

    def step(self, n: int) -> None:
        rng, runs, wid = self.rng, self.ledger.runs, self.wid
        scope = f"scope-{rng.randrange(3)}"
        run_id = f"run-{rng.randrange(12)}-{n // 40}"
        op = rng.choices(list(OPS), list(OPS.values()))[0]
        if op == "start":
            lease = rng.choice([0.01, 30.0])
            runs.start(run_id, key="start", scope=scope, owner=f"w{wid}", lease_seconds=lease)
        elif op == "candidate":
            runs.review.record_candidate(run_id, key=f"c{wid}-{n}", **CANDIDATE)
        elif op == "propose":
            runs.review.propose_action(
                run_id,
                key=f"p{wid}-{n}",
                action_id=f"a{wid}-{n}",
                kind="shell",
                arguments={},
                side_effect_class="workspace_write",
            )
        elif op == "terminate":
            runs.review.terminate(
                run_id, key=f"t{wid}-{n}", status="review_unavailable", reason="x"
            )
        elif op == "checkpoint":
            self.checkpoints[scope].append(
                runs.checkpoint(f"cp-{wid}-{n}", scope=scope).checkpoint_id
            )
        elif op == "revert" and self.checkpoints[scope]:
            runs.revert(scope=scope, checkpoint_id=rng.choice(self.checkpoints[scope][-5:]))
        elif op == "hold":
            runs.hold(scope=scope, operation_id=f"op-{wid}-{n}", state="reverting")
            self.held[scope] = f"op-{wid}-{n}"
        elif op == "release" and scope in self.held:
            runs.hold(scope=scope, operation_id=self.held.pop(scope), state="resolved")
        elif op == "reconcile":
            runs.reconcile(owner=f"reconciler-{wid}")
        elif op == "renew":
            run = runs.get(run_id)
            runs.renew(run_id, owner=run.owner or "", fence=run.fence, lease_seconds=30.0)

    def run(self, stop: threading.Event) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            self.steps = n
            try:
                self.step(n)
            except StorageError as exc:  # includes StoreBusy: a deadlock or a lock timeout
                self.failures.append(f"{type(exc).__name__}: {exc}")
            except (RunError, StaleFence) as exc:
                self.refusals[type(exc).__name__] += 1
            except Exception as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")


def _count(conn: psycopg.Connection[Any], sql: str) -> int:
    row = conn.execute(sql).fetchone()  # type: ignore[arg-type]
    return int(row[0]) if row else 0


def test_a_storm_of_concurrent_run_commands_keeps_every_invariant(url: str) -> None:
    ledgers = [Ledger(url) for _ in range(WORKERS)]
    try:
        workers = [Worker(ledger, wid) for wid, ledger in enumerate(ledgers)]
        stop = threading.Event()
        threads = [threading.Thread(target=w.run, args=(stop,), daemon=True) for w in workers]
        for thread in threads:
            thread.start()
        began = time.monotonic()
        with psycopg.connect(url, autocommit=True) as watcher:
            while True:  # a few seconds, longer on a slow machine until enough was written
                time.sleep(0.5)
                written = _count(watcher, "SELECT COUNT(*) FROM oncewire_run_events")
                elapsed = time.monotonic() - began
                if (elapsed >= SECONDS and written >= MIN_EVENTS) or elapsed >= MAX_SECONDS:
                    break
        stop.set()
        for thread in threads:
            thread.join(60)
        failures = [f for w in workers for f in w.failures]
        assert failures == [], failures[:5]
        refusals = sum((w.refusals for w in workers), collections.Counter())
        steps = sum(w.steps for w in workers)
        assert written >= MIN_EVENTS, (
            f"{written} events in {elapsed:.0f} s ({steps} steps, {refusals})"
        )
        assert refusals["RevertBarrierHeld"] > 0  # the storm did meet barriers
        unverified = [v for v in ledgers[0].runs.verify() if not v.ok]
        assert unverified == []
    finally:
        for ledger in ledgers:
            ledger.close()
    with psycopg.connect(url) as conn:
        doubled_active, doubled_terminal, held = conn.execute(
            "SELECT "
            "(SELECT COUNT(*) FROM (SELECT 1 FROM oncewire_runs WHERE finished_at IS NULL "
            "  AND abandoned_at IS NULL GROUP BY scope, branch HAVING COUNT(*) > 1) a), "
            "(SELECT COUNT(*) FROM (SELECT 1 FROM oncewire_run_events WHERE terminal "
            "  GROUP BY run_id HAVING COUNT(*) > 1) t), "
            "(SELECT COUNT(*) FROM (SELECT 1 FROM oncewire_run_barriers WHERE state <> 'resolved' "
            "  GROUP BY scope HAVING COUNT(*) > 1) b)"
        ).fetchone()  # type: ignore[misc]
    assert (doubled_active, doubled_terminal, held) == (0, 0, 0)
