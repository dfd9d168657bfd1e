"""How a dispatcher stops: the grace period, SIGTERM/SIGINT, and what it says on the way out.

``stop()`` (or a first signal) stops claiming and hands back the claims whose sinks were not
called yet; the attempts in flight get at most the grace period. A second signal, or the end
of the grace period, leaves with those attempts still running: their claims are left for
recovery (the next dispatcher sees this owner dead, or its lease expire, and redelivers them
flagged), never recorded as something that did not happen.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from types import FrameType

from oncewire.core.errors import ConfigurationError
from oncewire.dispatch.reporting import shown
from oncewire.dispatch.runner import Call, SinkRunner

__all__ = ["abandon_running", "check_grace", "install_signals", "say_left", "say_stopping"]

log = logging.getLogger("oncewire.dispatch")


def check_grace(seconds: float) -> float:
    if not 0 <= seconds < math.inf:
        raise ConfigurationError("grace_seconds must be finite and not negative")
    return float(seconds)


def say_stopping(grace: float, running: Sequence[str]) -> None:
    """Say that claiming stopped, and which attempts (keys) the grace period waits for."""
    if running:
        log.warning(
            "stopping: claiming no more; waiting up to %gs for %d attempt(s) in flight: %s",
            grace,
            len(running),
            shown(running),
        )
    else:
        log.info("stopping: no attempt in flight")


def abandon_running(runner: SinkRunner, calls: Iterable[Call]) -> list[str]:
    """Stop waiting for ``calls`` (their sinks may still be running); their keys."""
    left: list[str] = []
    for call in list(calls):
        runner.abandon(call)
        left.extend(call.keys)
    return left


def say_left(why: str, left: Sequence[str]) -> None:
    """Say which attempts were still running when the dispatcher left (``why``)."""
    if left:
        log.warning(
            "%s ended with %d attempt(s) still running; leaving their claims to recovery "
            "(the next attempt is a flagged redelivery): %s",
            why,
            len(left),
            shown(left),
        )


def install_signals(
    stopping: threading.Event, stop: Callable[[], None], abort: Callable[[], None]
) -> Callable[[], None] | None:
    """On the main thread: SIGTERM/SIGINT call ``stop``, or ``abort`` once ``stopping`` is set.

    Returns what puts the previous handlers back (None off the main thread: nothing installed).
    """
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: FrameType | None) -> None:
        if stopping.is_set():
            log.warning("signal %d again: leaving now", signum)
            abort()
            return
        log.warning("signal %d: stopping (a second signal leaves at once)", signum)
        stop()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore
