"""Reading a SQLite file's header keeps this process's SQLite locks on the file.

The header used to be read through open()/close(), and closing any descriptor of a file drops
every POSIX lock the process holds on it. These tests read headers next to real SQLite
connections and ask another process which locks are held (a process cannot see its own
through F_GETLK, and opening a descriptor to ask would drop them): the connection's lock
survives the read; a file nobody locks is read and closed; a file this process locks keeps
one descriptor, reused, and closed once the lock is gone; a forked child inherits none.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncewire.storage.sqlite import header
from oncewire.storage.sqlite.header import read_header

# Which process holds a lock on SQLite's lock bytes of argv[1] (traditional F_GETLK: it
# reports the holder's pid); null when none does.
HOLDER = r"""
import fcntl, json, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
query = struct.pack("@hhqqi", fcntl.F_WRLCK, 0, 0x40000000, 512, 0)
kind, _, _, _, pid = struct.unpack("@hhqqi", fcntl.fcntl(fd, fcntl.F_GETLK, query))
print(json.dumps(None if kind == fcntl.F_UNLCK else pid))
"""


def holder(path: Path) -> int | None:
    done = subprocess.run(
        [sys.executable, "-c", HOLDER, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    pid: int | None = json.loads(done.stdout)
    return pid


def descriptors(path: Path) -> int:
    """How many of this process's descriptors are open on ``path``."""
    target = os.path.realpath(path)
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}") == target
        except OSError:
            pass  # the directory's own descriptor, gone by now
    return count


@pytest.fixture
def wal_file(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    return path


@pytest.fixture
def reader(wal_file: Path) -> Iterator[sqlite3.Connection]:
    """A connection of this process that holds its shared lock on the file (WAL)."""
    conn = sqlite3.connect(wal_file, isolation_level=None)
    conn.execute("SELECT count(*) FROM t").fetchone()
    try:
        yield conn
    finally:
        conn.close()


pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/fd and uses OFD locks"
)


def test_a_file_nobody_locks_is_read_and_closed(wal_file: Path) -> None:
    head = read_header(str(wal_file), 100)
    assert head is not None and head.startswith(b"SQLite format 3\x00")
    assert descriptors(wal_file) == 0


def test_reading_keeps_the_lock_of_this_process_connection(
    wal_file: Path, reader: sqlite3.Connection
) -> None:
    assert holder(wal_file) == os.getpid()
    sqlites = descriptors(wal_file)  # the connection's own
    for _ in range(3):
        head = read_header(str(wal_file), 100)
        assert head is not None and head[18:20] == b"\x02\x02"  # WAL
    assert holder(wal_file) == os.getpid()  # the connection's shared lock is still there
    assert descriptors(wal_file) == sqlites + 1  # one descriptor kept for the file, and reused


def test_the_kept_descriptor_is_closed_once_nobody_locks_the_file(
    wal_file: Path, reader: sqlite3.Connection
) -> None:
    sqlites = descriptors(wal_file)
    read_header(str(wal_file), 100)
    assert descriptors(wal_file) == sqlites + 1
    reader.close()
    assert holder(wal_file) is None
    assert read_header(str(wal_file), 100) is not None
    assert descriptors(wal_file) == 0


def test_another_process_lock_keeps_the_descriptor_too(wal_file: Path) -> None:
    """Whose lock it is cannot be told from here: held by anyone, the descriptor stays."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
            "c.execute('SELECT count(*) FROM t').fetchone(); print('ready', flush=True); "
            "sys.stdin.read()",
            str(wal_file),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        assert holder(wal_file) == child.pid
        assert read_header(str(wal_file), 100) is not None
        assert descriptors(wal_file) == 1
    finally:
        child.communicate("", timeout=30)
    assert read_header(str(wal_file), 100) is not None
    assert descriptors(wal_file) == 0


def test_a_forked_child_closes_what_it_inherited_and_the_parent_keeps_its_lock(
    wal_file: Path, reader: sqlite3.Connection
) -> None:
    sqlites = descriptors(wal_file)  # the connection's own, inherited by the child as well
    read_header(str(wal_file), 100)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.close(read)
            seen = descriptors(wal_file) - sqlites
            head = read_header(str(wal_file), 100)  # the parent's lock: kept in the child too
            after = descriptors(wal_file) - sqlites
            answer = {"inherited": seen, "read": head is not None, "after": after}
            os.write(write, json.dumps(answer).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        answer = json.loads(pipe.read())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert answer == {"inherited": 0, "read": True, "after": 1}
    assert holder(wal_file) == os.getpid()
    assert descriptors(wal_file) == sqlites + 1


def test_without_ofd_locks_every_file_read_keeps_one_descriptor(
    wal_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(header, "_SETLK", None)
    for _ in range(3):
        assert read_header(str(wal_file), 100) is not None
    assert descriptors(wal_file) == 1
    monkeypatch.undo()
    assert read_header(str(wal_file), 100) is not None
    assert descriptors(wal_file) == 0


def test_a_missing_file_or_a_directory_reads_as_nothing(tmp_path: Path) -> None:
    assert read_header(str(tmp_path / "missing.db"), 100) is None
    assert read_header(str(tmp_path), 100) is None
