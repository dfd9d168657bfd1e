"""Opening a store: permanent failures fail fast, transient ones are waited out (bounded), and a
file oncewire refuses is left exactly as it was.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from oncewire import Ledger
from oncewire.cli import main
from oncewire.core.errors import (
    SchemaError,
    StoreBusy,
    StoreUnreachable,
    StoreUnusable,
)
from oncewire.storage import open_store
from oncewire.storage.sqlite import SQLiteStore
from tests.support.pg import fresh_schema, server_url


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _journal_mode(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        conn.close()


@pytest.fixture
def app_db(tmp_path: Path) -> Path:
    """Another application's SQLite file: its own table, the default (rollback) journal."""
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
    conn.execute("INSERT INTO orders VALUES (1, 9.5)")
    conn.commit()
    conn.close()
    return path


def test_a_foreign_file_that_is_refused_is_left_unchanged(
    app_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _digest(app_db)
    with pytest.raises(SchemaError, match="not an oncewire store"):
        Ledger(str(app_db), create=False)
    assert main(["effects", "list", "--db", str(app_db)]) != 0
    capsys.readouterr()
    assert _journal_mode(app_db) == "delete"  # no switch to WAL
    assert _digest(app_db) == before
    assert not Path(f"{app_db}-wal").exists()


def test_a_file_with_a_newer_schema_is_refused_unchanged(app_db: Path) -> None:
    conn = sqlite3.connect(app_db)
    conn.execute(
        "CREATE TABLE oncewire_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
        "applied_at REAL NOT NULL)"
    )
    conn.execute("INSERT INTO oncewire_schema VALUES (999, '0999_future.sql', 0)")
    conn.commit()
    conn.close()
    before = _digest(app_db)
    with pytest.raises(SchemaError, match="upgrade oncewire"):
        SQLiteStore(str(app_db))  # even with create=True
    assert _journal_mode(app_db) == "delete"
    assert _digest(app_db) == before


def test_sharing_a_file_with_the_callers_tables_is_the_intended_use(app_db: Path) -> None:
    # create=True: oncewire's tables join the app's
    with Ledger(str(app_db)) as ledger, ledger.transaction() as tx:
        tx.execute("INSERT INTO orders VALUES (:id, :total)", {"id": 2, "total": 3.0})
        tx.accept("order-2", "email", {"order": 2})
    conn = sqlite3.connect(app_db)
    assert conn.execute("SELECT id FROM orders ORDER BY id").fetchall() == [(1,), (2,)]
    assert conn.execute("SELECT key FROM oncewire_effects").fetchall() == [("order-2",)]
    conn.close()
    assert _journal_mode(app_db) == "wal"


def test_a_file_that_is_not_a_database_fails_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 200)
    before = _digest(path)
    with (
        caplog.at_level(logging.WARNING, logger="oncewire.storage"),
        pytest.raises(StoreUnusable, match="not a SQLite database") as caught,
    ):
        SQLiteStore(str(path), open_timeout_seconds=60)
    assert not caught.value.transient
    assert not [r for r in caplog.records if "trying again" in r.getMessage()]  # no retry
    assert _digest(path) == before


