"""The dispatcher as a real child process: graceful stop on SIGTERM, and a peer that dies
mid-attempt being recognised at once (no waiting for its lease)."""

from __future__ import annotations

import signal
import subprocess
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
    assert [(a.attempt, a.redelivery) for a in seen] == [(2, True)]
    assert (after.state, after.result, after.maybe_sent) == (EffectState.DONE, "redelivered", True)
