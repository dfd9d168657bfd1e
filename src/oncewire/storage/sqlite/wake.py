"""Wake-ups for SQLite: whoever waits on the store learns of a commit within milliseconds.

SQLite has no notifications between connections, but it counts commits: ``PRAGMA
data_version`` on a connection changes whenever another connection, of this process or any
other, has committed to the file since the last time it was asked. It is answered from the WAL
index in shared memory, with no read of the database and no lock, in a few microseconds.

One thread per database file and process asks every :data:`INTERVAL_SECONDS` while someone is
subscribed, on a connection of its own, and calls every subscriber when the count moved; it
ends when the last subscriber leaves. A dispatcher, a tool call waiting for its result and the
reply engine all share that one thread. Its cost is the question itself (~500 a second of a
few microseconds each, ~0.3% of one core) and only while something waits.

A wake-up says "something committed", not what: a subscriber reads the store to find out, as it
would after a poll. Its own commits wake it too; a dispatcher that is busy is looping anyway.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable

INTERVAL_SECONDS = 0.002
# How long a first subscriber waits for a new thread's first look (see Watch.add).
READY_SECONDS = 5.0


class Watch:
    """The watching thread of one file in this process, with its subscribers."""

    def __init__(self, path: str, connect: Callable[[], sqlite3.Connection]) -> None:
        self.path = path
        self._connect = connect
        # Held while subscribers are called, so that none is called once remove() returned.
        self._lock = threading.RLock()
        self._subscribers: dict[int, Callable[[], None]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def add(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` after every commit to the file that lands once this returns; the
        returned function stops it."""
        ready: threading.Event | None = None
        with self._lock:
            token = self._next
            self._next += 1
            self._subscribers[token] = wake
            # A thread told to stop (its last subscriber left) may still be finishing its
            # wait: it ends without looking again, so a new one is started.
            if self._thread is None or not self._thread.is_alive() or self._stop.is_set():
                self._stop, ready = threading.Event(), threading.Event()
                self._thread = threading.Thread(
                    target=self._run,
                    args=(self._stop, ready),
                    name=f"oncewire-wake {os.path.basename(self.path)}",
                    daemon=True,
                )
                self._thread.start()
        if ready is not None:
            # The count the thread compares against is its first answer: a commit made before
            # that answer moves nothing it sees. Waiting for it here means a commit made after
            # this returns always wakes (bounded: a thread that cannot start in time is no
            # worse than before).
            ready.wait(READY_SECONDS)

        def remove() -> None:
            with self._lock:
                self._subscribers.pop(token, None)
                if not self._subscribers:
                    self._stop.set()

        return remove

    def _run(self, stop: threading.Event, ready: threading.Event) -> None:
        conn: sqlite3.Connection | None = None
        last: int | None = None  # the count on ``conn``: each connection counts on its own
        missed = False  # a look failed since the last answer: a commit may have gone unseen
        while not stop.is_set():
            try:
                if conn is None:
                    conn = self._connect()
                    last = None
                version = int(conn.execute("PRAGMA data_version").fetchone()[0])
            except sqlite3.Error:
                # The file is busy being created, or went away: ask again later, and wake
                # everyone at the next answer, so that nobody misses a commit made meanwhile.
                if conn is not None:
                    conn.close()
                    conn = None
                missed = True
                ready.set()
                stop.wait(0.1)
                continue
            ready.set()
            if missed or (last is not None and version != last):
                self._wake_all()
            last, missed = version, False
            stop.wait(INTERVAL_SECONDS)
        if conn is not None:
            conn.close()

    def _wake_all(self) -> None:
        with self._lock:
            for wake in list(self._subscribers.values()):
                wake()


_watches: dict[str, Watch] = {}
_watches_lock = threading.Lock()


def watch(path: str, connect: Callable[[], sqlite3.Connection]) -> Watch:
    """The one :class:`Watch` of ``path`` in this process."""
    key = os.path.realpath(path)
    with _watches_lock:
        found = _watches.get(key)
        if found is None:
            found = _watches[key] = Watch(key, connect)
        return found


def _forget_after_fork() -> None:
    # A child has none of its parent's threads: its first subscriber starts a thread of its own.
    global _watches_lock
    _watches.clear()
    _watches_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
