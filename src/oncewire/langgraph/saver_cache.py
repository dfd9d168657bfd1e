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
from types import MappingProxyType

from oncewire.storage.langgraph import ChainEntry

__all__ = ["EMPTY", "ChainCache"]

EMPTY = (0, "")  # a thread read with no chain at all: its first entry follows the genesis
_THREADS = 1024  # threads whose chain state is kept
_ENTRIES = 256  # entries kept per thread
_NONE: Mapping[int, ChainEntry] = MappingProxyType({})


class _Thread:
    __slots__ = ("entries", "head", "tip")

    def __init__(self, head: tuple[int, str] | None, tip: tuple[int, str]) -> None:
        self.head = head  # verified up to here (None: nothing verified)
        self.tip = tip  # the newest head read or written: where an append continues
        self.entries: dict[int, ChainEntry] = {}


class ChainCache:
    """Thread-safe; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: OrderedDict[str, _Thread] = OrderedDict()

    def head(self, thread_id: str) -> tuple[int, str] | None:
        """How far the chain is verified (entries read and checked, or hashed here after
        verified ones), or None."""
        with self._lock:
            known = self._threads.get(thread_id)
            return None if known is None else known.head

    def tip(self, thread_id: str) -> tuple[int, str] | None:
        """The newest head read or written (``EMPTY``: read with no chain), or None: where this
        saver's next append expects the head to be (a guess the store checks)."""
        with self._lock:
            known = self._threads.get(thread_id)
            return None if known is None else known.tip

    def entries(self, thread_id: str) -> Mapping[int, ChainEntry]:
        """The entries kept (the cache's own mapping: read it, never change it)."""
        with self._lock:
            known = self._threads.get(thread_id)
            return _NONE if known is None else known.entries

    def remember(self, thread_id: str, entries: Iterable[ChainEntry]) -> None:
        """Entries checked from scratch against their own hash (a row's entry, read)."""
        with self._lock:
            known = self._threads.get(thread_id)
            if known is not None:
                self._add(known, entries)

    def _keep(self, thread_id: str, tip: tuple[int, str]) -> _Thread:
        known = self._threads.get(thread_id)
        if known is None:
            known = self._threads[thread_id] = _Thread(None, tip)
            while len(self._threads) > _THREADS:
                self._threads.popitem(last=False)
        else:
            self._threads.move_to_end(thread_id)
            if tip[0] >= known.tip[0]:
                known.tip = tip
        return known

    def _add(self, known: _Thread, entries: Iterable[ChainEntry]) -> None:
        kept = dict(known.entries)  # a new mapping: a reader may hold the old one
        for entry in entries:
            kept[entry.seq] = entry
        while len(kept) > _ENTRIES:
            del kept[min(kept)]
        known.entries = kept

    def verified(
        self, thread_id: str, head: tuple[int, str], entries: Iterable[ChainEntry] = ()
    ) -> None:
        """The chain was verified up to ``head`` (``entries``: the ones just verified)."""
        with self._lock:
            known = self._keep(thread_id, head)
            known.head = head
            self._add(known, entries)

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
        """This saver appended from ``after`` to ``head``: the new tip, and verified as far as
        ``after`` was (``EMPTY``: the genesis, nothing to verify before it)."""
        with self._lock:
            known = self._keep(thread_id, head)
            if known.head == after or after == EMPTY:
                known.head = head
                self._add(known, entries)

    def forget(self, thread_id: str) -> None:
        with self._lock:
            self._threads.pop(thread_id, None)
