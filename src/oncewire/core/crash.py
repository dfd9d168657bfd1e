"""Named crash points.

Production code names the instants where a crash matters::

    AFTER_CLAIM = register("dispatch.after_claim", "the claim is committed; no sink was called")
    ...
    AFTER_CLAIM.hit()

A point is a no-op unless the process was started with it armed::

    ONCEWIRE_CRASH=dispatch.after_claim            # die at the first hit
    ONCEWIRE_CRASH=dispatch.after_claim@3          # die at the third hit in this process
    ONCEWIRE_CRASH_TOKEN=/tmp/x                    # fire at most once across processes

When armed and reached, the process sends itself SIGKILL: no ``finally`` blocks, no atexit
handlers, no flush. The token file is created atomically before the kill, so a point armed in
the environment of a parent and inherited by children fires once in the whole process tree.
Because points are registered, the crash lab enumerates them and a new point joins its matrix
without new test code.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from oncewire.core.errors import CrashPointUnknown

__all__ = ["CrashPoint", "armed", "rearm", "register", "registry"]

ENV_POINTS = "ONCEWIRE_CRASH"
ENV_TOKEN = "ONCEWIRE_CRASH_TOKEN"

_REGISTRY: dict[str, CrashPoint] = {}


@dataclass(eq=False)
class CrashPoint:
    name: str
    description: str
    hits: int = 0
    _fire_at: int | None = None

    def hit(self) -> None:
        """Die here if this point is armed for this hit."""
        if self._fire_at is None:
            return
        self.hits += 1
        if self.hits != self._fire_at:
            return
        token = os.environ.get(ENV_TOKEN)
        if token:
            try:
                fd = os.open(token, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return  # already fired somewhere in this process tree
            os.write(fd, f"{self.name} {os.getpid()}\n".encode())
            os.fsync(fd)
            os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


def _parse(spec: str) -> dict[str, int]:
    """``a,b@3`` -> {a: 1, b: 3}. A malformed hit count arms under the whole item's text, which
    no code registers, so :func:`check_armed` names it instead of this module failing at import.
    """
    armed_points: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, count = item.partition("@")
        if not count:
            armed_points[name] = 1
        elif count.isdigit() and int(count) >= 1:
            armed_points[name] = int(count)
        else:
            armed_points[item] = 1
    return armed_points


def armed() -> dict[str, int]:
    """The points armed in this process's environment, with the hit number that fires each."""
    return _parse(os.environ.get(ENV_POINTS, ""))


def register(name: str, description: str) -> CrashPoint:
    """Declare a crash point. Registering the same name twice returns the same point."""
    point = _REGISTRY.get(name)
    if point is None:
        point = CrashPoint(name, description)
        point._fire_at = armed().get(name)
        _REGISTRY[name] = point
    return point


def registry() -> dict[str, CrashPoint]:
    """Every registered point, by name (import the modules that declare them first)."""
    return dict(sorted(_REGISTRY.items()))


def rearm() -> None:
    """Arm every registered point from the environment again, its hits counted from zero: for
    a process forked from a warm parent (one that imported everything once) and then given
    its own ``ONCEWIRE_CRASH``, which the points registered in the parent never read."""
    wanted = armed()
    for name, point in _REGISTRY.items():
        point.hits = 0
        point._fire_at = wanted.get(name)


def check_armed() -> None:
    """Refuse an armed name that nothing registers (a typo would otherwise arm nothing)."""
    unknown = sorted(set(armed()) - set(_REGISTRY))
    if unknown:
        raise CrashPointUnknown(f"armed crash point(s) not registered: {', '.join(unknown)}")
