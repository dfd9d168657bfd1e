"""No fork while this process holds SQLite's write lock.

SQLite keeps the locks a process holds on a file in memory shared by all its connections (the
unix VFS's inode and shared-memory tables). ``os.fork()`` copies that memory: a child forked
while another thread of the parent was inside ``BEGIN IMMEDIATE`` ... ``COMMIT`` inherits a
record saying that one of *its own* connections holds the write lock, a connection the child
never sees again and that never releases it, so every writer of the child waits out its busy
timeout and fails ("database is locked"), however long the parent took to commit.

The gate: a write transaction of oncewire's is entered before its ``BEGIN IMMEDIATE`` and left
after its ``COMMIT`` or ``ROLLBACK``. A fork (``os.register_at_fork``) closes the gate, so no
transaction begins, waits until the ones open have ended, and opens it again on both sides (the
child starting with none open: the parent's threads did not come along). A fork from a thread
that has a transaction open itself, or one that waits longer than :data:`PATIENCE`, goes ahead
without waiting further: the fork is never refused, it is only held back while the lock is held.

The shared transaction of grouped commits (:mod:`.group`, opt-in) is not gated: its leader can
change threads between its ``BEGIN`` and its ``COMMIT``. Do not fork while grouped commits run.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["PATIENCE", "enter", "leave", "open_transactions"]

PATIENCE = 5.0  # seconds a fork waits for the open write transactions to end

_gate = threading.Lock()  # held by a fork in progress: no transaction begins meanwhile
_count = threading.Lock()  # guards _open
_open = 0
_mine = threading.local()


def enter() -> None:
    """Before ``BEGIN IMMEDIATE``: wait while a fork is in progress, then count one open."""
    global _open
    with _gate, _count:
        _open += 1
    _mine.n = getattr(_mine, "n", 0) + 1


def leave() -> None:
    """After ``COMMIT`` or ``ROLLBACK`` (or a ``BEGIN`` that failed)."""
    global _open
    mine = getattr(_mine, "n", 0)
    if mine <= 0:  # entered in the parent, before this (forked) process began
        return
    _mine.n = mine - 1
    with _count:
        _open -= 1


def open_transactions() -> int:
    """How many write transactions of this process are open now."""
    with _count:
        return _open


def _before_fork() -> None:
    _gate.acquire()
    own = getattr(_mine, "n", 0)
    deadline = time.monotonic() + PATIENCE
    while open_transactions() > own and time.monotonic() < deadline:
        time.sleep(0.001)


def _after_in_parent() -> None:
    _gate.release()


def _after_in_child() -> None:
    global _gate, _count, _open, _mine
    _gate, _count, _open, _mine = threading.Lock(), threading.Lock(), 0, threading.local()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_in_parent, after_in_child=_after_in_child
)
