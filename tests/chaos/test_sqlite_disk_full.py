"""A SQLite store whose disk fills up: a clear error, nothing half-written, progress when space
returns.

Two ways to fill it. A real small filesystem (a 4 MB tmpfs mounted for the test, filled with a
filler file; skipped where mounting is not permitted), under accepts in the caller's own
transaction and a running :class:`~oncewire.Dispatcher`; and ``PRAGMA max_page_count`` set on
the store's connection (always runs), where SQLite answers a write that would grow the file
past the limit exactly as it answers a full disk. Either way the write raises
:class:`~oncewire.errors.StoreFull` naming the file and the full disk, and a fresh connection
finds the file intact (``integrity_check``) with the caller's rows and the effects, attempts and
receipts consistent with each other. Once the filler is deleted (or the limit raised) accepting
and dispatching go on, and every effect is done once.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import Attempt, Dispatcher, Ledger, Receipts, ReceiptsSink
from oncewire.errors import StoreFull
from oncewire.storage.driver import Transaction


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A 4 MB tmpfs of the test's own, always unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    root = Path(tempfile.mkdtemp(prefix="oncewire-chaos-disk-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(root)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        root.rmdir()
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
        root.rmdir()


def _fill(filler: Path) -> int:
    """Write ``filler`` until the filesystem has no space left; the bytes written."""
    written = 0
    chunk = b"\0" * 65536
    with filler.open("wb", buffering=0) as out:
        while True:
            try:
                written += out.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return written
                chunk = chunk[: len(chunk) // 2]


def _peek(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(str(db), timeout=10)
    try:
        return [tuple(row) for row in conn.execute(sql, params).fetchall()]
    finally:
        conn.close()


def _check_consistent(db: Path, receiver: Path) -> dict[str, str]:
    """What a fresh connection finds: the file intact, the caller's rows and the effects the
    same keys, and a done effect exactly one with one done attempt and one receipt."""
    assert _peek(db, "PRAGMA integrity_check") == [("ok",)]
    orders = sorted(k for (k,) in _peek(db, "SELECT key FROM orders"))
    states = dict(_peek(db, "SELECT key, state FROM oncewire_effects"))
    assert orders == sorted(states)
    assert set(states.values()) <= {"pending", "claimed", "done"}
    done = sorted(k for k, s in states.items() if s == "done")
    attempts = _peek(
        db,
        "SELECT e.key FROM oncewire_attempts AS a JOIN oncewire_effects AS e "
        "ON e.id = a.effect_id WHERE a.state = 'done'",
    )
    assert sorted(k for (k,) in attempts) == done
    if receiver.exists() and done:
        receipts = {k for (k,) in _peek(receiver, "SELECT key FROM oncewire_receipts")}
        assert set(done) <= receipts
    return states


def _receiver(path: Path) -> tuple[Receipts, Any, list[tuple[str, int, bool]]]:
    receipts = Receipts(str(path))
    calls: list[tuple[str, int, bool]] = []

    def work(tx: Transaction, attempt: Attempt) -> int:
        tx.execute("CREATE TABLE IF NOT EXISTS tickets (key TEXT NOT NULL, fence INTEGER)")
        tx.execute(
            "INSERT INTO tickets (key, fence) VALUES (:key, :fence)",
            {"key": attempt.key, "fence": attempt.fence},
        )
        return attempt.fence

    inner = ReceiptsSink(receipts, work)

    def ticket(attempt: Attempt) -> Any:
        calls.append((attempt.key, attempt.fence, attempt.redelivery))
        return inner(attempt)

    return receipts, ticket, calls


def _accept(ledger: Ledger, key: str) -> None:
    """The caller's own row and the effect, in one transaction."""
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO orders (key) VALUES (:key)", {"key": key})
        tx.accept(key, "ticket", {"key": key, "pad": "x" * 400})


def _check_done(db: Path, receiver: Path, keys: list[str], calls: list[Any]) -> None:
    states = _check_consistent(db, receiver)
    assert sorted(states) == sorted(keys) and set(states.values()) == {"done"}
    tickets = Counter(k for (k,) in _peek(receiver, "SELECT key FROM tickets"))
    assert tickets == Counter(dict.fromkeys(keys, 1))
    seen: dict[str, list[bool]] = {}
    for key, _, redelivery in sorted(calls, key=lambda c: (c[0], c[1])):
        seen.setdefault(key, []).append(redelivery)
    assert sorted(seen) == sorted(keys)
    for key, flags in seen.items():  # a first call unflagged, every repeat flagged
        assert not flags[0] and all(flags[1:]), (key, flags)


