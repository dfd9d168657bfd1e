"""The write barrier: a checkpoint is stored only after its parent's writes have committed.

LangGraph saves a finished task's writes (``put_writes`` on the parent checkpoint) and the
checkpoint that follows the super-step (``put`` of the child) as separate jobs of its executor,
with nothing ordering them: the child can commit first, and a crash then leaves a child whose
parent's writes were never stored. The barrier orders them on the saver's side, whatever the
executor does:

- a ``put`` of a child of P waits until no ``put_writes`` on P is still running in this saver;
- a child made by the loop (``source == "loop"``) also waits until every task the child says
  ran at P has committed writes on P. The child's ``versions_seen`` moved for exactly the nodes
  that ran (LangGraph's ``apply_writes`` records what each task consumed), and LangGraph records
  at least one write for every task that finished (``NO_WRITES`` when it produced nothing), so
  each of those nodes has a ``put_writes`` on P with task path ``~__pregel_pull, <node>``, from
  this run or an earlier one (read from the store once).

A write that does not arrive within ``timeout_seconds`` refuses the put
(:class:`CheckpointOrderRefused`): the checkpoint is not stored, and a resume from P replays the
writes that did commit. Tasks pushed with ``Send`` leave no trace in ``versions_seen``; their
writes are ordered by the first rule only (those that reached the saver).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from oncewire.core.errors import CheckpointOrderRefused

__all__ = ["PULL_PREFIX", "WriteBarrier", "ran_at_parent"]

PULL_PREFIX = "~__pregel_pull, "
_REMEMBERED = 4096  # checkpoints whose versions_seen and finished nodes are kept in memory

Key = tuple[str, str, str]  # thread_id, checkpoint_ns, checkpoint_id
# What the store says of a checkpoint: its versions_seen and the task paths that wrote on it.
Loader = Callable[[Key], tuple[Mapping[str, Any] | None, set[str]]]


def ran_at_parent(parent_seen: Mapping[str, Any] | None, child_seen: Mapping[str, Any]) -> set[str]:
    """The nodes whose ``versions_seen`` moved from the parent to the child: the pull tasks
    that ran at the parent."""
    before = parent_seen or {}
    return {
        node
        for node, seen in child_seen.items()
        # LangGraph's own bookkeeping (__input__, __interrupt__) is not a task; __start__ is.
        if (node == "__start__" or not node.startswith("__")) and before.get(node) != seen
    }


class _Known:
    __slots__ = ("done", "loaded", "seen")

    def __init__(self) -> None:
        self.seen: Mapping[str, Any] | None = None
        self.done: set[str] = set()  # task paths whose writes on this checkpoint committed
        self.loaded = False


class WriteBarrier:
    """See the module docstring. One per saver; thread-safe."""

    def __init__(self, load: Loader, *, timeout_seconds: float) -> None:
        self._load = load
        self.timeout_seconds = timeout_seconds
        self._cond = threading.Condition()
        self._running: dict[Key, int] = {}
        self._known: OrderedDict[Key, _Known] = OrderedDict()

    def _entry(self, key: Key) -> _Known:
        known = self._known.get(key)
        if known is None:
            known = self._known[key] = _Known()
            while len(self._known) > _REMEMBERED:
                self._known.popitem(last=False)
        else:
            self._known.move_to_end(key)
        return known

    @contextmanager
    def writing(self, key: Key, task_path: str) -> Iterator[None]:
        """Around a ``put_writes`` on checkpoint ``key``: a child's put waits for it."""
        with self._cond:
            self._running[key] = self._running.get(key, 0) + 1
        ok = False
        try:
            yield
            ok = True
        finally:
            with self._cond:
                left = self._running[key] - 1
                if left:
                    self._running[key] = left
                else:
                    del self._running[key]
                if ok:
                    self._entry(key).done.add(task_path)
                self._cond.notify_all()

    def stored(self, key: Key, versions_seen: Mapping[str, Any]) -> None:
        """Checkpoint ``key`` was stored: remember what its tasks will have to write."""
        with self._cond:
            self._entry(key).seen = versions_seen

    def before_put(self, parent: Key, child_seen: Mapping[str, Any], *, from_loop: bool) -> None:
        """Wait until the put of a child of ``parent`` may commit (see the module docstring)."""
        deadline = time.monotonic() + self.timeout_seconds
        with self._cond:
            known = self._known.get(parent)
            needs_load = from_loop and (known is None or known.seen is None)
        if needs_load:
            self._refresh(parent)
        with self._cond:
            while True:
                known = self._entry(parent)
                missing = (
                    self._missing(known, ran_at_parent(known.seen, child_seen))
                    if from_loop
                    else set()
                )
                if not self._running.get(parent) and not missing:
                    return
                if missing and not known.loaded and not self._running.get(parent):
                    # Read what earlier runs stored only once this saver's own writes on the
                    # parent are done (they are what the put most often waits for).
                    self._cond.release()
                    try:
                        self._refresh(parent)
                    finally:
                        self._cond.acquire()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CheckpointOrderRefused(
                        f"the writes of {sorted(missing) or 'a task'} on checkpoint "
                        f"{parent[2]} did not commit within {self.timeout_seconds:g} s: the "
                        "checkpoint that follows it was not stored",
                        thread_id=parent[0],
                        checkpoint_ns=parent[1],
                        checkpoint_id=parent[2],
                        missing=sorted(missing),
                    )
                self._cond.wait(left)

    def _refresh(self, key: Key) -> None:
        seen, paths = self._load(key)
        with self._cond:
            known = self._entry(key)
            if known.seen is None:
                known.seen = seen
            known.done |= paths
            known.loaded = True

    @staticmethod
    def _missing(known: _Known, ran: set[str]) -> set[str]:
        if not ran:
            return set()
        done = {p[len(PULL_PREFIX) :] for p in known.done if p.startswith(PULL_PREFIX)}
        missing = ran - done
        # Writes saved without a task path (a caller of put_writes other than LangGraph's loop)
        # are counted, not named.
        anonymous = sum(1 for p in known.done if not p)
        return missing if len(missing) > anonymous else set()

    def forget(self, key: Key) -> None:
        """A child of ``key`` was stored: its writes are no longer waited for."""
        with self._cond:
            known = self._known.get(key)
            if known is not None:
                known.done = set()
                known.loaded = False
