"""What oncewire checks of a SQLite file around opening it, apart from its schema.

- A file that is not SQLite is refused before SQLite touches it: SQLite itself takes a one-byte
  file for an empty database and writes a new one over it.
- A file SQLite reports corrupt is not opened for writing. ``PRAGMA quick_check`` reads every
  page (about 0.2 s per 100 MB from the page cache, several times that from a cold disk), so it
  runs on the first open of each file in a process, and again on a later open only when the
  file's header looks wrong (cut short, not a whole number of pages): cheap enough for every
  open, and the process that will write is the one that checked.
- When the file or its directory refuses writes, the error says which and why (a read-only
  mount, the directory's or the file's permissions), and whether a read-only open can read it:
  a WAL database needs its ``-shm`` beside it, and where that cannot be created the file is read
  as an immutable snapshot (which would miss commits still in a ``-wal``, so one is refused).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

from oncewire.core.errors import StoreUnusable
from oncewire.storage.sqlite.errors import translated
from oncewire.storage.sqlite.header import read_header

__all__ = [
    "HEADER_BYTES",
    "explained",
    "in_wal_mode",
    "integrity_problems",
    "needs_snapshot",
    "path_from_url",
    "read_only_cause",
    "refuse_unless_sqlite",
    "snapshot_warning",
    "verify_integrity",
    "wal_index_missing",
]

MAGIC = b"SQLite format 3\x00"
HEADER_BYTES = 100
LISTED = 3  # problems named in a refusal

_CORRUPT_CODES = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB: what quick_check's own failure means
_verified: set[tuple[int, int]] = set()  # (device, inode) of the files checked in this process
_verified_lock = threading.Lock()


def path_from_url(url: str) -> str:
    """The file a ``sqlite:`` URL names (a plain path names itself)."""
    for prefix in ("sqlite:///", "sqlite://", "sqlite:"):
        if url.startswith(prefix):
            rest = url[len(prefix) :]
            return "/" + rest if prefix == "sqlite:///" and not rest.startswith("/") else rest
    return url


def _head(path: str) -> bytes | None:
    # Never through open()/close(): closing a descriptor of the file would drop every SQLite
    # lock this process holds on it (header.py).
    return read_header(path, HEADER_BYTES)


def refuse_unless_sqlite(path: str) -> None:
    """Refuse a file that is not empty and does not start with SQLite's header, untouched."""
    head = _head(path)
    if not head:
        return  # a new or empty file becomes a store
    if not head.startswith(MAGIC):
        raise StoreUnusable(
            f"{path}: the file is not a SQLite database (it does not start with SQLite's "
            "header); nothing was changed",
            reason="not_a_database",
        )
    if len(head) < HEADER_BYTES:
        raise StoreUnusable(
            f"{path}: the database file is malformed (corrupt): its header is cut short "
            f"({len(head)} of {HEADER_BYTES} bytes); nothing was changed",
            reason="corrupt",
        )


def _header_looks_wrong(path: str) -> bool:
    head = _head(path)
    if not head or len(head) < HEADER_BYTES:
        return bool(head)
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        return True
    size = os.path.getsize(path)
    if size % page_size:
        return True
    # The header's page count holds when its change counter matches "version-valid-for".
    pages = int.from_bytes(head[28:32], "big")
    return head[24:28] == head[92:96] and pages * page_size > size


def integrity_problems(conn: sqlite3.Connection) -> tuple[str, ...]:
    """What ``PRAGMA quick_check`` reports (nothing when the file is sound).

    A check that cannot read the file at all reports SQLite's error as its one problem; a busy
    or locked file raises (translated) instead: that says nothing about the file.
    """
    try:
        rows = conn.execute("PRAGMA quick_check").fetchall()
    except sqlite3.DatabaseError as exc:
        code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
        if code not in _CORRUPT_CODES:
            raise translated("checking the file's integrity", exc) from exc
        return (str(exc),)
    return tuple(str(row[0]) for row in rows if row[0] != "ok")


def verify_integrity(conn: sqlite3.Connection, path: str) -> tuple[str, ...] | None:
    """Refuse a file SQLite reports corrupt; return what was found (None: not checked now)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    if stat.st_size == 0:
        return None
    identity = (stat.st_dev, stat.st_ino)
    with _verified_lock:
        seen = identity in _verified
    if seen and not _header_looks_wrong(path):
        return None
    problems = integrity_problems(conn)
    if problems:
        shown = "; ".join(problems[:LISTED])
        more = f" and {len(problems) - LISTED} more" if len(problems) > LISTED else ""
        raise StoreUnusable(
            f"{path}: the database file is malformed (corrupt): PRAGMA quick_check: "
            f"{shown}{more}. oncewire does not write into a file SQLite reports corrupt, and "
            "nothing was changed: restore it from a backup (or recover it with sqlite3's "
            ".recover); a read-only open (--read-only, read_only=True) reads what is left",
            reason="corrupt",
            problems=list(problems),
        )
    with _verified_lock:
        _verified.add(identity)
    return ()


def read_only_cause(path: str) -> str | None:
    """Why this process cannot write ``path`` or create files beside it, if it cannot."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"the file system holding {folder} is mounted read-only"
    except OSError:
        return None
    if not os.access(folder, os.W_OK):
        return f"this user may not create files in {folder}"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"this user may not write to {path} (its permissions or attributes)"
    return None


def in_wal_mode(path: str) -> bool:
    """The file's header says it is a WAL database (its format's read and write versions)."""
    return (_head(path) or b"")[18:20] == b"\x02\x02"


def wal_index_missing(path: str) -> bool:
    """A WAL database whose ``-shm`` (the WAL's shared-memory index) is not beside it."""
    return in_wal_mode(path) and not Path(f"{path}-shm").exists()


def needs_snapshot(exc: StoreUnusable, path: str) -> bool:
    """Whether a read-only open that failed with ``exc`` can read ``path`` as an immutable
    snapshot: a WAL database with no ``-shm``, which this process cannot create. Raises when
    it cannot because its ``-wal`` holds commits that a snapshot of the file alone would miss."""
    cause = read_only_cause(path)
    if exc.fields.get("reason") != "cannot_open" or cause is None or not wal_index_missing(path):
        return False
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise StoreUnusable(
            f"{path}: its -wal holds commits that are not in the file yet, and there is no "
            f"-shm beside it, which SQLite cannot create ({cause}): reading the file alone "
            "would miss those commits. Copy the file and its -wal to a writable directory and "
            "read the copy",
            reason="read_only",
            cause=cause,
        ) from exc
    return True


def snapshot_warning(path: str) -> str:
    return (
        f"{path}: {read_only_cause(path)}, so SQLite cannot create the WAL's -shm beside it: "
        "reading the file as a read-only snapshot (what another process writes to it meanwhile "
        "is not seen)"
    )


def explained(exc: StoreUnusable, path: str, *, read_only: bool) -> StoreUnusable | None:
    """``exc`` saying why this process cannot write ``path``, when that is why it failed (None:
    nothing to add)."""
    if exc.fields.get("reason") not in ("read_only", "cannot_open") or "cause" in exc.fields:
        return None
    cause = read_only_cause(path) if path != ":memory:" else None
    if cause is None:
        return None
    what = str(exc)
    if not read_only and wal_index_missing(path):
        what += f" (a WAL database: SQLite must create {path}-shm beside it to open it)"
    if not read_only:
        cause += "; a read-only open (--read-only, read_only=True) can read it"
    return StoreUnusable(
        f"{what}: {cause}", **{**exc.fields, "reason": "read_only", "cause": cause}
    )
