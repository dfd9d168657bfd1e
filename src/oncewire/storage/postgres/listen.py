"""Wake-ups for PostgreSQL: one LISTEN connection per server URL and process, shared.

Four channels: ``oncewire_effects`` (new effects, a statement trigger on their table),
``oncewire_settled`` (a dispatcher settled attempts: sent by its step's transaction, delivered
at its commit), ``oncewire_inbound`` (the inbox changed, a statement trigger on its table, or
a turn's interrupt was recorded: sent by its transaction) and ``oncewire_replies`` (a reply
became deliverable by anyone: a row trigger on its table). Every subscriber of a channel is
called for each notification; a subscriber that arrives while the connection is (re)connecting
is woken once it listens, so that nothing committed meanwhile is missed. The thread ends when
its last subscriber leaves.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

EFFECTS = "oncewire_effects"
SETTLED = "oncewire_settled"
INBOUND = "oncewire_inbound"
REPLIES = "oncewire_replies"
CHANNELS = (EFFECTS, SETTLED, INBOUND, REPLIES)


class Listener:
    """The listening thread of one URL in this process, with its subscribers per channel."""

    def __init__(self, url: str, connect: Callable[[], Any]) -> None:
        self.url = url
        self._connect = connect
        # Held while subscribers are called, so that none is called once its stopper returned.
        self._lock = threading.RLock()
        self._subscribers: dict[int, tuple[str, Callable[[], None]]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def add(self, channel: str, wake: Callable[[], None]) -> Callable[[], None]:
        if channel not in CHANNELS:
            raise ValueError(f"unknown channel {channel!r}")
        with self._lock:
            token = self._next
            self._next += 1
            self._subscribers[token] = (channel, wake)
            if self._thread is None or not self._thread.is_alive() or self._stop.is_set():
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=self._run, args=(self._stop,), name="oncewire-listen", daemon=True
                )
                self._thread.start()

        def remove() -> None:
            with self._lock:
                self._subscribers.pop(token, None)
                if not self._subscribers:
                    self._stop.set()

        return remove

    def _wake(self, channel: str | None) -> None:
        with self._lock:
            for subscribed, wake in list(self._subscribers.values()):
                if channel is None or subscribed == channel:
                    wake()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                conn = self._connect()
            except Exception:
                stop.wait(1.0)
                continue
            try:
                for channel in CHANNELS:
                    conn.execute(f"LISTEN {channel}")
                self._wake(None)  # anything committed while nobody listened
                while not stop.is_set():
                    for notify in conn.notifies(timeout=0.25, stop_after=1):
                        self._wake(notify.channel)
            except Exception:
                stop.wait(0.5)
            finally:
                try:
                    conn.close()
                except Exception:
                    pass


_listeners: dict[str, Listener] = {}
_listeners_lock = threading.Lock()


def listener(url: str, connect: Callable[[], Any]) -> Listener:
    """The one :class:`Listener` of ``url`` in this process."""
    with _listeners_lock:
        found = _listeners.get(url)
        if found is None:
            found = _listeners[url] = Listener(url, connect)
        return found


def _forget_after_fork() -> None:
    global _listeners_lock
    _listeners.clear()
    _listeners_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
