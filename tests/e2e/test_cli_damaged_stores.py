"""The real ``oncewire`` command on a corrupt store and on a store it may not write to.

A corrupt store is a real store whose pages were overwritten with garbage: doctor reports every
check it can run on it (the integrity check failing with what SQLite says), and no writer writes
into it. A read-only store is a real read-only mount (root writes through file permissions):
readers read it, doctor says what is read-only, a writer says why it cannot write.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from tests.support.store_files import (
    cli,
    digest,
    journal_mode,
    made_store,
    one_error_line,
    quick_check,
    read_only_mount,
    scribble_pages,
    tables,
)


def _checks(stdout: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in json.loads(stdout)}


def _keys(path: Path, limit: int) -> list[str]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)) as conn:
        rows = conn.execute("SELECT key FROM oncewire_effects ORDER BY id DESC LIMIT ?", (limit,))
        return [key for (key,) in rows]


@pytest.fixture
def corrupt(tmp_path: Path) -> Path:
    path = made_store(tmp_path / "corrupt.db")
    scribble_pages(path, "oncewire_effects")
    assert quick_check(path) != ["ok"]
    return path


# -- a corrupt store ----------------------------------------------------------------------------


def test_doctor_runs_its_checks_on_a_corrupt_store(corrupt: Path) -> None:
    sqlite_says = quick_check(corrupt)
    before = digest(corrupt)
    result = cli("doctor", "--db", corrupt, "--json")
    assert result.returncode == 1, result.stderr
    assert "error:" not in result.stderr
    checks = _checks(result.stdout)
    assert checks["integrity"]["status"] == "fail"
    assert checks["integrity"]["detail"].startswith("PRAGMA quick_check: ")
    assert sqlite_says[0] in checks["integrity"]["detail"]
    assert "backup" in checks["integrity"]["fix"]
    # The checks that can still run are shown: the schema is readable, so are its objects.
    assert checks["schema"]["status"] == "ok"
    assert checks["objects"]["status"] == "ok"
    assert checks["write"]["status"] == "fail"
    assert "quick_check" in checks["write"]["detail"]
    assert digest(corrupt) == before  # doctor only read it

    text = cli("doctor", "--db", corrupt)
    assert text.returncode == 1
    assert f"[FAIL] integrity: PRAGMA quick_check: {sqlite_says[0]}" in text.stdout


def test_doctor_on_a_store_whose_schema_pages_are_garbage(tmp_path: Path) -> None:
    path = made_store(tmp_path / "schema.db")
    scribble_pages(path, "sqlite_schema")
    sqlite_says = quick_check(path)
    assert sqlite_says != ["ok"]
    result = cli("doctor", "--db", path, "--json")
    assert result.returncode == 1, result.stderr
    checks = _checks(result.stdout)
    assert checks["open"]["status"] == "fail"
    assert "malformed" in checks["open"]["detail"]
    assert "check --db" not in checks["open"]["fix"]  # it exists; it is damaged
    assert checks["integrity"]["status"] == "fail"
    assert sqlite_says[0] in checks["integrity"]["detail"]


@pytest.mark.parametrize(
    "command",
    [
        ("effects", "accept", "order-new", "email", '{"n": -1}'),
        ("effects", "cancel", "order-00001", "--yes"),
    ],
    ids=["accept", "cancel"],
)
def test_a_writer_refuses_a_corrupt_store_and_leaves_it_as_it_was(
    corrupt: Path, command: tuple[str, ...]
) -> None:
    before = digest(corrupt)
    line = one_error_line(cli(*command, "--db", corrupt))
    assert "malformed" in line and "quick_check" in line, line
    assert str(corrupt) in line
    assert digest(corrupt) == before
    assert journal_mode(corrupt) == "wal"
    assert not Path(f"{corrupt}-wal").exists() or Path(f"{corrupt}-wal").stat().st_size == 0


def test_a_reader_reads_what_is_left_of_a_corrupt_store_with_read_only(corrupt: Path) -> None:
    before = digest(corrupt)
    refused = one_error_line(cli("effects", "list", "--db", corrupt, "--limit", "3"))
    assert "--read-only" in refused
    result = cli("effects", "list", "--db", corrupt, "--limit", "3", "--json", "--read-only")
    assert result.returncode == 0, result.stderr
    assert [e["key"] for e in json.loads(result.stdout)] == _keys(corrupt, 3)
    assert digest(corrupt) == before


# -- a read-only store --------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A WAL store cleanly closed (no -wal, no -shm): what a read-only mount usually holds."""
    path = made_store(tmp_path / "store.db", effects=50)
    assert not Path(f"{path}-shm").exists()
    return path


