"""``oncewire dispatch`` and ``oncewire doctor`` as an operator runs them: real processes."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest

from oncewire import Ledger
from oncewire.testing import ManualClock
from tests.support.claims import settle_and_claim
from tests.support.pg import fresh_schema, server_url

APP = """
import os
def note(attempt):
    with open(os.environ["NOTES"], "a") as handle:
        handle.write(attempt.key + "\\n")
    return {"noted": attempt.key}
SINKS = {"note": note}
def make():
    return SINKS
"""


def oncewire(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run(
        [sys.executable, "-m", "oncewire", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _states(db: Path) -> list[str]:
    with closing(sqlite3.connect(db)) as conn:
        return [s for (s,) in conn.execute("SELECT state FROM oncewire_effects ORDER BY key")]


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "myapp.py").write_text(APP)
    monkeypatch.setenv("NOTES", str(tmp_path / "notes.txt"))
    return tmp_path


def test_dispatch_until_idle_with_an_app(app_dir: Path) -> None:
    db = app_dir / "app.db"
    with Ledger(str(db)) as ledger:
        for i in range(5):
            ledger.accept(f"k{i}", "note", {"i": i})
    ran = oncewire("dispatch", "--db", str(db), "--app", "myapp:make", "--until-idle", cwd=app_dir)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout.strip().splitlines()[-1])["stats"]["done"] == 5
    assert _states(db) == ["done"] * 5
    assert sorted((app_dir / "notes.txt").read_text().split()) == [f"k{i}" for i in range(5)]


@pytest.mark.parametrize(
    ("app", "message"),
    [
        ("myapp", "must look like module:attribute"),
        ("nosuchmodule:SINKS", "cannot import nosuchmodule"),
        ("myapp:NOPE", "myapp has no NOPE"),
    ],
)
def test_dispatch_refuses_a_bad_app_in_one_line(app_dir: Path, app: str, message: str) -> None:
    db = app_dir / "app.db"
    Ledger(str(db)).close()
    ran = oncewire("dispatch", "--db", str(db), "--app", app, cwd=app_dir)
    assert ran.returncode == 1
    assert message in ran.stderr and ran.stderr.startswith("error:")
    assert "Traceback" not in ran.stderr


@pytest.mark.parametrize("patience", ["nan", "-1", "soon"])
def test_dispatch_refuses_a_bad_storage_patience_before_opening_the_store(
    app_dir: Path, patience: str
) -> None:
    db = app_dir / "app.db"
    ran = oncewire(
        "dispatch", "--db", str(db), "--app", "myapp:SINKS", "--storage-patience", patience,
        cwd=app_dir,
    )  # fmt: skip
    assert ran.returncode == 2
    assert "--storage-patience" in ran.stderr
    assert "Traceback" not in ran.stderr
    assert not db.exists()  # nothing was created


def _supervised(
    cwd: Path, *args: str, deadline: float
) -> tuple[subprocess.Popen[str], list[str], threading.Thread]:
    """``oncewire dispatch --workers 2 ARGS``, its stderr read into a list, returned once both
    workers say they dispatch (SIGTERM is graceful from then on), by ``deadline``."""
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "oncewire", "dispatch", *args, "--workers", "2"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    assert supervisor.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(supervisor.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    while sum(line.startswith("dispatching note") for line in list(lines)) < 2:
        if time.monotonic() > deadline or supervisor.poll() is not None:
            supervisor.kill()
            supervisor.wait(timeout=30)
            raise AssertionError(f"the workers did not start: {lines}")
        time.sleep(0.05)
    return supervisor, lines, reader


def test_supervised_workers_stop_gracefully_on_sigterm(app_dir: Path) -> None:
    db = app_dir / "app.db"
    Ledger(str(db)).close()
    deadline = time.monotonic() + 60
    supervisor, lines, reader = _supervised(
        app_dir,
        "--db",
        str(db),
        "--app",
        "myapp:SINKS",
        "--poll-seconds",
        "0.05",
        deadline=deadline,
    )
    try:
        with Ledger(str(db)) as ledger:
            for i in range(20):
                ledger.accept(f"k{i:02d}", "note", {"i": i})
        while _states(db) != ["done"] * 20:
            assert time.monotonic() < deadline, _states(db)
            assert supervisor.poll() is None, lines
            time.sleep(0.05)
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=30)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(timeout=30)
    reader.join(timeout=10)
    assert supervisor.stdout is not None
    stdout = supervisor.stdout.read()  # small: a line per worker
    supervisor.stdout.close()
    supervisor.stderr.close()
    stderr = "".join(lines)
    assert supervisor.returncode == 0, stderr
    reports = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert len(reports) == 2, stdout
    assert sum(r["stats"]["done"] for r in reports) == 20
    assert "supervising 2 workers" in stderr


STUCK_APP = """
import threading, time

