"""Recording sink calls as starting before they start, a wave at a time.

A claim alone does not say that its sink was called: a dispatcher claims a batch, and the calls
of that batch start one after another (``concurrency`` at a time). If the process dies halfway,
the claims whose sinks never ran must not count an attempt or flag the next delivery a
redelivery, because nothing reached anybody. So the store records a claim as *starting*
(``started_fence``) before its sink is called, and a release treats only such claims as ones
that may have landed.

Recording each call alone would cost a commit per call. The dispatcher records a *wave* of the
claims it holds in one commit (merged with the settlements and the claim of that store step),
and records the next wave while the current one runs. The wave is as small as it can be while
its commit stays a small share of the sinks' time: ``concurrency`` claims when sinks are slow
compared with a commit, the whole batch when sinks are so fast that anything smaller would
make commits the bottleneck. A crash can then wrongly flag only claims whose sinks would have
started within about ``1 / OVERHEAD`` commits' time, never a whole batch of slow calls.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection

from oncewire.dispatch.runner import Call
from oncewire.storage.records import Claim

__all__ = ["OVERHEAD", "Held", "Waves", "split", "take_wave"]

# The share of a wave's sink time its commit may take. The commit runs on the dispatcher's
# thread while the previous wave's sinks run, so up to this share it delays no sink.
OVERHEAD = 0.5
_ALPHA = 0.2  # weight of the newest measurement in the moving averages


class Waves:
    """How many claims one store step records as starting: measured, not configured."""

    def __init__(self, concurrency: int, batch_size: int) -> None:
        self.concurrency = concurrency
        self.batch_size = batch_size
        self._commit: float | None = None  # seconds per store step that recorded a wave
        self._call: float | None = None  # seconds per sink call

    def commit_took(self, seconds: float) -> None:
        self._commit = _average(self._commit, seconds)

    def call_took(self, seconds: float) -> None:
        self._call = _average(self._call, seconds)

    @property
    def size(self) -> int:
        """``concurrency`` claims until both are measured; then enough calls that their time
        is at least ``commit / OVERHEAD``, within ``[concurrency, batch_size]``."""
        low = min(self.concurrency, self.batch_size)
        if self._commit is None or self._call is None:
            return low
        if self._call <= 0:
            return self.batch_size
        rounds = math.ceil(self._commit / OVERHEAD / self._call)
        return max(low, min(self.batch_size, self.concurrency * rounds))


class Held:
    """The calls claimed but not yet recorded as starting, in claim order: held back from the
    runner until a store step records them, a wave at a time."""

    def __init__(self, concurrency: int, batch_size: int, *, batching: bool) -> None:
        self.calls: deque[Call] = deque()
        self.waves = Waves(concurrency, batch_size)  # how many to record at once
        self._batch_size = batch_size
        self._batching = batching

    def __bool__(self) -> bool:
        return bool(self.calls)

    @property
    def size(self) -> int:
        """The claims the next store step records as starting, held or newly claimed. A batch
        sink is called with the whole batch: its claims all start together."""
        return self._batch_size if self._batching else self.waves.size

    def due(self, waiting: int) -> bool:
        """Few enough recorded calls are ``waiting`` in the runner that the next wave should be
        recorded now, while those run (so the runner seldom waits for a commit)."""
        return bool(self.calls) and waiting < self.waves.size

    def take(self, waiting: int) -> list[Call]:
        """The next wave to record (:attr:`size` claims), if one is due; else nothing."""
        return take_wave(self.calls, self.size) if self.due(waiting) else []

    def put_back(self, wave: list[Call]) -> None:
        """A wave whose store step failed: held again, first in line for the next step."""
        self.calls.extendleft(reversed(wave))

    def hold(self, call: Call) -> None:
        self.calls.append(call)

    def drain(self) -> list[Call]:
        """Every held call, no longer held (the dispatcher stops: none of them will start)."""
        held = list(self.calls)
        self.calls.clear()
        return held


def _average(old: float | None, new: float) -> float:
    new = max(new, 0.0)
    return new if old is None else old + _ALPHA * (new - old)


def take_wave(held: deque[Call], claims: int) -> list[Call]:
    """Take calls from the front of ``held`` until they hold ``claims`` claims (one at least)."""
    wave: list[Call] = []
    count = 0
    while held and (not wave or count < claims):
        call = held.popleft()
        wave.append(call)
        count += len(call.claims)
    return wave


def split(call: Call, started: Collection[int]) -> tuple[Call | None, list[Claim]]:
    """``call`` cut down to its claims recorded as starting (None: none was), and the others."""
    lost = [claim for claim in call.claims if claim.id not in started]
    if not lost:
        return call, []
    if len(lost) == len(call.claims):
        return None, lost
    pairs = [(c, a) for c, a in zip(call.claims, call.attempts, strict=True) if c.id in started]
    kept = Call(call.spec, [c for c, _ in pairs], [a for _, a in pairs], batch=call.batch)
    return kept, lost
