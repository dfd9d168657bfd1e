"""A storm of four processes issuing random run commands (reused review, repair, finding and
action ids, reused idempotency keys, checkpoints, renewals, reconciliations, verified reads) on a
handful of runs, with random SIGKILLs, on both backends. Every refusal is a typed run error;
no verified read calls a healthy run failed; after a final reconciliation every run verifies and
none was abandoned or judged at the safety boundary."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from oncewire import Ledger
from tests.support.runs_db import RunsDatabase

pytestmark = pytest.mark.crash

PROCESSES = 4
COMMANDS_PER_PROCESS = 150
KILLS = 3

WORKER = r"""
import random, sys, traceback
from oncewire import Ledger
from oncewire.core.errors import HistoryTampered, RunError, StaleFence, StorageError

url, seed, commands = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
me = f"storm-{seed}"
E = "e" * 64
RUNS = [f"run-{n}" for n in range(6)]

def candidate(cid):
    return {"candidate_id": cid, "snapshot_sha256": "a" * 64, "evidence_sha256": E,
            "artifact_set_sha256": "b" * 64, "artifact_ids": [], "version_ids": []}

def pick(prefix, n=3):
    return f"{prefix}{rng.randrange(n)}"

def command(runs, run_id):
    scope = f"scope-{RUNS.index(run_id) % 3}"
    op = rng.choice(["start", "candidate", "review", "review_done", "repair", "bind",
                     "repair_done", "propose", "resolve", "terminate", "checkpoint",
                     "renew", "reconcile", "read", "read"])
    k = pick(f"{op}-", 4)  # reused keys: replays and conflicts
    if op == "start":
        runs.start(run_id, key=k, scope=scope, owner=me, lease_seconds=1.5)
    elif op == "candidate":
        runs.review.record_candidate(run_id, key=k, **candidate(pick("c")))
    elif op == "review":
        cid = pick("c")
        runs.review.start_review(run_id, key=k, review_id=pick("rv"), candidate_id=cid,
                                 evidence_sha256=E)
    elif op == "review_done":
        findings = [{"finding_id": pick("f")}] if rng.random() < 0.5 else []
        verdict = rng.choice(["pass", "issues"]) if not findings else "issues"
        runs.review.complete_review(run_id, key=k, review_id=pick("rv"), verdict=verdict,
                             findings=findings)
    elif op == "repair":
        runs.review.start_repair(run_id, key=k, repair_id=pick("rp"))
    elif op == "bind":
        runs.review.bind_actions(run_id, key=k, repair_id=pick("rp"))
    elif op == "repair_done":
        runs.review.complete_repair(run_id, key=k, repair_id=pick("rp"), status="completed",
                             candidate=candidate(pick("c")))
    elif op == "propose":
        runs.review.propose_action(run_id, key=k, action_id=pick("a", 4), kind="t", arguments={},
                            side_effect_class=rng.choice(["read_only", "external"]))
    elif op == "resolve":
        runs.review.resolve_action(run_id, key=k, action_id=pick("a", 4), status="succeeded")
    elif op == "terminate":
        runs.review.terminate(run_id, key=k, status=rng.choice(["verified", "review_unavailable"]),
                       reason="storm")
    elif op == "checkpoint":
        runs.checkpoint(pick("cp"), scope=scope)
    elif op == "renew":
        run = runs.get(run_id)
        runs.renew(run_id, owner=me, fence=run.fence, lease_seconds=1.5)
    elif op == "reconcile":
        for report in runs.reconcile(owner=me):
            if report.reason == "safety_boundary" or report.error:
                print("BAD reconcile", report, flush=True)
    else:
        run = runs.get(run_id)
        if run.claimed_status is not None or run.terminal_reason == "safety_boundary":
            print("BAD read", run_id, run.status, run.terminal_reason, flush=True)
        for v in runs.verify(run_id):
            if not v.ok:
                print("BAD verify", run_id, v.first_bad_seq, v.reason, flush=True)

with Ledger(url) as ledger:
    runs = ledger.runs
    for n in range(commands):
        run_id = rng.choice(RUNS)
        try:
            command(runs, run_id)
        except HistoryTampered as exc:
            print("BAD tampered", run_id, exc, flush=True)
        except (RunError, StaleFence, KeyError):
            pass  # a typed refusal (KeyError: RunNotFound is one)
        except StorageError as exc:
            print("BAD storage", type(exc).__name__, exc, flush=True)
        except Exception as exc:
            print("BAD untyped", type(exc).__name__, exc, traceback.format_exc(), flush=True)
        print("ok", n, flush=True)
print("done", flush=True)
"""


@pytest.fixture
def db(store_url: str) -> Iterator[RunsDatabase]:
    opened = RunsDatabase(store_url)
    yield opened


def test_a_storm_of_processes_with_kills_leaves_every_run_verifiable(
    db: RunsDatabase, python_child: Callable[..., subprocess.Popen[str]]
) -> None:
    Ledger(db.url).close()  # the schema exists before the workers race to open it
    rng = random.Random(20261130)
    seeds = iter(range(1000))
    workers = [
        python_child(WORKER, db.url, str(next(seeds)), str(COMMANDS_PER_PROCESS))
        for _ in range(PROCESSES)
    ]
    killed, early = [], {}
    for _ in range(KILLS):
        running = [w for w in workers if w.poll() is None]
        if not running:
            break
        victim = rng.choice(running)
        # Killed mid-storm: after a random number of its commands, whatever it is doing then.
        after = rng.randrange(5, COMMANDS_PER_PROCESS // 2)
        assert victim.stdout is not None
        lines = []
        for line in victim.stdout:
            lines.append(line)
            if line.startswith(f"ok {after}"):
                break
        victim.send_signal(signal.SIGKILL)
        killed.append(victim)
        early[victim.pid] = "".join(lines)
        # A new process takes its place, as a supervisor would start one.
        workers.append(python_child(WORKER, db.url, str(next(seeds)), str(COMMANDS_PER_PROCESS)))
    outputs = []
    for worker in workers:
        out, err = worker.communicate(timeout=100)
        out = early.get(worker.pid, "") + out
        outputs.append(out)
        if worker not in killed:
            assert worker.returncode == 0, err[-3000:]
            assert out.rstrip().endswith("done")
    assert any(w.returncode == -signal.SIGKILL for w in killed)
    bad = [line for out in outputs for line in out.splitlines() if line.startswith("BAD")]
    assert bad == []
    commands = sum(out.count("ok ") for out in outputs)
    assert commands >= PROCESSES * COMMANDS_PER_PROCESS // 2
    time.sleep(1.6)  # every lease has expired: the final reconciliation takes what is left
    with Ledger(db.url) as ledger:
        reports = ledger.runs.reconcile(owner="final")
        assert [r for r in reports if r.error or r.reason == "safety_boundary"] == []
        assert ledger.runs.reconcile(owner="final-2") == []
        verifications = ledger.runs.verify()
    assert verifications and all(v.ok for v in verifications), [
        v for v in verifications if not v.ok
    ]
    rows = db.query(
        "SELECT run_id, status, terminal_reason, abandon_reason, finished_at FROM oncewire_runs"
    )
    assert rows
    for row in rows:
        assert "safety_boundary" not in (row["terminal_reason"], row["abandon_reason"]), row
    assert db.query("SELECT COUNT(*) FROM oncewire_run_reports WHERE error IS NOT NULL")[0][0] == 0
