"""Four ``oncewire dispatch`` workers ride out a crash of the PostgreSQL server under their
outbox.

The outbox lives on a private cluster (:mod:`tests.chaos.conftest`); the receiver (receipts and
one ticket per key) on a schema of the shared server, which does not die. While attempts are in
flight the private cluster is stopped with ``pg_ctl stop -m immediate`` (every backend killed,
no checkpoint), kept down, and started again (crash recovery replays the WAL). The workers must
not exit: they log the lost connection, back off and reconnect, and finish every effect.
Everything is then read from the stores themselves: nothing lost, every effect ``done``, one
receipt and one ticket per key, every sink call after a key's first flagged as a redelivery,
and a redelivery flagged only after an attempt the outbox recorded as possibly landed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from tests.chaos.app import DOWNSTREAM_SCHEMA
from tests.chaos.conftest import PrivateCluster
from tests.support.pg import fresh_schema, server_url

REPO = Path(__file__).resolve().parents[2]
WORKERS = 4


@pytest.fixture
def downstream() -> Iterator[str]:
    """The receiver's store: a fresh schema on the shared server (which stays up)."""
    import psycopg

    with fresh_schema(server_url(), "chaos_rx") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(DOWNSTREAM_SCHEMA)
        yield url


@pytest.fixture
def outbox(pg_cluster: PrivateCluster) -> Iterator[str]:
    """A fresh schema on the private cluster (which the test crashes)."""
    if not pg_cluster.running():
        pg_cluster.start()
    with fresh_schema(pg_cluster.url, "chaos_ob") as url:
        yield url


def _rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        return [tuple(row) for row in conn.execute(sql).fetchall()]