def test_a_corrupt_database_is_unusable_not_transient(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.db"
    with Ledger(str(path)) as ledger:
        for n in range(300):
            ledger.accept(f"k-{n:04d}", "send", {"pad": "x" * 200})
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    (root,) = conn.execute(
        "SELECT rootpage FROM sqlite_master WHERE name = 'oncewire_effects'"
    ).fetchone()
    conn.close()
    with path.open("r+b") as f:  # scribble over the effects table's root page
        f.seek((int(root) - 1) * page_size)
        f.write(b"\xa5" * page_size)
    with (
        pytest.raises(StoreUnusable, match="malformed") as caught,
        Ledger(str(path), create=False) as ledger,
    ):
        ledger.effects.list(limit=1000)
    assert not caught.value.transient


def test_opening_waits_out_a_writer_holding_the_file(
    app_db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """BEGIN EXCLUSIVE in another connection: opening retries (logging) until it is released."""
    holder = sqlite3.connect(app_db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("INSERT INTO orders VALUES (5, 1.0)")
    released = threading.Timer(1.5, lambda: holder.execute("COMMIT"))
    released.start()
    try:
        with caplog.at_level(logging.WARNING, logger="oncewire.storage"):
            store = SQLiteStore(str(app_db), busy_timeout_ms=100, open_timeout_seconds=60)
        store.close()
    finally:
        released.join()
        holder.close()
    retries = [r for r in caplog.records if "trying again" in r.getMessage()]
    assert retries and "store_busy" in retries[0].getMessage()
    conn = sqlite3.connect(app_db)
    assert conn.execute("SELECT COUNT(*) FROM orders").fetchone() == (2,)
    assert conn.execute("SELECT COUNT(*) FROM oncewire_schema").fetchone()[0] >= 1
    conn.close()


def test_opening_gives_up_on_a_lock_after_its_open_timeout(app_db: Path) -> None:
    holder = sqlite3.connect(app_db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreBusy) as caught:
            SQLiteStore(str(app_db), busy_timeout_ms=50, open_timeout_seconds=0.5)
        assert caught.value.transient
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert _journal_mode(app_db) == "delete"


# -- PostgreSQL ---------------------------------------------------------------------------------

_OPENER = textwrap.dedent(
    """
    import logging, sys, time
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from oncewire.storage.postgres import PostgresStore
    url, seconds = sys.argv[1], float(sys.argv[2])
    opened, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        store = PostgresStore(url, open_timeout_seconds=30)
        try:
            store.schema_version()
        finally:
            store.close()
        opened += 1
    print(opened)
    """
)


def test_a_store_opening_rides_out_terminated_connections() -> None:
    """A worker whose connection is terminated while it opens (reads the schema, migrates)
    tries again instead of exiting: a real child process opens in a loop while this test
    terminates its backends."""
    base = server_url()
    name = f"oncewire_open_{uuid.uuid4().hex[:8]}"
    with fresh_schema(base, "open") as url:
        import psycopg

        open_store(url).close()  # migrated: the child's opens connect and read the schema
        child = subprocess.Popen(
            [sys.executable, "-c", _OPENER, f"{url}&application_name={name}", "4"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        terminated = 0
        with psycopg.connect(base, autocommit=True) as admin:
            while child.poll() is None:
                rows = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (name,),
                ).fetchall()
                terminated += sum(1 for (ok,) in rows if ok)
                time.sleep(random.uniform(0.05, 0.5))  # room for an open between bursts
        out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert int(out.strip()) >= 1
    assert terminated >= 1
    assert "trying again" in err  # some terminations landed while a store was opening


@pytest.fixture
def silent_server() -> tuple[str, int]:
    """A local port that accepts TCP connections into its backlog and never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield sock.getsockname()  # type: ignore[misc]
    finally:
        sock.close()


def test_the_urls_connect_timeout_is_honoured(silent_server: tuple[str, int]) -> None:
    host, port = silent_server
    started = time.monotonic()
    with pytest.raises(StoreUnreachable, match="connection failed") as caught:
        open_store(f"postgresql://{host}:{port}/test?connect_timeout=2", open_timeout_seconds=0)
    elapsed = time.monotonic() - started
    assert caught.value.transient
    # 2 s asked for, not the default of 10 s (psycopg waits at least 2 s).
    assert 1.5 <= elapsed < 8.0


def test_a_read_only_database_fails_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An immutable file (chattr +i: read-only even for root) is unusable, not retried."""
    path = tmp_path / "ro.db"
    with Ledger(str(path)) as ledger:
        ledger.accept("k-1", "send", {})
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = DELETE")  # no -wal/-shm files left beside it
    conn.close()
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        with (
            caplog.at_level(logging.WARNING, logger="oncewire.storage"),
            pytest.raises(StoreUnusable) as caught,
            Ledger(SQLiteStore(str(path), create=False, open_timeout_seconds=60)) as ledger,
        ):
            ledger.accept("k-2", "send", {})
        assert not caught.value.transient
        assert not [r for r in caplog.records if "trying again" in r.getMessage()]
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
