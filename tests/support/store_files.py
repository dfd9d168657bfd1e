"""Damaged and read-only SQLite stores, made for real: a store filled through the Ledger whose
pages are then overwritten with garbage, and a store on a tmpfs mounted read-only.

A corrupt fixture is a real store's file with some of its pages replaced by random bytes (found
with SQLite's ``dbstat`` table, which says which page holds what), so ``PRAGMA quick_check``
reports it the way it reports a disk that lost pages. Read-only mounts need ``mount`` and the
right to use it (tests run as root, which bypasses file permissions: a real read-only mount is
the only read-only root cannot write through); where mounting is not permitted the test skips
and says why.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from oncewire import Ledger

__all__ = [
    "cli",
    "digest",
    "journal_mode",
    "made_store",
    "one_error_line",
    "quick_check",
    "read_only_mount",
    "scribble_pages",
    "tables",
]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def journal_mode(path: Path) -> str:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])


def tables(path: Path) -> list[str]:
    """Every table in the file, read around oncewire (read-only: the file is left as it is)."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        return [str(name) for (name,) in rows]


def quick_check(path: Path) -> list[str]:
    """What SQLite itself says of the file (``["ok"]`` when sound)."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        try:
            return [str(row[0]) for row in conn.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError as exc:
            return [str(exc)]


def made_store(path: Path, effects: int = 2000, *, journal: str = "wal") -> Path:
    """A real store holding ``effects`` effects, checkpointed into its file (no -wal left)."""
    with Ledger(str(path)) as ledger, ledger.transaction() as tx:
        for n in range(effects):
            tx.accept(f"order-{n:05d}", "email", {"n": n, "pad": "x" * 400})
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        if journal != "wal":
            conn.execute(f"PRAGMA journal_mode = {journal}")
    return path


def scribble_pages(path: Path, table: str = "oncewire_effects", count: int = 8) -> list[int]:
    """Overwrite ``count`` pages of ``table`` in the middle of the file with random bytes.

    For a table, leaf pages from the middle of its key range: an insert of a new key at the end
    does not touch them, so only an integrity check finds them. For ``sqlite_schema``, every
    page of the schema but the first (which holds the file's header).
    """
    with closing(sqlite3.connect(path)) as conn:
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        try:
            kinds = "('leaf', 'internal', 'overflow')" if table == "sqlite_schema" else "('leaf')"
            rows = conn.execute(
                f"SELECT pageno FROM dbstat WHERE name = ? AND pagetype IN {kinds} ORDER BY pageno",
                (table,),
            ).fetchall()
        except sqlite3.OperationalError as exc:  # built without SQLITE_ENABLE_DBSTAT_VTAB
            pytest.skip(f"this SQLite has no dbstat table to find the pages to damage: {exc}")
    pages = [int(p) for (p,) in rows if int(p) != 1]
    if table != "sqlite_schema":
        middle = len(pages) // 2
        pages = pages[middle : middle + count]
    assert pages, f"{table} has no page to damage"
    noise = random.Random(f"{path.name}:{table}")
    with path.open("r+b") as f:
        for page in pages:
            f.seek((page - 1) * page_size)
            f.write(noise.randbytes(page_size))
    return pages


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


@contextmanager
def read_only_mount(where: Path, *files: Path) -> Iterator[Path]:
    """A tmpfs at ``where`` holding copies of ``files``, then remounted read-only.

    Skips the test when this host does not let it mount (no ``mount``, not root, a container
    without CAP_SYS_ADMIN); unmounts afterwards.
    """
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("mount/umount are not installed: no read-only mount to test against")
    where.mkdir(parents=True, exist_ok=True)
    made = _run("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where))
    if made.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {made.stderr.strip()}")
    try:
        for file in files:
            shutil.copy2(file, where / file.name)
        remounted = _run("mount", "-o", "remount,ro", str(where))
        if remounted.returncode != 0:
            pytest.skip(f"remounting read-only is not permitted here: {remounted.stderr.strip()}")
        yield where
    finally:
        if _run("umount", str(where)).returncode != 0:
            _run("umount", "-l", str(where))  # a child still held a file: detach it


BIN = Path(sys.executable).parent
ONCEWIRE = shutil.which("oncewire", path=str(BIN)) or shutil.which("oncewire")


def cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real ``oncewire`` console script, run as a child process."""
    assert ONCEWIRE, "the oncewire console script is not installed next to this Python"
    base = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
    return subprocess.run(
        [ONCEWIRE, *map(str, args)],
        env={**base, **(env or {})},
        input="",
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The command failed with one ``error:`` line on stderr and no traceback: that line."""
    assert result.returncode != 0, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]
