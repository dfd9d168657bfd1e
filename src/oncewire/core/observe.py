"""Named observations of what oncewire did, for whoever listens; nothing happens when nobody does.

oncewire says what it did at a few places (an effect accepted, an attempt settled, a reply's wire
operation, a run command) as an observation: a name and a dict of attributes, handed to each
listener in the thread that did it. :mod:`oncewire.otel` is one listener; a test may be another.

The invariant: an observation never changes what oncewire does or records. A listener that
raises is logged and its observation dropped; the code that emitted it goes on as if nobody
listened. Emitting costs one truthiness test of :data:`LISTENERS` when nobody listens, so the
call sites test it first (``if LISTENERS: emit(...)``) and build no attributes otherwise.

An observation says what was done in the transaction at hand: an accept or a run command made
inside a caller's transaction that then rolls back was still observed (the caller's own
telemetry says whether its transaction committed). An attempt's observation is emitted when its
outcome is known to the dispatcher, before the store has recorded it.

The trace context of an accept (:func:`current_traceparent`) comes from a source installed by
the listener that understands it (W3C ``traceparent`` text, or None); oncewire stores it with the
effect and hands it back with the attempt's observation.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "ACCEPTED",
    "ATTEMPT",
    "CLAIMED",
    "LISTENERS",
    "RELEASED",
    "REPLY_OPERATION",
    "RUN_COMMAND",
    "Listener",
    "current_traceparent",
    "emit",
    "listen",
    "set_traceparent_source",
]

log = logging.getLogger("oncewire.observe")

Listener = Callable[[str, Mapping[str, Any]], None]

# The names emitted, and the attributes each one carries (documented in docs/observability.md).
ACCEPTED = "effect.accepted"  # key, kind, created, traceparent, duration_seconds
ATTEMPT = "effect.attempt"  # key, kind, outcome, state, redelivery, attempt, fence, started, ...
CLAIMED = "dispatch.claimed"  # kinds, count, redeliveries, owner
RELEASED = "dispatch.released"  # count: claims released (dead owners, expired leases, deadlines)
REPLY_OPERATION = "reply.operation"  # kind, outcome, reply_id, slot, duration_seconds
RUN_COMMAND = "run.command"  # workflow, command, result, run_id

# Mutated in place (never rebound), so ``from oncewire.core.observe import LISTENERS`` stays live.
LISTENERS: list[Listener] = []
_lock = threading.Lock()
_traceparent_source: Callable[[], str | None] | None = None
# version-trace_id-parent_id-flags, lower-case hex (W3C Trace Context, level 1).
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def listen(listener: Listener) -> Callable[[], None]:
    """Call ``listener(name, attributes)`` for every observation from now on; returns the
    function that stops it (calling it twice is harmless)."""
    with _lock:
        LISTENERS.append(listener)

    def stop() -> None:
        with _lock:
            if listener in LISTENERS:
                LISTENERS.remove(listener)

    return stop


def emit(name: str, attributes: Mapping[str, Any]) -> None:
    """Hand one observation to every listener; a listener that raises is logged, never raised."""
    for listener in tuple(LISTENERS):
        try:
            listener(name, attributes)
        except Exception:  # an observer must never change what was done
            log.exception("observation listener %r failed on %s", listener, name)


def set_traceparent_source(source: Callable[[], str | None] | None) -> None:
    """Where :func:`current_traceparent` reads the trace context (None: nowhere)."""
    global _traceparent_source
    _traceparent_source = source


def current_traceparent() -> str | None:
    """The W3C traceparent of the span current in this thread, if a source is installed and
    a span is current. A source that raises, or answers anything but a well-formed
    traceparent, is logged and read as None: nothing malformed is stored with an effect."""
    source = _traceparent_source
    if source is None:
        return None
    try:
        value = source()
    except Exception:
        log.exception("traceparent source %r failed", source)
        return None
    if value is None:
        return None
    if not isinstance(value, str) or not _TRACEPARENT.fullmatch(value):
        log.warning("traceparent source %r answered %r, not a traceparent", source, value)
        return None
    return value