def keep_waiting_for_nothing():
    while True:
        time.sleep(0.1)

# Not a daemon: the interpreter waits for it at exit, so a worker that stopped never leaves.
threading.Thread(target=keep_waiting_for_nothing, name="the-app-thread").start()
SINKS = {"note": lambda attempt: None}
"""


def test_a_worker_that_does_not_stop_shows_its_stacks_before_it_is_killed(
    tmp_path: Path,
) -> None:
    """The supervisor gives a worker its grace, plus 10 s, after SIGTERM; then it asks for
    every thread's stack (SIGUSR1, faulthandler) and kills it: the log says where it was stuck,
    here an application thread the interpreter waits for at exit."""
    (tmp_path / "stuckapp.py").write_text(STUCK_APP)
    db = tmp_path / "app.db"
    Ledger(str(db)).close()
    supervisor, lines, reader = _supervised(
        tmp_path,
        *("--db", str(db), "--app", "stuckapp:SINKS", "--grace", "0.5"),
        deadline=time.monotonic() + 60,
    )
    try:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=60)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(timeout=30)
    reader.join(timeout=10)
    assert supervisor.stdout is not None and supervisor.stderr is not None
    supervisor.stdout.close()
    supervisor.stderr.close()
    stderr = "".join(lines)
    assert supervisor.returncode == 1, stderr  # the killed workers count as failures
    assert stderr.count("did not stop within 10.5s: its stacks (SIGUSR1), then SIGKILL") == 2
    assert stderr.count("in keep_waiting_for_nothing") >= 2, stderr  # each worker's dump
    assert "_shutdown" in stderr, stderr  # the main thread, waiting for it at exit


def test_doctor_on_a_healthy_sqlite_store(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    with Ledger(str(db)) as ledger:
        ledger.accept("k", "note", {})
    ran = oncewire("doctor", "--db", str(db), "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    checks = {c["name"]: c for c in json.loads(ran.stdout)}
    assert checks["schema"]["status"] == "ok"
    assert checks["durability"]["detail"] == "journal_mode=wal, synchronous=FULL"
    assert checks["effects"]["detail"] == "pending=1"


def test_doctor_fails_on_a_missing_store_without_creating_it(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    ran = oncewire("doctor", "--db", str(missing), cwd=tmp_path)
    assert ran.returncode == 1
    assert "[FAIL] open: no database at" in ran.stdout
    assert not missing.exists()


def test_doctor_warns_about_claims_past_their_lease(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    earlier = time.time() - 1000
    with Ledger(str(db), clock=ManualClock(earlier)) as ledger:
        ledger.accept("stuck", "note", {})
        _, claims = settle_and_claim(
            ledger.store, [], owner="elsewhere:1:1:x", now=earlier, lease_seconds=1, limit=1
        )
    assert [c.key for c in claims] == ["stuck"]
    ran = oncewire("doctor", "--db", str(db), cwd=tmp_path)
    assert ran.returncode == 0
    assert "[WARN] leases: 1 claim(s) past their lease (oldest 'stuck')" in ran.stdout
    assert "fix: start a dispatcher" in ran.stdout


def test_doctor_on_postgresql_reports_clock_skew(tmp_path: Path) -> None:
    with fresh_schema(server_url(), "doctor") as url:
        Ledger(url).close()
        ran = oncewire("doctor", "--db", url, "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    checks = {c["name"]: c for c in json.loads(ran.stdout)}
    assert checks["open"]["detail"].startswith("postgresql ")
    assert checks["clock"]["status"] == "ok"
    assert "server clock is" in checks["clock"]["detail"]