def test_a_full_filesystem_fails_accept_and_dispatch_clearly_and_both_resume(
    small_disk: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="oncewire.dispatch")
    db, filler, receiver_db = small_disk / "app.db", small_disk / "filler", tmp_path / "rx.db"
    receipts, ticket, calls = _receiver(receiver_db)
    ledger = Ledger(str(db))
    try:
        with ledger.transaction() as tx:
            tx.execute("CREATE TABLE orders (key TEXT PRIMARY KEY)")
        keys = [f"k{i:05d}" for i in range(40)]
        for key in keys:
            _accept(ledger, key)
        assert _fill(filler) > 0

        # Accepting on the full disk: a clear error at the first write that needs space.
        failed: StoreFull | None = None
        for i in range(len(keys), 20_000):
            key = f"k{i:05d}"
            try:
                _accept(ledger, key)
            except StoreFull as exc:
                failed = exc
                break
            keys.append(key)
        assert failed is not None, "the disk never filled"
        assert str(db) in str(failed) and "disk full" in str(failed), str(failed)
        assert failed.code == "store_full" and failed.transient
        states = _check_consistent(db, receiver_db)  # the refused key is in neither table
        assert sorted(states) == keys

        # Dispatching on the full disk: the dispatcher rides the errors out, stores nothing
        # half-written, and finishes once the filler is gone.
        dispatcher = Dispatcher(
            ledger, {"ticket": ticket}, batch_size=8, poll_seconds=0.05,
            storage_patience_seconds=600,
        )  # fmt: skip
        thread = threading.Thread(
            target=lambda: dispatcher.run(handle_signals=False), name="dispatch", daemon=True
        )
        thread.start()
        deadline = time.monotonic() + 60
        while dispatcher.stats.storage_errors < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dispatcher.stats.storage_errors >= 3, dispatcher.stats.as_dict()
        assert thread.is_alive()
        _check_consistent(db, receiver_db)
        logged = [r.getMessage() for r in caplog.records if "store unavailable" in r.getMessage()]
        assert logged and all("disk full" in m and str(db) in m for m in logged), logged[:3]

        filler.unlink()  # space returns
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if set(dict(_peek(db, "SELECT key, state FROM oncewire_effects")).values()) == {"done"}:
                break
            time.sleep(0.1)
        more = [f"k{i:05d}" for i in range(len(keys), len(keys) + 10)]  # the refused one too
        for key in more:
            _accept(ledger, key)
        keys += more
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            states = dict(_peek(db, "SELECT key, state FROM oncewire_effects"))
            if len(states) == len(keys) and set(states.values()) == {"done"}:
                break
            time.sleep(0.1)
        dispatcher.stop()
        thread.join(timeout=60)
        assert not thread.is_alive()
    finally:
        ledger.close()
        receipts.close()
    _check_done(db, receiver_db, keys, calls)


def test_a_page_limit_fails_accept_and_dispatch_clearly_and_both_resume(tmp_path: Path) -> None:
    db, receiver_db = tmp_path / "app.db", tmp_path / "rx.db"
    receipts, ticket, calls = _receiver(receiver_db)
    ledger = Ledger(str(db))
    try:
        with ledger.transaction() as tx:
            tx.execute("CREATE TABLE orders (key TEXT PRIMARY KEY)")
        conn = ledger.store.db.conn()  # this thread's connection: the accepts' and dispatch's

        def limit(pages: int) -> None:
            conn.execute(f"PRAGMA max_page_count = {pages}")

        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        limit(pages + 2)
        keys: list[str] = []
        failed: StoreFull | None = None
        for i in range(5_000):
            try:
                _accept(ledger, f"k{i:05d}")
            except StoreFull as exc:
                failed = exc
                break
            keys.append(f"k{i:05d}")
        assert failed is not None and keys
        assert str(db) in str(failed) and "disk full" in str(failed), str(failed)
        assert sorted(_check_consistent(db, receiver_db)) == keys

        # The dispatcher on this thread (this connection): it keeps failing, then gives up
        # after its patience with the same clear error; nothing is half-written.
        limit(int(conn.execute("PRAGMA page_count").fetchone()[0]))
        dispatcher = Dispatcher(
            ledger, {"ticket": ticket}, batch_size=64, storage_patience_seconds=1.0
        )
        with pytest.raises(StoreFull):
            dispatcher.run(until_idle=True, handle_signals=False)
        assert dispatcher.stats.storage_errors >= 2
        _check_consistent(db, receiver_db)

        limit(1_000_000)  # space returns
        keys.append(f"k{len(keys):05d}")  # the refused accept, again
        _accept(ledger, keys[-1])
        Dispatcher(ledger, {"ticket": ticket}, batch_size=64).run(
            until_idle=True, handle_signals=False
        )
    finally:
        ledger.close()
        receipts.close()
    _check_done(db, receiver_db, keys, calls)
