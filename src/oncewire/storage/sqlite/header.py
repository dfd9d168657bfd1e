"""Reading a SQLite file's first bytes without dropping this process's SQLite locks on it.

SQLite's unix VFS locks bytes of the database file with POSIX record locks: a shared lock while
a connection reads (held as long as a connection in WAL mode stays open), stronger ones to
write. Such a lock belongs to the process and the file's inode, not to a descriptor: closing
*any* descriptor of the file drops every lock the process holds on it, those of each of its
SQLite connections included. SQLite keeps this from happening among its own connections (it
defers such a close while a lock is held); a descriptor opened by Python is outside that. A
process that loses its shared lock on a WAL file lets the next process closing its last
connection take the exclusive lock, checkpoint, and delete the ``-wal`` and ``-shm`` this
process still uses: its later commits go into a deleted WAL and are lost.

So a descriptor of the file is closed here only while this process certainly holds no lock on
it: the fresh descriptor first takes an open-file-description lock for writing over SQLite's
lock bytes (``F_OFD_SETLK``, Linux). It is granted only when nobody holds a lock there, this
process's SQLite connections included (the two kinds of lock conflict even within one process),
and while it is held nobody can take one, so none is lost between the check and the close; a
connection asking meanwhile finds the file busy for those microseconds and retries through its
busy handler. Where it is not granted (or cannot be asked: a descriptor open for reading only,
a system without OFD locks), the descriptor stays open in a registry of one per file, keyed by
(device, inode), and later reads of that file use it (``pread``) instead of opening the file
again. A kept one is asked again on each such read, and all of them whenever another is
kept, and closed once the lock is granted.

A forked child closes what it inherited at once: record locks are not inherited, so the child
holds none yet that a close could drop, and the parent's own belong to the parent.
On Windows a lock belongs to the handle that took it, and closing another one is harmless.
"""

from __future__ import annotations

import os
import stat
import struct
import sys
import threading

__all__ = ["read_header"]

# SQLite's lock bytes (os_unix.c): the pending byte at 1 GiB, the reserved byte, then the 510
# bytes of the shared range. The unix VFS locks nothing else in the database file.
LOCK_START = 0x40000000
LOCK_BYTES = 512

_lock = threading.Lock()
_kept: dict[tuple[int, int], int] = {}  # (device, inode) -> the descriptor kept open for it
_spare: list[int] = []  # kept too: another of a file already kept (renamed while read)
_opening: set[int] = set()  # fresh descriptors not yet closed or kept


def read_header(path: str, size: int) -> bytes | None:
    """The first ``size`` bytes of ``path``, or None when it cannot be read (missing, a
    directory, no access: SQLite reports that in its own words)."""
    if sys.platform == "win32":
        try:
            with open(path, "rb") as file:
                return file.read(size)
        except OSError:
            return None
    with _lock:
        try:
            return _read_locked(path, size)
        except OSError:
            return None


def _read_locked(path: str, size: int) -> bytes | None:
    info = os.stat(path)
    if stat.S_ISDIR(info.st_mode):
        return None
    key = (info.st_dev, info.st_ino)
    kept = _kept.get(key)
    if kept is not None:
        if not _locked_alone(kept):
            return os.pread(kept, size, 0)
        del _kept[key]  # nobody holds a lock on the file any longer
        _opening.add(kept)
        return _read_and_close(kept, size)
    writable = True
    try:
        fd = os.open(path, os.O_RDWR)  # to be allowed the lock for writing: nothing is written
    except OSError:
        writable = False
        fd = os.open(path, os.O_RDONLY)
    _opening.add(fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # no SQLite locks to drop on a device or a pipe
            _close(fd)
            return None
        if writable and _locked_alone(fd):
            return _read_and_close(fd, size)
        head = os.pread(fd, size, 0)
    except BaseException:
        if fd in _opening:  # failed before it could be asked: it may be locked, keep it
            _keep((info.st_dev, info.st_ino), fd)
        raise
    _keep((info.st_dev, info.st_ino), fd)
    return head


def _read_and_close(fd: int, size: int) -> bytes:
    """Read through ``fd``, which holds the lock over SQLite's lock bytes, then close it."""
    try:
        return os.pread(fd, size, 0)
    finally:
        try:
            _unlock(fd)
        finally:
            _close(fd)  # which would release the lock too


def _keep(key: tuple[int, int], fd: int) -> None:
    _opening.discard(fd)
    _release_free()
    if key in _kept:
        _spare.append(fd)
    else:
        _kept[key] = fd


def _release_free() -> None:
    """Close the kept descriptors of files nobody holds a lock on any longer."""
    for key, fd in list(_kept.items()):
        if _locked_alone(fd):
            del _kept[key]
            _unlock(fd)
            os.close(fd)


def _close(fd: int) -> None:
    _opening.discard(fd)
    os.close(fd)


def _flock(kind: int) -> bytes:
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0, as OFD locks require)
    return struct.pack("@hhqqi", kind, os.SEEK_SET, LOCK_START, LOCK_BYTES, 0)


if sys.platform != "win32":
    import fcntl

    _SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)

    def _locked_alone(fd: int) -> bool:
        """Take the lock for writing over SQLite's lock bytes on ``fd``, if nobody holds one
        there (False: somebody does, or this system has no OFD locks to ask with)."""
        if _SETLK is None:
            return False
        try:
            fcntl.fcntl(fd, _SETLK, _flock(fcntl.F_WRLCK))
        except OSError:  # EAGAIN/EACCES: held; EBADF: open for reading only
            return False
        return True

    def _unlock(fd: int) -> None:
        # Explicitly: a child forked meanwhile shares the open file description, and with it
        # the lock, until it closes its copy.
        if _SETLK is not None:
            fcntl.fcntl(fd, _SETLK, _flock(fcntl.F_UNLCK))


def _forget_after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    for fd in [*_kept.values(), *_spare, *_opening]:
        try:
            os.close(fd)
        except OSError:
            pass
    _kept.clear()
    _spare.clear()
    _opening.clear()


if sys.platform != "win32":
    os.register_at_fork(after_in_child=_forget_after_fork)
