"""The call a tool runs in: :func:`current_call`, inside a tool decorated with :func:`once`.

A tool of an ``mcp`` SDK server decorated with :func:`oncewire.mcp.once` runs each call once
per key. Inside its body, :func:`current_call` returns that :class:`ToolCall`: the key the call
came with (``params._meta["io.oncewire/idempotency-key"]``, or SEP-3182's ``idempotencyKey``),
the redelivery flag (``params._meta["io.oncewire/redelivery"]``: an earlier attempt of this
call may have run) and the receipt's open transaction, so that the tool's own writes commit
with its receipt or not at all.

Not an :class:`~oncewire.Attempt`: a server does not know the caller's attempt number or
fence, a call may come without a key (it then runs as the SDK runs it), and the body needs the
receipt's transaction, which an attempt does not carry.

This module needs no optional dependency: a tool module can import it anywhere.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oncewire.core.errors import InvalidState

__all__ = ["ToolCall", "current_call"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One ``tools/call`` of a tool decorated with :func:`oncewire.mcp.once`, as its body sees it.

    ``tx`` is the receipt's transaction: an :class:`oncewire.storage.Transaction` in a sync
    tool (``tx.execute(...)``), an :class:`oncewire.aio.ThreadTransaction` in an ``async def``
    tool (``await tx.execute(...)``). It is ``None`` for a call without a key, which runs
    outside any receipt (nothing is deduplicated, nothing is stored).
    """

    tool: str
    arguments: Mapping[str, Any]  # as the request sent them (before the SDK's validation)
    key: str | None  # None: the call came without a key and runs as the SDK runs it
    redelivery: bool  # the caller says an earlier attempt of this call may have run
    tx: Any = None  # the receipt's transaction; None without a key

    @property
    def payload(self) -> dict[str, Any]:
        """What the key is bound to: the tool's name and the arguments, as a receipt stores it."""
        return {"tool": self.tool, "arguments": dict(self.arguments)}


_CURRENT: contextvars.ContextVar[ToolCall | None] = contextvars.ContextVar(
    "oncewire_mcp_call", default=None
)


def current_call() -> ToolCall:
    """The call the calling tool runs in; an :class:`~oncewire.errors.InvalidState` outside the
    body of a tool decorated with :func:`oncewire.mcp.once`."""
    call = _CURRENT.get()
    if call is None:
        raise InvalidState(
            "current_call() is called outside the body of a tool decorated with "
            "oncewire.mcp.once: there is no call, so there is no key"
        )
    return call


def enter(call: ToolCall) -> contextvars.Token[ToolCall | None]:
    """Make ``call`` the current call (in the caller's context); undo with :func:`leave`."""
    return _CURRENT.set(call)


def leave(token: contextvars.Token[ToolCall | None]) -> None:
    _CURRENT.reset(token)
