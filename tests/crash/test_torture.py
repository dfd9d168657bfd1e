"""The torture suite at scale: dispatchers SIGKILLed at random, invariants read from the stores.

The default run keeps bounded versions (SQLite 1,000 effects and 10 kills; PostgreSQL 400 and 8
with four workers); ``make soak`` runs the full ones (10,000 effects and 100 kills on SQLite,
and on PostgreSQL with four workers). Each test re-reads the kept stores itself, with the
plain driver, so a lab that reported success without the stores agreeing would fail here. The
set-based check the suite uses is also shown to fail on stores that break each invariant.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from oncewire.lab.fixtures import Backend, StorePair, accept_all
from oncewire.lab.framework import LabContext, ScenarioResult
from oncewire.lab.runner import run_lab
from oncewire.lab.suites.torture import check_stores
from tests.support.pg import server_url

pytestmark = pytest.mark.crash


def _read(pair_dir: Path) -> tuple[list[tuple[str, str, str | None]], list[tuple[int, str, int]]]:
    with closing(sqlite3.connect(pair_dir / "caller.sqlite")) as db:
        effects = db.execute("SELECT key, state, result FROM oncewire_effects").fetchall()
    with closing(sqlite3.connect(pair_dir / "downstream.sqlite")) as db:
        tickets = db.execute(
            "SELECT id, operation_id, redelivery FROM tickets ORDER BY id"
        ).fetchall()
    return effects, tickets


def _read_pg(url: str, schemas: list[str]) -> tuple[list[Any], list[Any]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        effects = conn.execute(
            f"SELECT key, state, result FROM {schemas[0]}.oncewire_effects"
        ).fetchall()
        tickets = conn.execute(
            f"SELECT id, operation_id, redelivery FROM {schemas[1]}.tickets ORDER BY id"
        ).fetchall()
    return effects, tickets


def _assert_stores(
    effects: list[Any], tickets: list[Any], summary: dict[str, Any], dedup: bool
) -> None:
    """The invariants again, key by key in Python, from rows read around the lab."""
    keys = {e[0] for e in effects}
    assert len(effects) == summary["operations"] == len(keys)
    assert {e[1] for e in effects} <= {"done", "dead"}
    per_key = Counter(t[1] for t in tickets)
    assert set(per_key) <= keys
    done = {e[0] for e in effects if e[1] == "done"}
    assert done <= set(per_key), "an effect is done without its ticket"
    if dedup:
        assert set(per_key.values()) <= {1}
        ticket_of = {t[1]: t[0] for t in tickets}
        assert all(e[2] == f'{{"ticket_id":{ticket_of[e[0]]}}}' for e in effects if e[1] == "done")
    else:
        seen: set[str] = set()
        for _, key, redelivery in tickets:
            assert key not in seen or redelivery == 1, f"{key}: an extra ticket arrived unflagged"
            seen.add(key)


def _run_sqlite(tmp_path: Path, operations: int, kills: int, workers: int, seed: int) -> None:
    evidence = run_lab(
        ["torture"],
        directory=tmp_path / "lab",
        seed=seed,
        options={"operations": operations, "kills": kills, "workers": workers},
    )
    scenarios = evidence["suites"]["torture"]["scenarios"]
    assert evidence["passed"], [s["failures"] for s in scenarios.values()]
    for mode, dedup in (("dedup", True), ("no_dedup", False)):
        summary = scenarios[f"torture[{mode}]"]["summary"]
        assert summary["kills"] == kills
        assert summary["workers"] == workers
        assert summary["lost"] == 0
        effects, tickets = _read(tmp_path / "lab" / "torture" / mode)
        _assert_stores(effects, tickets, summary, dedup)
        assert summary["tickets"] == len(tickets)


def _run_postgresql(tmp_path: Path, operations: int, kills: int, workers: int) -> None:
    url = server_url()
    evidence = run_lab(
        ["torture"],
        directory=tmp_path / "lab",
        seed=7,
        options={"operations": operations, "kills": kills, "workers": workers},
        backend=Backend("postgresql", url, run_id=f"test{tmp_path.name[-6:]}"),
    )
    import psycopg

    folders = [tmp_path / "lab" / "torture" / mode for mode in ("dedup", "no_dedup")]
    try:
        scenarios = evidence["suites"]["torture"]["scenarios"]
        assert evidence["passed"], [s["failures"] for s in scenarios.values()]
        for folder, dedup in zip(folders, (True, False), strict=True):
            summary = scenarios[f"torture[{folder.name}]"]["summary"]
            assert summary["kills"] == kills
            assert summary["workers"] == workers
            schemas = (folder / "schemas.txt").read_text().split()
            effects, tickets = _read_pg(url, schemas)
            _assert_stores(effects, tickets, summary, dedup)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            for folder in folders:
                if (folder / "schemas.txt").exists():
                    for schema in (folder / "schemas.txt").read_text().split():
                        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.timeout(900)
def test_bounded_torture_on_sqlite(tmp_path: Path) -> None:
    _run_sqlite(tmp_path, operations=1000, kills=10, workers=1, seed=3)


@pytest.mark.timeout(900)
def test_bounded_torture_with_four_workers_on_postgresql(tmp_path: Path) -> None:
    _run_postgresql(tmp_path, operations=400, kills=8, workers=4)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_long_torture_on_sqlite(tmp_path: Path) -> None:
    _run_sqlite(tmp_path, operations=10_000, kills=100, workers=1, seed=1)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_long_torture_with_four_workers_on_postgresql(tmp_path: Path) -> None:
    _run_postgresql(tmp_path, operations=10_000, kills=100, workers=4)


# -- the set-based check fails on stores that break an invariant ------------------------------


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[StorePair]:
    """Five accepted effects, all done, one ticket and one receipt each: every invariant holds."""
    ctx = LabContext(tmp_path, seed=1)
    stores = ctx.stores("check")
    accept_all(stores, 5)
    with closing(sqlite3.connect(stores.downstream)) as db, db:
        for i in range(5):
            key = f"op-{i:05d}"
            db.execute(
                "INSERT INTO tickets (operation_id, payload, attempt, redelivery, service_pid) "
                "VALUES (?, '{}', 1, 0, 1)",
                (key,),
            )
            db.execute(
                "INSERT INTO oncewire_receipts (key, digest, payload, result, created_at) "
                "VALUES (?, 'x', '{}', ?, 0)",
                (key, f'{{"ticket_id":{i + 1}}}'),
            )
    _caller(
        stores,
        "UPDATE oncewire_effects SET state = 'done', "
        "result = '{\"ticket_id\":' || (CAST(substr(key, 4) AS INTEGER) + 1) || '}'",
    )
    yield stores


def _caller(stores: StorePair, sql: str) -> None:
    with closing(sqlite3.connect(stores.caller)) as db, db:
        db.execute(sql)


def _downstream(stores: StorePair, sql: str) -> None:
    with closing(sqlite3.connect(stores.downstream)) as db, db:
        db.execute(sql)


def _failures(stores: StorePair, dedup: bool, accepted: int = 5) -> list[str]:
    result = ScenarioResult("check")
    check_stores(result, stores, accepted, dedup)
    return result.failures


def test_the_check_passes_on_stores_that_hold_every_invariant(pair: StorePair) -> None:
    assert _failures(pair, True) == []
    assert _failures(pair, False) == []


def test_the_check_sees_a_lost_effect(pair: StorePair) -> None:
    _caller(pair, "DELETE FROM oncewire_effects WHERE key = 'op-00003'")
    assert any("missing" in f for f in _failures(pair, True))
    assert any("missing" in f for f in _failures(pair, False))


def test_the_check_sees_an_effect_left_open(pair: StorePair) -> None:
    _caller(
        pair, "UPDATE oncewire_effects SET state = 'pending', result = NULL WHERE key = 'op-00001'"
    )
    assert any("other than done or dead" in f for f in _failures(pair, True))


def test_the_check_sees_a_duplicate_with_receipts_and_an_unflagged_one_without(
    pair: StorePair,
) -> None:
    _downstream(
        pair,
        "INSERT INTO tickets (operation_id, payload, attempt, redelivery, service_pid) "
        "VALUES ('op-00002', '{}', 2, 1, 1)",
    )
    assert any("duplicate ticket(s) despite receipts" in f for f in _failures(pair, True))
    assert _failures(pair, False) == []  # flagged: allowed without receipts
    _downstream(
        pair,
        "INSERT INTO tickets (operation_id, payload, attempt, redelivery, service_pid) "
        "VALUES ('op-00002', '{}', 3, 0, 1)",
    )
    assert any("arrived unflagged" in f for f in _failures(pair, False))


def test_the_check_sees_a_done_effect_without_ticket_and_a_stray_ticket(pair: StorePair) -> None:
    _downstream(pair, "UPDATE tickets SET operation_id = 'never-accepted' WHERE id = 4")
    failures = _failures(pair, False)
    assert any("done without a ticket" in f for f in failures)
    assert any("unaccepted keys" in f for f in failures)


def test_the_check_sees_a_result_that_names_another_ticket(pair: StorePair) -> None:
    _caller(pair, "UPDATE oncewire_effects SET result = '{\"ticket_id\":2}' WHERE key = 'op-00004'")
    assert any("do not name their ticket" in f for f in _failures(pair, True))


def test_the_check_compares_with_what_the_lab_accepted(pair: StorePair) -> None:
    assert any("6 accepted" in f for f in _failures(pair, True, accepted=6))
