"""What an OncewireSaver knows of each thread's chain: the head it verified or wrote last, and the
entries it verified or hashed itself.

The head is where the saver's next fast append continues from (a compare and set in the store:
a head that moved since refuses it, and the general append reads what is stored); it is also how
far a read has to verify (only the entries after it). The entries are kept so that checking a row
against its entry is a comparison with an entry already verified, not a hash computed again: a
row whose entry reads back differently from the one verified is checked from scratch, so an entry
edited in the store is still found (:mod:`oncewire.langgraph.chain`). Bounded: the threads used
last, and the newest entries of each.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping

from oncewire.storage.langgraph import ChainEntry

__all__ = ["EMPTY", "ChainCache"]

EMPTY = (0, "")  # a thread read with no chain at all: its first entry follows the genesis
_THREADS = 1024  # threads whose chain state is kept
_ENTRIES = 256  # entries kept per thread


class _Thread:
    __slots__ = ("entries", "head")

    def __init__(self, head: tuple[int, str]) -> None:
        self.head = head
        self.entries: dict[int, ChainEntry] = {}


class ChainCache:
    """Thread-safe; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: OrderedDict[str, _Thread] = OrderedDict()

    def head(self, thread_id: str) -> tuple[int, str] | None:
        """The head verified or written last (``EMPTY``: read with no chain), or None."""
        with self._lock:
            known = self._threads.get(thread_id)
            return None if known is None else known.head

    def entries(self, thread_id: str) -> Mapping[int, ChainEntry]:
        with self._lock:
            known = self._threads.get(thread_id)
            return {} if known is None else dict(known.entries)

    def _keep(self, thread_id: str, head: tuple[int, str]) -> _Thread:
        known = self._threads.get(thread_id)
        if known is None:
            known = self._threads[thread_id] = _Thread(head)
            while len(self._threads) > _THREADS:
                self._threads.popitem(last=False)
        else:
            self._threads.move_to_end(thread_id)
            known.head = head
        return known

    def _add(self, known: _Thread, entries: Iterable[ChainEntry]) -> None:
        for entry in entries:
            known.entries[entry.seq] = entry
        while len(known.entries) > _ENTRIES:
            del known.entries[min(known.entries)]

    def verified(
        self, thread_id: str, head: tuple[int, str], entries: Iterable[ChainEntry] = ()
    ) -> None:
        """The chain was verified up to ``head`` (``entries``: the ones just verified)."""
        with self._lock:
            self._add(self._keep(thread_id, head), entries)

    def read_empty(self, thread_id: str) -> None:
        """The thread was read with no chain (kept only when nothing is known of it)."""
        with self._lock:
            if thread_id not in self._threads:
                self._keep(thread_id, EMPTY)

    def appended(
        self,
        thread_id: str,
        after: tuple[int, str],
        head: tuple[int, str],
        entries: Iterable[ChainEntry] = (),
    ) -> None:
        """This saver appended from ``after`` to ``head``: known only if ``after`` was."""
        with self._lock:
            known = self._threads.get(thread_id)
            if known is not None and known.head == after:
                self._add(self._keep(thread_id, head), entries)

    def forget(self, thread_id: str) -> None:
        with self._lock:
            self._threads.pop(thread_id, None)
