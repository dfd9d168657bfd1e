"""Opening a store rides out a transient failure: a dispatcher must start during an outage.

A worker that starts while the database restarts, while its connection is terminated, or while
another writer holds the SQLite file's lock, waits and tries again (with backoff, logging each
failure) for up to ``open_timeout_seconds`` instead of exiting. A permanent failure (a file that
is not a database, read-only, corrupt; a schema that is foreign or too new) is raised at once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TypeVar

from oncewire.core.errors import ConfigurationError, StorageError

__all__ = ["DEFAULT_OPEN_TIMEOUT_SECONDS", "check_open_timeout", "open_with_retries"]

DEFAULT_OPEN_TIMEOUT_SECONDS = 30.0

log = logging.getLogger("oncewire.storage")

T = TypeVar("T")

_FIRST_DELAY_SECONDS = 0.05
_MAX_DELAY_SECONDS = 2.0


def check_open_timeout(seconds: float) -> float:
    if not isinstance(seconds, int | float) or not 0 <= seconds < math.inf:
        raise ConfigurationError("open_timeout_seconds must be a finite number >= 0")
    return float(seconds)


def open_with_retries(
    attempt: Callable[[], T],
    *,
    what: str,
    timeout_seconds: float,
    cleanup: Callable[[], None] = lambda: None,
) -> T:
    """``attempt()`` until it succeeds, a permanent error, or ``timeout_seconds`` have passed.

    ``cleanup`` runs after each failed attempt (close what the attempt opened).
    """
    deadline = time.monotonic() + timeout_seconds
    delay = _FIRST_DELAY_SECONDS
    failures = 0
    while True:
        try:
            return attempt()
        except StorageError as exc:
            cleanup()
            failures += 1
            left = deadline - time.monotonic()
            if not exc.transient or left <= 0:
                if failures > 1:
                    log.error("%s: giving up after %d attempts: %s", what, failures, exc)
                raise
            pause = min(delay, left)
            log.warning(
                "%s failed (%s: %s); trying again in %.2f s (%.1f s left)",
                what,
                exc.code,
                exc,
                pause,
                left,
            )
            time.sleep(pause)
            delay = min(delay * 2, _MAX_DELAY_SECONDS)
        except BaseException:
            cleanup()
            raise
