"""Running code under a given recursion limit, measured from the caller's own stack depth."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def recursion_limit(limit: int) -> Iterator[None]:
    """``sys.setrecursionlimit(limit)`` for the block, the old limit restored after it."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def stack_depth() -> int:
    """How many frames are on the stack below this call."""
    depth, frame = 0, sys._getframe()
    while frame.f_back is not None:
        depth, frame = depth + 1, frame.f_back
    return depth