def _wait(predicate: Any, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; workers said:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def _states(url: str) -> dict[str, int]:
    return dict(_rows(url, "SELECT state, COUNT(*) FROM oncewire_effects GROUP BY state"))


def _run_crash(
    cluster: PrivateCluster,
    outbox: str,
    downstream: str,
    tmp_path: Path,
    *,
    effects: int,
    sink_delay: float,
    crash_after: int,
    down_seconds: float,
    crashes: int,
) -> None:
    keys = [f"op-{i:05d}" for i in range(effects)]
    with Ledger(outbox) as ledger, ledger.transaction() as tx:
        for key in keys:
            tx.accept(key, "ticket", {"key": key})

    out, err = tmp_path / "dispatch.out", tmp_path / "dispatch.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
    env.update(PYTHONUNBUFFERED="1", CHAOS_DOWNSTREAM=downstream, CHAOS_SINK_DELAY=str(sink_delay))
    argv = [
        sys.executable, "-m", "oncewire", "dispatch", "--db", outbox,
        "--app", "tests.chaos.app:sinks", "--workers", str(WORKERS), "--concurrency", "2",
        "--batch-size", "8", "--lease-seconds", "5", "--poll-seconds", "0.2", "--grace", "10",
    ]  # fmt: skip
    with out.open("w") as stdout, err.open("w") as stderr:
        supervisor = subprocess.Popen(argv, cwd=REPO, env=env, stdout=stdout, stderr=stderr)
    try:
        _wait(lambda: "supervising" in err.read_text(), 30, "the workers to start", err)
        line = next(x for x in err.read_text().splitlines() if "supervising" in x)
        pids = {int(p) for p in line.split(":")[-1].split()}
        assert len(pids) == WORKERS

        claimed_at_crash: list[int] = []
        for round_ in range(crashes):
            target = crash_after * (round_ + 1)
            _wait(
                lambda t=target: _rows(downstream, "SELECT COUNT(*) FROM chaos_tickets")[0][0] >= t,
                120,
                f"{target} tickets before crash {round_ + 1}",
                err,
            )
            claimed_at_crash.append(_states(outbox).get("claimed", 0))
            cluster.crash()
            time.sleep(down_seconds)
            # Down: the workers are waiting for the store, not gone.
            assert supervisor.poll() is None
            assert all(_alive(pid) for pid in pids), err.read_text()[-3000:]
            cluster.start()

        _wait(
            lambda: _states(outbox) == {"done": effects},
            180,
            "every effect to be done after the crash",
            err,
        )
        # The same four workers did it all: none exited and was replaced.
        assert all(_alive(pid) for pid in pids)
        assert "exited with code" not in err.read_text()
    finally:
        if supervisor.poll() is None:
            supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(timeout=60)
        except subprocess.TimeoutExpired:
            supervisor.kill()
            supervisor.wait(timeout=10)
    log = err.read_text()
    assert supervisor.returncode == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert "store unavailable" in log  # the lost connection was logged
    assert cluster.recovered_from_crash(), cluster.tail()
    assert any(claimed_at_crash), "no effect was in flight when the database crashed"

    reports = [json.loads(x) for x in out.read_text().splitlines() if x.startswith("{")]
    assert {r["pid"] for r in reports} == pids  # each of the four reported its stats at exit
    stats = [r["stats"] for r in reports]
    assert sum(s["storage_errors"] for s in stats) >= 1

    _check_stores(outbox, downstream, keys)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _check_stores(outbox: str, downstream: str, keys: list[str]) -> None:
    # The outbox: nothing lost, every effect done, nothing left claimed.
    effects = _rows(outbox, "SELECT id, key, state, fence FROM oncewire_effects ORDER BY key")
    assert [e[1] for e in effects] == keys
    assert {e[2] for e in effects} == {"done"}
    key_of = {e[0]: e[1] for e in effects}

    # The receiver: exactly one receipt and one ticket per key.
    receipts = _rows(downstream, "SELECT key FROM oncewire_receipts ORDER BY key")
    assert [r[0] for r in receipts] == keys
    tickets: dict[str, int] = defaultdict(int)
    for (key,) in _rows(downstream, "SELECT key FROM chaos_tickets"):
        tickets[key] += 1
    assert dict(tickets) == dict.fromkeys(keys, 1)

    # The attempt history: one done attempt per key, the last. Every earlier one possibly
    # landed (uncertain), or was a claim given back before its sink was called (outcome
    # not_started: a worker that exited left it). A redelivery flag exactly where an earlier
    # attempt may have landed.
    history: dict[str, list[tuple[int, bool, str, str]]] = defaultdict(list)
    for effect_id, fence, redelivery, state, outcome in _rows(
        outbox,
        "SELECT effect_id, fence, redelivery, state, outcome FROM oncewire_attempts ORDER BY fence",
    ):
        history[key_of[effect_id]].append((fence, redelivery, state, outcome))
    for key in keys:
        attempts = history[key]
        assert [a[2] for a in attempts][-1] == "done", (key, attempts)
        for index, (_, redelivery, state, outcome) in enumerate(attempts):
            may_have_landed = any(a[3] != "not_started" for a in attempts[:index])
            assert redelivery == may_have_landed, (key, attempts)
            if index < len(attempts) - 1:
                assert state == "uncertain" or outcome == "not_started", (key, attempts)
                if outcome == "not_started":
                    assert state == ("uncertain" if may_have_landed else "pending"), attempts

    # The calls the receiver saw: after a key's first, every call was flagged; a flagged call
    # came after an earlier attempt of that key.
    calls: dict[str, list[tuple[int, bool]]] = defaultdict(list)
    for key, fence, redelivery in _rows(
        downstream, "SELECT key, fence, redelivery FROM chaos_calls ORDER BY fence"
    ):
        calls[key].append((fence, redelivery))
    for key in keys:
        seen = calls[key]
        assert seen, key
        assert all(redelivery for _, redelivery in seen[1:]), (key, seen)
        fences = {a[0] for a in history[key]}
        for fence, redelivery in seen:
            if redelivery:
                assert any(f < fence for f in fences), (key, seen, history[key])


def test_four_workers_survive_a_postgres_crash_mid_run(
    pg_cluster: PrivateCluster, outbox: str, downstream: str, tmp_path: Path
) -> None:
    _run_crash(
        pg_cluster,
        outbox,
        downstream,
        tmp_path,
        effects=300,
        sink_delay=0.1,
        crash_after=60,
        down_seconds=3.0,
        crashes=1,
    )


@pytest.mark.slow
def test_four_workers_survive_repeated_postgres_crashes(
    pg_cluster: PrivateCluster, outbox: str, downstream: str, tmp_path: Path
) -> None:
    _run_crash(
        pg_cluster,
        outbox,
        downstream,
        tmp_path,
        effects=1200,
        sink_delay=0.1,
        crash_after=200,
        down_seconds=8.0,
        crashes=4,
    )


def test_a_worker_gives_up_after_its_storage_patience_and_the_next_one_finishes(
    pg_cluster: PrivateCluster, outbox: str, downstream: str, tmp_path: Path
) -> None:
    """``--storage-patience``: a worker whose store stays down longer than that exits non-zero
    with one clear line (a supervisor starts another), leaving its claims for recovery; once the
    server is back, the next worker finishes every effect, each done once."""
    keys = [f"op-{i:05d}" for i in range(40)]
    with Ledger(outbox) as ledger, ledger.transaction() as tx:
        for key in keys:
            tx.accept(key, "ticket", {"key": key})
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
    env.update(PYTHONUNBUFFERED="1", CHAOS_DOWNSTREAM=downstream, CHAOS_SINK_DELAY="0.1")
    argv = [
        sys.executable, "-m", "oncewire", "dispatch", "--db", outbox,
        "--app", "tests.chaos.app:sinks", "--concurrency", "2", "--batch-size", "8",
        "--lease-seconds", "5", "--poll-seconds", "0.2", "--status-every", "0",
    ]  # fmt: skip
    err = tmp_path / "patient.err"
    with err.open("w") as stderr:
        worker = subprocess.Popen(
            [*argv, "--storage-patience", "2"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        _wait(
            lambda: _rows(downstream, "SELECT COUNT(*) FROM chaos_tickets")[0][0] >= 8,
            60,
            "the first tickets",
            err,
        )
        pg_cluster.crash()
        crashed = time.monotonic()
        code = worker.wait(timeout=60)
        gave_up_after = time.monotonic() - crashed
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=10)
        if not pg_cluster.running():
            pg_cluster.start()
    log = err.read_text()
    assert code not in (0, -signal.SIGKILL), log[-3000:]
    assert gave_up_after >= 2.0, log[-3000:]  # not before its patience ran out
    assert "Traceback" not in log, log[-3000:]
    assert "store unavailable" in log, log[-3000:]
    assert "longer than storage_patience_seconds (2s): giving up" in log, log[-3000:]
    assert _rows(downstream, "SELECT COUNT(*) FROM chaos_tickets")[0][0] < len(keys)

    finished = subprocess.run(
        [*argv, "--until-idle"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    _check_stores(outbox, downstream, keys)
