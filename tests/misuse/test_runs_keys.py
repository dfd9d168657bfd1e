"""A run store opened with a key that does not fit its histories (a keyed store without its key
or with another key, a keyless store with a key): a ConfigurationError naming
ONCEWIRE_RUNS_KEY before any verdict, never a healthy run judged tampered. How a keyless store
gains a key (``adopt_key``), and that a real tamper is still a verdict. The CLI's readers agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.core.errors import ConfigurationError, TransitionRefused
from oncewire.testing import ManualClock
from tests.contract.conftest import RawDatabase

KEY = b"the-right-key"
OTHER = b"another-key"
E = "e" * 64
CANDIDATE: dict[str, Any] = {
    "candidate_id": "c-1",
    "snapshot_sha256": "a" * 64,
    "evidence_sha256": E,
    "artifact_set_sha256": "b" * 64,
    "artifact_ids": [],
    "version_ids": [],
}


def open_ledger(url: str, key: bytes | None, clock: ManualClock | None = None) -> Ledger:
    return Ledger(url, clock=clock or ManualClock(), runs_key=key)


def write_runs(url: str, key: bytes | None, clock: ManualClock, prefix: str = "") -> None:
    """A verified run and one left active (its lease expires), written under ``key``."""
    with open_ledger(url, key, clock) as ledger:
        runs = ledger.runs
        runs.start(f"{prefix}done", key="s", scope=f"{prefix}s1", owner="w")
        runs.review.record_candidate(f"{prefix}done", key="c", **CANDIDATE)
        runs.review.start_review(
            f"{prefix}done", key="r", review_id="r", candidate_id="c-1", evidence_sha256=E
        )
        runs.review.complete_review(f"{prefix}done", key="rd", review_id="r", verdict="pass")
        runs.review.terminate(f"{prefix}done", key="t", status="verified", reason="review_passed")
        runs.start(f"{prefix}open", key="s", scope=f"{prefix}s2", owner="w", lease_seconds=5)
        runs.review.record_candidate(f"{prefix}open", key="c", **CANDIDATE)


def stored(raw: RawDatabase) -> tuple[Any, ...]:
    return (
        [tuple(r) for r in raw.query("SELECT run_id, status, abandoned_at FROM oncewire_runs")],
        raw.count("oncewire_run_events"),
        raw.count("oncewire_run_reports"),
    )


def every_reader_refuses(ledger: Ledger, match: str) -> None:
    runs = ledger.runs
    for read in (
        lambda: runs.get("done"),
        lambda: runs.get("open"),
        lambda: runs.verify("done"),
        lambda: runs.verify(),
        lambda: runs.list(),
        lambda: runs.project("s1"),
        lambda: runs.reconcile(owner="rescuer"),
        lambda: runs.review.record_candidate("open", key="c2", **CANDIDATE),
    ):
        with pytest.raises(ConfigurationError, match=match) as refused:
            read()
        assert "ONCEWIRE_RUNS_KEY" in str(refused.value)


@pytest.mark.parametrize("wrong", [None, OTHER], ids=["no-key", "another-key"])
def test_a_keyed_store_opened_without_its_key_is_refused_not_judged(
    store_url: str, raw: RawDatabase, wrong: bytes | None
) -> None:
    clock = ManualClock()
    write_runs(store_url, KEY, clock)
    clock.advance(60)  # the open run's lease expired: reconciliation would take it
    before = stored(raw)
    with open_ledger(store_url, wrong, clock) as ledger:
        every_reader_refuses(ledger, "HMAC-SHA256" if wrong is None else "another key")
    assert stored(raw) == before  # nothing abandoned, no report, no event
    with open_ledger(store_url, KEY, clock) as ledger:
        assert ledger.runs.get("done").status == "verified"
        assert all(v.ok for v in ledger.runs.verify())
        (report,) = ledger.runs.reconcile(owner="rescuer")
        assert (report.outcome, report.status) == ("terminal", "review_unavailable")


def test_the_key_fingerprint_is_stored_never_the_key(store_url: str, raw: RawDatabase) -> None:
    write_runs(store_url, KEY, ManualClock())
    rows = raw.query("SELECT chain, key_id FROM oncewire_runs")
    assert {row[0] for row in rows} == {"hmac-sha256"}
    (fingerprint,) = {row[1] for row in rows}
    assert fingerprint and KEY.hex() not in fingerprint and KEY.decode() not in fingerprint


def test_a_keyless_store_opened_with_a_key_is_refused_until_the_key_is_adopted(
    store_url: str, raw: RawDatabase
) -> None:
    clock = ManualClock()
    write_runs(store_url, None, clock)
    clock.advance(60)
    before = stored(raw)
    with open_ledger(store_url, KEY, clock) as ledger:
        every_reader_refuses(ledger, "without a key")
        # An active keyless run cannot be pinned: a keyed ledger could not extend its chain.
        with pytest.raises(TransitionRefused, match="'open'"):
            ledger.runs.adopt_key()
    assert stored(raw) == before and raw.count("oncewire_run_key_pins") == 0
    with open_ledger(store_url, None, clock) as ledger:
        ledger.runs.review.terminate("open", key="t", status="review_unavailable", reason="stopped")
    with open_ledger(store_url, KEY, clock) as ledger:
        assert sorted(ledger.runs.adopt_key()) == ["done", "open"]
        assert ledger.runs.adopt_key() == []  # nothing left to pin
        assert [v.ok for v in ledger.runs.verify()] == [True, True]
        assert ledger.runs.get("done").status == "verified"
        # New runs are keyed; the old ones stay keyless and verifiable with or without the key.
        ledger.runs.start("new", key="s", scope="s3", owner="w")
    rows = raw.query("SELECT run_id, chain FROM oncewire_runs ORDER BY run_id")
    assert [tuple(r) for r in rows] == [
        ("done", "sha256"),
        ("new", "hmac-sha256"),
        ("open", "sha256"),
    ]
    with open_ledger(store_url, None, clock) as ledger:
        assert ledger.runs.get("done").status == "verified"
        with pytest.raises(ConfigurationError, match="ONCEWIRE_RUNS_KEY"):
            ledger.runs.get("new")


def test_a_pinned_keyless_run_rehashed_without_the_key_is_tampered(
    store_url: str, raw: RawDatabase
) -> None:
    clock = ManualClock()
    write_runs(store_url, None, clock)
    with open_ledger(store_url, None, clock) as ledger:
        ledger.runs.review.terminate("open", key="t", status="review_unavailable", reason="stopped")
    with open_ledger(store_url, KEY, clock) as ledger:
        ledger.runs.adopt_key()
        # Someone with database access moves the pin to another head, or forges a pin.
        raw.execute("UPDATE oncewire_run_key_pins SET head_seq = 99 WHERE run_id = 'done'")
        raw.execute("UPDATE oncewire_run_key_pins SET mac = 'f' || mac WHERE run_id = 'open'")
        results = {v.run_id: v for v in ledger.runs.verify()}
        assert not results["done"].ok and "pin" in (results["done"].reason or "")
        assert not results["open"].ok and "pin" in (results["open"].reason or "")
        assert ledger.runs.get("done").terminal_reason == "safety_boundary"


def test_a_real_tamper_under_the_right_key_is_still_a_verdict(
    store_url: str, raw: RawDatabase
) -> None:
    clock = ManualClock()
    write_runs(store_url, KEY, clock)
    raw.execute("DROP TRIGGER IF EXISTS oncewire_run_events_no_update" + _on(store_url))
    raw.execute(
        "UPDATE oncewire_run_events SET payload = REPLACE(payload, 'review_passed', 'forged') "
        "WHERE run_id = 'done' AND seq = 5"
    )
    with open_ledger(store_url, KEY, clock) as ledger:
        (verification,) = ledger.runs.verify("done")
        assert (verification.ok, verification.first_bad_seq) == (False, 5)
        assert ledger.runs.get("done").terminal_reason == "safety_boundary"


def _on(url: str) -> str:
    return " ON oncewire_run_events" if url.startswith("postgresql") else ""


def _cli(url: str, key: bytes | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
    if key is not None:
        env["ONCEWIRE_RUNS_KEY"] = key.decode()
    return subprocess.run(
        [sys.executable, "-m", "oncewire", "runs", *args, "--db", url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_readers_agree_with_and_without_the_key(store_url: str, raw: RawDatabase) -> None:
    clock = ManualClock()
    write_runs(store_url, KEY, clock)
    raw.execute("UPDATE oncewire_runs SET lease_expires_at = 0 WHERE run_id = 'open'")
    before = stored(raw)
    for key in (None, OTHER):
        for args in (
            ("list",),
            ("show", "done"),
            ("verify",),
            ("verify", "done"),
            ("reconcile", "--owner", "rescuer", "--yes"),
        ):
            refused = _cli(store_url, key, *args)
            assert refused.returncode != 0, (args, refused.stdout)
            assert "ONCEWIRE_RUNS_KEY" in refused.stderr, (args, refused.stderr)
            assert "Traceback" not in refused.stderr and "FAILED" not in refused.stdout
    assert stored(raw) == before
    listed = _cli(store_url, KEY, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    statuses = {r["run_id"]: r["status"] for r in json.loads(listed.stdout)}
    shown = _cli(store_url, KEY, "show", "done", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["run"]["status"] == statuses["done"] == "verified"
    assert _cli(store_url, KEY, "verify").returncode == 0
    reconciled = _cli(store_url, KEY, "reconcile", "--owner", "rescuer", "--yes", "--json")
    assert reconciled.returncode == 0, reconciled.stderr
    assert [r["status"] for r in json.loads(reconciled.stdout)] == ["review_unavailable"]
