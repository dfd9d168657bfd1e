"""The dispatcher as a real child process: graceful stop on SIGTERM, and a peer that dies
mid-attempt being recognised at once (no waiting for its lease)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncewire import Attempt, Dispatcher, EffectState, Ledger

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="process identity needs Linux /proc"
)

Child = Callable[..., subprocess.Popen[str]]

# A dispatcher whose sink writes a marker, then works slowly; it prints its stats at exit.
SLOW_WORKER = """
import json, pathlib, sys, time
from oncewire import Dispatcher, Ledger

db, marker, seconds = sys.argv[1], pathlib.Path(sys.argv[2]), float(sys.argv[3])

def slow(attempt):
    marker.write_text(attempt.key)
    time.sleep(seconds)
    return {"worked": attempt.key}

ledger = Ledger(db)
stats = Dispatcher(ledger, {"slow": slow}, batch_size=1, poll_seconds=0.05).run()
ledger.close()
print(json.dumps(stats.as_dict()))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_dispatcher_after_recording_the_attempt_in_flight(
    db_path: Path,
    tmp_path: Path,
    python_child: Child,
    wait: Callable[..., None],
    sig: signal.Signals,
) -> None:
    with Ledger(str(db_path)) as ledger:
        for i in range(3):
            ledger.accept(f"k{i}", "slow", {"i": i})
    marker = tmp_path / "started"
    child = python_child(SLOW_WORKER, str(db_path), str(marker), "0.5")
    wait(marker.exists, what="the first attempt to start")
    child.send_signal(sig)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert "Traceback" not in err
    assert '"claimed": 1' in out and '"done": 1' in out

    with Ledger(str(db_path), create=False) as ledger:
        effects = {e.key: e for e in ledger.effects.list()}
    assert effects["k0"].state is EffectState.DONE
    assert effects["k0"].result == {"worked": "k0"}
    for key in ("k1", "k2"):  # never started, so never claimed
        assert (effects[key].state, effects[key].attempts) == (EffectState.PENDING, 0)


def test_a_killed_peers_claim_is_released_at_once_and_redelivered(
    db_path: Path,
    tmp_path: Path,
    python_child: Child,
    wait: Callable[..., None],
) -> None:
    with Ledger(str(db_path)) as ledger:
        ledger.accept("k", "slow", {"n": 1})
    marker = tmp_path / "started"
    child = python_child(SLOW_WORKER, str(db_path), str(marker), "60")
    wait(marker.exists, what="the child's attempt to start")
    child.kill()
    child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL

    seen: list[Attempt] = []

    def sink(attempt: Attempt) -> Any:
        seen.append(attempt)
        return "redelivered"

    with Ledger(str(db_path), create=False) as ledger:
        before = ledger.effects.get("k")
        assert before.state is EffectState.CLAIMED
        assert before.lease_expires_at is not None
        assert before.lease_expires_at > ledger.clock.now() + 10  # the lease is far from over
        # lease_seconds is long too: only knowing the owner is dead can release the claim now.
        dispatcher = Dispatcher(ledger, {"slow": sink}, lease_seconds=600)
        dispatcher.run(until_idle=True, handle_signals=False)
        after = ledger.effects.get("k")
    assert dispatcher.stats.released == 1
    assert [(a.number, a.redelivery) for a in seen] == [(2, True)]
    assert (after.state, after.result, after.maybe_sent) == (EffectState.DONE, "redelivered", True)


# Drains the store; the sink notes each attempt in a shared log (O_APPEND: one line per write).
DRAIN_WORKER = """
import os, sys
from oncewire import Dispatcher, Ledger

db, log = sys.argv[1], sys.argv[2]
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

def note(attempt):
    os.write(fd, f"{attempt.key} {os.getpid()}\\n".encode())
    return os.getpid()

with Ledger(db) as ledger:
    Dispatcher(ledger, {"note": note}, batch_size=4, poll_seconds=0.01).run(until_idle=True)
"""


def test_dispatchers_in_several_processes_attempt_each_effect_once(
    db_path: Path, tmp_path: Path, python_child: Child
) -> None:
    keys = [f"k{i:03d}" for i in range(150)]
    with Ledger(str(db_path)) as ledger, ledger.transaction() as tx:
        for key in keys:
            tx.accept(key, "note", {})
    log = tmp_path / "attempts.log"
    workers = [python_child(DRAIN_WORKER, str(db_path), str(log)) for _ in range(3)]
    for worker in workers:
        _, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
    attempted = sorted(line.split()[0] for line in log.read_text().splitlines())
    assert attempted == keys  # every key once: claims are exclusive across processes
    with Ledger(str(db_path), create=False) as ledger:
        effects = ledger.effects.list(limit=1000)
    assert {e.state for e in effects} == {EffectState.DONE}
    assert {e.attempts for e in effects} == {1}


def test_the_heartbeat_keeps_a_long_attempt_leased(db_path: Path, ledger: Ledger) -> None:
    # Real time: a 0.6 s lease, renewed every 0.2 s, and an attempt that takes 1.2 s.
    real = Ledger(ledger.store)
    real.accept("slow", "work", {})
    released: list[int] = []

    def sink(attempt: Attempt) -> Any:
        deadline = time.monotonic() + 1.2
        while time.monotonic() < deadline:
            time.sleep(0.1)
            released.append(real.store.release_claims(now=real.clock.now()))
        return "finished"

    dispatcher = Dispatcher(real, {"work": sink}, lease_seconds=0.6)
    dispatcher.run(until_idle=True, handle_signals=False)
    assert released and set(released) == {0}  # no reaper could take it while it ran
    assert dispatcher.stats.stale_refused == 0
    effect = real.effects.get("slow")
    assert (effect.state, effect.result, effect.attempts) == (EffectState.DONE, "finished", 1)
