"""``oncewire doctor`` on both backends: what it finds when someone has been at the database
(an index or trigger dropped, writes refused, a history edited), and work that would wait
forever without a word (a kind no sink handles)."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.cli import main
from oncewire.storage.records import EffectState, Settlement
from oncewire.testing import ManualClock
from tests.contract.conftest import RawDatabase
from tests.support.claims import settle_and_claim
from tests.support.pg import fresh_schema, server_url


def doctor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main(["doctor", *argv, "--json"])
    captured = capsys.readouterr()
    assert captured.err == ""
    return code, {c["name"]: c for c in json.loads(captured.out)}


def test_a_healthy_store_passes_every_check(
    ledger: Ledger, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, checks = doctor(capsys, "--db", store_url, "--deep")
    assert code == 0
    assert {name: c["status"] for name, c in checks.items() if c["status"] != "ok"} == {}
    assert {"open", "schema", "write", "objects", "effects", "waiting", "runs"} <= set(checks)
    assert checks["write"]["detail"] == "a write transaction began and was rolled back"


def _drop(raw: RawDatabase, backend: str, kind: str, name: str, table: str) -> None:
    raw.execute(
        f"DROP {kind} {name}"
        + (f" ON {table}" if backend != "sqlite" and kind == "TRIGGER" else "")
    )


def test_a_dropped_index_or_trigger_is_named_and_fails(
    ledger: Ledger,
    store_url: str,
    backend: str,
    raw: RawDatabase,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _drop(raw, backend, "INDEX", "oncewire_effects_leases", "oncewire_effects")
    code, checks = doctor(capsys, "--db", store_url)
    assert code == 1
    assert checks["objects"]["status"] == "fail"
    assert checks["objects"]["detail"].startswith("missing index oncewire_effects_leases")
    assert "schema.sql" in checks["objects"]["fix"]

    _drop(raw, backend, "TRIGGER", "oncewire_run_events_no_update", "oncewire_run_events")
    code, checks = doctor(capsys, "--db", store_url)
    assert code == 1
    assert "missing trigger oncewire_run_events_no_update" in checks["objects"]["detail"]


def test_a_kind_without_a_sink_is_named_with_app(
    ledger: Ledger,
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = f"doctor_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text("SINKS = {'mail': lambda attempt: None}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    ledger.accept("m-1", "mail", {})
    ledger.accept("s-1", "sms", {})
    ledger.accept("s-2", "sms", {})

    code, checks = doctor(capsys, "--db", store_url)
    assert code == 0
    waiting = checks["waiting"]
    assert waiting["status"] == "ok"
    assert "mail=1" in waiting["detail"] and "sms=2" in waiting["detail"]
    assert "cannot tell which kinds have a sink" in waiting["detail"]

    code, checks = doctor(capsys, "--db", store_url, "--app", f"{module}:SINKS")
    assert code == 0  # a warning, not a failure: the effects are safe, only waiting
    waiting = checks["waiting"]
    assert waiting["status"] == "warn"
    assert waiting["detail"].startswith("no sink for sms in --app; sms=2 effect(s) will wait")
    assert "mail" not in waiting["detail"]
    assert "add a sink" in waiting["fix"]


def test_dead_and_rejected_effects_are_warnings(
    ledger: Ledger, clock: ManualClock, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger.accept("r", "mail", {})
    ledger.accept("d", "mail", {}, max_attempts=1)
    _, claims = settle_and_claim(
        ledger.store, [], owner="t", now=clock.now(), lease_seconds=30, limit=2
    )
    states = {"r": EffectState.REJECTED, "d": EffectState.DEAD}
    settle_and_claim(
        ledger.store,
        [Settlement(c.id, c.fence, states[c.key], last_error="no") for c in claims],
        owner="t",
        now=clock.now(),
        lease_seconds=30,
        limit=0,
    )
    code, checks = doctor(capsys, "--db", store_url)
    assert code == 0
    assert (checks["dead"]["status"], checks["dead"]["detail"]) == ("warn", "1 dead effect(s)")
    assert (checks["rejected"]["status"], checks["rejected"]["detail"]) == (
        "warn",
        "1 rejected effect(s)",
    )
    assert "--state rejected" in checks["rejected"]["fix"]


def test_deep_verifies_every_run_and_names_the_key(
    store_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with Ledger(store_url, runs_key=b"k1") as keyed:
        keyed.runs.start("run-1", key="start", scope="s", owner="w", lease_seconds=30)
    monkeypatch.delenv("ONCEWIRE_RUNS_KEY", raising=False)
    code, checks = doctor(capsys, "--db", store_url)
    assert code == 0 and "runs" not in checks  # the chains are read only with --deep
    code, checks = doctor(capsys, "--db", store_url, "--deep")
    assert code == 1
    assert checks["runs"]["status"] == "fail"
    assert "ONCEWIRE_RUNS_KEY" in checks["runs"]["detail"] + checks["runs"]["fix"]
    monkeypatch.setenv("ONCEWIRE_RUNS_KEY", "k1")
    code, checks = doctor(capsys, "--db", store_url, "--deep")
    assert code == 0
    assert checks["runs"] == {
        "name": "runs",
        "status": "ok",
        "detail": "1 run history(ies) verified",
        "fix": "",
    }


def test_deep_fails_on_an_edited_history(
    ledger: Ledger,
    store_url: str,
    backend: str,
    raw: RawDatabase,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ledger.runs.start("run-1", key="start", scope="s", owner="w", lease_seconds=30)
    if backend == "sqlite":
        raw.execute("DROP TRIGGER oncewire_run_events_no_update")
    else:
        raw.execute("ALTER TABLE oncewire_run_events DISABLE TRIGGER oncewire_run_events_no_update")
    assert raw.execute("UPDATE oncewire_run_events SET payload = '{\"edited\":true}'") == 1
    code, checks = doctor(capsys, "--db", store_url, "--deep")
    assert code == 1
    assert checks["runs"]["status"] == "fail"
    assert checks["runs"]["detail"].startswith("1 of 1 run(s) fail verification: run-1 at event 1")
    problem = "missing" if backend == "sqlite" else "changed"
    assert f"{problem} trigger oncewire_run_events_no_update" in checks["objects"]["detail"]


# -- writes refused -----------------------------------------------------------------------------


@pytest.fixture
def immutable(tmp_path: Path) -> Iterator[Path]:
    """A SQLite store whose file refuses writes even to root (chattr +i)."""
    path = tmp_path / "frozen.db"
    Ledger(str(path)).close()
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("chattr is not installed: no way to make a file refuse root's writes")
    made = subprocess.run([chattr, "+i", str(path)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is not allowed here ({made.stderr.strip()}): root could write")
    try:
        yield path
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


def test_a_sqlite_file_that_refuses_writes_fails(
    immutable: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = immutable.read_bytes()
    code, checks = doctor(capsys, "--db", str(immutable))
    assert code == 1
    assert checks["write"]["status"] == "fail"
    assert "read-only" in checks["write"]["detail"]
    assert f"this user may not write to {immutable}" in checks["write"]["detail"]
    assert "write access" in checks["write"]["fix"]
    assert immutable.read_bytes() == before


def test_a_postgresql_store_that_refuses_writes_fails(capsys: pytest.CaptureFixture[str]) -> None:
    with fresh_schema(server_url(), "doctor") as store_url:
        Ledger(store_url).close()
        # One libpq options value carries both settings (a second options= would replace it).
        assert "options=-csearch_path" in store_url
        read_only = store_url.replace(
            "options=", "options=-cdefault_transaction_read_only%3Don%20", 1
        )
        code, checks = doctor(capsys, "--db", read_only)
    assert code == 1
    assert checks["write"]["status"] == "fail"
    assert "read-only transaction" in checks["write"]["detail"]
    assert "25006" in checks["write"]["detail"]  # SQLSTATE read_only_sql_transaction
