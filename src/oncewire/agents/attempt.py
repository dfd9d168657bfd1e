"""The attempt a durable run's tool is running in: :func:`current_attempt`.

Inside a function tool of :func:`oncewire.agents.run`, ``current_attempt()`` is that call's
:class:`~oncewire.Attempt`: ``attempt.key`` (``agents/{run_key}/{tool_call_id}``) is the same
on every redelivery and in every process, to hand on as the receiver's idempotency key
(``Idempotency-Key``, ``Receipts.run_once(attempt.key, ...)``); ``attempt.redelivery`` is True
when an earlier attempt may have reached the receiver. It is the same attempt LangGraph's
durable tools see (:mod:`oncewire.langgraph.attempt`), so a tool shared by both reads one.

This module needs no optional dependency.
"""

from __future__ import annotations

from oncewire.core.errors import InvalidState
from oncewire.effects.attempt import Attempt
from oncewire.langgraph import attempt as _attempt
from oncewire.langgraph.attempt import ToolRefused

__all__ = ["ToolRefused", "current_attempt"]


def current_attempt() -> Attempt:
    """The attempt the calling tool runs in; an :class:`~oncewire.errors.InvalidState` outside
    a tool of a durable run (nothing durable is running, so there is no key)."""
    try:
        return _attempt.current_attempt()
    except InvalidState:
        raise InvalidState(
            "current_attempt() is called outside a tool of oncewire.agents.run: there is no "
            "effect, so there is no key"
        ) from None
