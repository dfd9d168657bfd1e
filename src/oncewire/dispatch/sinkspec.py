"""What a dispatcher knows about each of its sinks, checked once when it is built (and its
ledger, checked first: :func:`check_ledger`).

A sink is a callable taking an :class:`~oncewire.Attempt`, or an object with
``call_batch(attempts)`` (a list of outcomes, one per attempt, in order), or both. Either may be
``async def``: the dispatcher awaits it on its own event loop. A sink may also have
``cancel(attempt)``, which the dispatcher calls when that attempt times out (``SubprocessSink``
kills its child there).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from oncewire.core.errors import ConfigurationError, WrongType
from oncewire.core.limits import check_seconds
from oncewire.ledger import Ledger

__all__ = ["SinkSpec", "check_ledger", "inspect_sinks"]


@dataclass(frozen=True, slots=True)
class SinkSpec:
    kind: str
    sink: Any
    call: Callable[..., Any] | None  # one attempt (None: the sink only has call_batch)
    call_is_async: bool
    batch: Callable[..., Any] | None  # call_batch, when the sink has one
    batch_is_async: bool
    cancel: Callable[..., Any] | None  # cancel(attempt), called when an attempt times out
    timeout_seconds: float | None  # None: attempts of this kind may take as long as they take


def check_ledger(ledger: object) -> None:
    """A dispatcher's ledger must be a :class:`Ledger`: a path or URL is refused before any
    store is opened, saying what to write instead."""
    if isinstance(ledger, Ledger):
        return
    if isinstance(ledger, str):
        hint = f"Dispatcher(oncewire.Ledger({ledger!r}), sinks)"
    elif hasattr(type(ledger), "sync"):  # an AsyncLedger (a layer beside this one)
        hint = "Dispatcher(async_ledger.sync, sinks), the Ledger it runs, once it is open"
    else:
        hint = 'Dispatcher(oncewire.Ledger("app.db"), sinks)'
    given = type(ledger).__name__
    raise WrongType(f"Dispatcher takes a Ledger, not a {given}: {hint}", given=given)


def _is_async(function: Any) -> bool:
    if inspect.iscoroutinefunction(function):
        return True
    # A callable object whose __call__ is async def.
    call = getattr(type(function), "__call__", None)  # noqa: B004
    return call is not None and inspect.iscoroutinefunction(call)


def _is_generator(function: Any) -> bool:
    candidates = [function, getattr(type(function), "__call__", None)]  # noqa: B004
    return any(
        inspect.isgeneratorfunction(f) or inspect.isasyncgenfunction(f)
        for f in candidates
        if f is not None
    )


def _timeout(value: Any, what: str) -> float | None:
    return None if value is None else check_seconds(what, value, positive=True)


def inspect_sinks(
    sinks: Mapping[str, Any],
    *,
    attempt_timeout: float | None = None,
    attempt_timeouts: Mapping[str, float | None] | None = None,
) -> dict[str, SinkSpec]:
    """Check every sink and describe it; ``ConfigurationError`` names the first wrong one."""
    if not isinstance(sinks, Mapping) or not sinks:
        raise ConfigurationError("a dispatcher needs at least one sink (a mapping kind -> sink)")
    default = _timeout(attempt_timeout, "attempt_timeout")
    per_kind = dict(attempt_timeouts or {})
    unknown = sorted(set(per_kind) - set(sinks))
    if unknown:
        raise ConfigurationError(
            f"attempt_timeouts names kinds without a sink: {', '.join(map(repr, unknown))}"
        )
    specs: dict[str, SinkSpec] = {}
    for kind, sink in sinks.items():
        if not isinstance(kind, str) or not kind:
            raise ConfigurationError(f"sink kind {kind!r} must be a non-empty string")
        batch = getattr(sink, "call_batch", None)
        if batch is not None and not callable(batch):
            raise ConfigurationError(f"the sink for {kind!r} has a call_batch that is not callable")
        if not callable(sink) and batch is None:
            raise ConfigurationError(
                f"the sink for {kind!r} is a {type(sink).__name__}: a sink must be callable "
                "(one attempt) or have call_batch(attempts)"
            )
        if (callable(sink) and _is_generator(sink)) or (batch is not None and _is_generator(batch)):
            raise ConfigurationError(
                f"the sink for {kind!r} is a generator function: a sink returns an outcome "
                "(return, not yield)"
            )
        cancel = getattr(sink, "cancel", None)
        if kind in per_kind:
            timeout = _timeout(per_kind[kind], f"attempt_timeouts[{kind!r}]")
        else:
            timeout = default
        specs[kind] = SinkSpec(
            kind=kind,
            sink=sink,
            call=sink if callable(sink) else None,
            call_is_async=callable(sink) and _is_async(sink),
            batch=batch,
            batch_is_async=batch is not None and _is_async(batch),
            cancel=cancel if callable(cancel) else None,
            timeout_seconds=timeout,
        )
    return specs