def test_readers_read_a_store_on_a_read_only_mount(tmp_path: Path, store: Path) -> None:
    with read_only_mount(tmp_path / "ro", store) as mount:
        path = mount / store.name
        result = cli("effects", "list", "--db", path, "--limit", "5", "--json")
        assert result.returncode == 0, result.stderr
        assert [e["key"] for e in json.loads(result.stdout)] == _keys(store, 5)
        # SQLite cannot create the WAL's -shm there: the file is read as a snapshot, said once.
        assert "snapshot" in result.stderr and "read-only" in result.stderr
        assert len(result.stderr.splitlines()) == 1
        for command in (
            ("effects", "show", "order-00007"),
            ("runs", "list"),
            ("receipts", "list"),
            ("inbound", "list"),
            ("replies", "counts"),
        ):
            shown = cli(*command, "--db", path, "--json")
            assert shown.returncode == 0, (command, shown.stderr)
        shown = cli("effects", "show", "order-00007", "--db", path, "--json")
        assert json.loads(shown.stdout)["effect"]["key"] == "order-00007"
        assert sorted(p.name for p in mount.iterdir()) == [store.name]


def test_doctor_says_what_is_read_only(tmp_path: Path, store: Path) -> None:
    with read_only_mount(tmp_path / "ro", store) as mount:
        result = cli("doctor", "--db", mount / store.name, "--json")
    assert result.returncode == 1, result.stderr
    checks = _checks(result.stdout)
    assert checks["write"]["status"] == "fail"
    assert "mounted read-only" in checks["write"]["detail"]
    assert str(mount) in checks["write"]["detail"]
    assert "remount" in checks["write"]["fix"]
    assert "check --db" not in json.dumps(checks)
    for name in ("schema", "integrity", "objects", "effects"):
        assert checks[name]["status"] == "ok", checks[name]


def test_a_writer_on_a_read_only_mount_says_why(tmp_path: Path, store: Path) -> None:
    with read_only_mount(tmp_path / "ro", store) as mount:
        line = one_error_line(
            cli("effects", "accept", "k-new", "email", "{}", "--db", mount / store.name)
        )
    assert "mounted read-only" in line and str(mount) in line, line


def test_a_delete_journal_store_on_a_read_only_mount_is_read_without_a_snapshot(
    tmp_path: Path,
) -> None:
    store = made_store(tmp_path / "shipped.db", effects=20, journal="delete")
    with read_only_mount(tmp_path / "ro", store) as mount:
        result = cli("effects", "list", "--db", mount / store.name, "--json", "--limit", "2")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert [e["key"] for e in json.loads(result.stdout)] == _keys(store, 2)


def test_a_wal_without_its_shm_is_not_read_as_a_stale_snapshot(tmp_path: Path) -> None:
    live = made_store(tmp_path / "live.db", effects=5)
    copies = tmp_path / "copies"
    copies.mkdir()
    with closing(sqlite3.connect(live)) as holder:  # keeps the -wal from being checkpointed
        holder.execute("PRAGMA wal_autocheckpoint = 0")
        holder.execute("SELECT 1 FROM oncewire_effects").fetchall()
        with Ledger(str(live)) as ledger:
            ledger.accept("only-in-the-wal", "email", {})
        shutil.copy2(live, copies / live.name)
        shutil.copy2(f"{live}-wal", copies / f"{live.name}-wal")
    with read_only_mount(tmp_path / "ro", copies / live.name, copies / f"{live.name}-wal") as m:
        line = one_error_line(cli("effects", "list", "--db", m / live.name, "--read-only"))
    assert "-wal" in line and "-shm" in line, line


def test_read_only_reads_a_copy_without_changing_it(tmp_path: Path) -> None:
    copy = made_store(tmp_path / "copy.db", effects=10, journal="delete")
    before = digest(copy)
    for command in (("effects", "list"), ("runs", "list"), ("doctor",)):
        result = cli(*command, "--db", copy, "--read-only", "--json")
        assert result.returncode == 0, (command, result.stdout, result.stderr)
    assert digest(copy) == before
    assert journal_mode(copy) == "delete"  # a plain reader would have switched it to WAL
    assert "oncewire_effects" in tables(copy)
    checks = _checks(cli("doctor", "--db", copy, "--read-only", "--json").stdout)
    assert checks["write"]["status"] == "warn"
    assert "--read-only" in checks["write"]["detail"]
