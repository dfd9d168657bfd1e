"""The attempt a durable tool is running in: :func:`current_attempt`.

A tool run by :class:`~oncewire.langgraph.DurableToolNode` or inside
:func:`oncewire.agents.run` is one attempt of an effect. Inside it, :func:`current_attempt`
(exported by both packages: one function, so a tool shared by both reads one attempt) returns
that :class:`~oncewire.Attempt`: ``attempt.key`` is stable
for the tool call (the same on every redelivery, in every process), so the tool can hand it on
as the receiver's idempotency key (``Idempotency-Key``, ``Receipts.run_once(attempt.key, ...)``);
``attempt.redelivery`` is True when an earlier attempt may have reached the receiver.

This module needs no optional dependency: a tool module can import it anywhere.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import TypeVar

from oncewire.core.errors import InvalidState, OncewireError
from oncewire.effects.attempt import Attempt

__all__ = ["ToolRefused", "arunning", "current_attempt", "running"]

T = TypeVar("T")

_CURRENT: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar(
    "oncewire_attempt", default=None
)


def current_attempt() -> Attempt:
    """The attempt the calling tool runs in; an :class:`~oncewire.errors.InvalidState` outside
    a durable tool (nothing durable is running, so there is no key)."""
    attempt = _CURRENT.get()
    if attempt is None:
        raise InvalidState(
            "current_attempt() is called outside a durable tool (a DurableToolNode's, or one "
            "of oncewire.agents.run): there is no effect, so there is no key"
        )
    return attempt


async def arunning(attempt: Attempt, fn: Callable[[], Awaitable[T]]) -> T:
    """``await fn()`` with ``attempt`` as the current attempt (in the running task)."""
    token = _CURRENT.set(attempt)
    try:
        return await fn()
    finally:
        _CURRENT.reset(token)


def running(attempt: Attempt, fn: Callable[[], T]) -> T:
    """``fn()`` with ``attempt`` as the current attempt (inside the caller's context)."""
    token = _CURRENT.set(attempt)
    try:
        return fn()
    finally:
        _CURRENT.reset(token)


class ToolRefused(OncewireError):
    """Raised by a durable tool that refuses the call and did nothing: the effect is recorded
    ``rejected`` (never retried) and the model is told "the tool refused the call: <reason>".
    Any other exception means the tool may have acted: the call is retried as a redelivery."""

    code = "tool_refused"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
