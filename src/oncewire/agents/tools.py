"""The function tool calls of a durable run: each an effect, performed once.

In a durable run (:mod:`oncewire.agents.scope`) the SDK's invocation of a function tool is
replaced by :func:`call_tool`: the call is the effect ``agents/{run_key}/{tool_call_id}`` of
kind ``agents.tool`` (payload: the tool's name and its arguments object), usually accepted
already in the transaction that recorded the model response asking for it. When the effect has
ended (a resumed run), its answer is given to the SDK and the tool does not run. Else the call's
context (the tool, the SDK's tool context, the run's event loop and context variables) is held
in this process and the run's inline dispatcher
(:class:`~oncewire.dispatch.inline.InlineDispatch`, the same claim, fence, settle and recovery
machinery as ``oncewire dispatch`` workers) performs it: the sink runs the tool's own invoker
on the run's loop, inside the
attempt (:func:`oncewire.agents.current_attempt`) and inside a scope of its own, so a run
inside the tool is durable too. What the tool does decides the outcome:

* it returns: ``Done`` with its answer (:func:`oncewire.agents.responses.encode_output`);
* it raises :class:`~oncewire.agents.ToolRefused`, or the SDK refuses its arguments before its
  body runs (``ModelBehaviorError``): ``Rejected``, never retried;
* it raises anything else: the attempt is ``uncertain`` (the tool may have acted) and is
  retried as a flagged redelivery, up to ``max_attempts``. The SDK's own
  ``failure_error_function`` is not applied: what the model is told of a tool that kept
  failing is what the store knows (:func:`oncewire.toolcalls.effect_content`, "outcome
  unknown" when the tool may have run).

The run waits for the effect to end (:func:`oncewire.toolcalls.settled`), then gives the SDK the
stored answer, or what :mod:`oncewire.toolcalls` tells a model of an effect that did not end
``done``. Hosted tools (web search, file search, code interpreter, ...) run at the provider and
are not touched; nor are handoffs, which are not tools that act.

An attempt whose call is not held in this process (the run that asked for it is elsewhere, or
not running) waits a moment for it, then is ``NotSent`` (it did not run, not a redelivery) and
tried again later, until the run that needs it is there to hold it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from oncewire import toolcalls
from oncewire.core import crash
from oncewire.core.extras import refusal
from oncewire.dispatch.attempt import ToolRefused, arunning
from oncewire.dispatch.inline import InlineDispatch
from oncewire.effects.attempt import Attempt
from oncewire.effects.outcomes import NotSent, Rejected
from oncewire.ledger import Ledger
from oncewire.storage.records import TERMINAL_STATES, Effect, EffectState

try:
    from agents.exceptions import ModelBehaviorError
    from agents.tool import FunctionTool
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("agents", "oncewire.agents", exc) from exc

from oncewire.agents import responses
from oncewire.agents.scope import KIND, Scope, call_key, enter, leave

__all__ = [
    "TOOL_ACCEPTED",
    "TOOL_PERFORMING",
    "TOOL_RETURNED",
    "TOOL_SETTLED",
    "call_tool",
    "inline_for",
]

TOOL_ACCEPTED = crash.register(
    "agents.tool_accepted",
    "a function tool call's effect is accepted and committed and its call held; the tool has "
    "not run",
)
TOOL_PERFORMING = crash.register(
    "agents.tool_performing",
    "a function tool call is claimed and recorded as starting; its tool is about to run",
)
TOOL_RETURNED = crash.register(
    "agents.tool_returned",
    "a function tool returned inside its attempt (the world may have changed); its outcome is "
    "not recorded",
)
TOOL_SETTLED = crash.register(
    "agents.tool_settled",
    "a function tool call's effect has ended; the SDK has not been given its answer",
)

# How long an attempt waits for its call to be held in this process before it is NotSent.
CONTEXT_WAIT_SECONDS = 2.0
# When an attempt whose call is held nowhere here is tried again.
CONTEXT_ELSEWHERE_RETRY_SECONDS = 1.0


@dataclass
class HeldCall:
    """What the run knows of one call it waits for: the tool and how to run it."""

    tool: FunctionTool
    invoke: Callable[[], Awaitable[Any]]
    loop: asyncio.AbstractEventLoop
    context: contextvars.Context
    scope: Scope


class _Calls:
    """The calls the durable runs of this process wait for, by effect key."""

    def __init__(self) -> None:
        self._forked()
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self._changed = threading.Condition()
        self._by_key: dict[str, HeldCall] = {}

    def hold(self, key: str, held: HeldCall) -> None:
        with self._changed:
            self._by_key[key] = held
            self._changed.notify_all()

    def release(self, key: str, held: HeldCall) -> None:
        with self._changed:
            if self._by_key.get(key) is held:
                del self._by_key[key]

    def wait(self, key: str, seconds: float) -> HeldCall | None:
        with self._changed:
            self._changed.wait_for(lambda: key in self._by_key, timeout=seconds)
            return self._by_key.get(key)


CALLS = _Calls()


def _inner_invoker(tool: FunctionTool) -> Callable[[Any, str], Awaitable[Any]]:
    """The tool's invoker without the SDK's failure handler (which would turn an exception,
    after which the tool may have acted, into an answer): a tool that raises is retried."""
    invoker = tool.on_invoke_tool
    return getattr(invoker, "_invoke_tool_impl", invoker)


def _submit(held: HeldCall, attempt: Attempt) -> concurrent.futures.Future[Any]:
    """Run the held call on its run's loop, in the run's context variables, as ``attempt``
    and inside a scope of its own."""
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()
    nested = held.scope.inside(attempt.key)

    async def perform() -> Any:
        token = enter(nested)
        try:
            return await arunning(attempt, held.invoke)
        finally:
            leave(token)

    def start() -> None:
        if not done.set_running_or_notify_cancel():
            return
        task = held.loop.create_task(perform(), context=held.context.copy())

        def finished(task: asyncio.Task[Any]) -> None:
            if task.cancelled():
                done.set_exception(asyncio.CancelledError())
            elif task.exception() is not None:
                done.set_exception(task.exception())
            else:
                done.set_result(task.result())

        task.add_done_callback(finished)

    held.loop.call_soon_threadsafe(start)
    return done


def _sink(attempt: Attempt) -> Any:
    """The sink of kind ``agents.tool`` (see the module docstring)."""
    held = CALLS.wait(attempt.key, CONTEXT_WAIT_SECONDS)
    if held is None or held.loop.is_closed():
        return NotSent(
            "the durable run that asked for this tool call is not running in this process",
            retry_after=CONTEXT_ELSEWHERE_RETRY_SECONDS,
        )
    TOOL_PERFORMING.hit()
    try:
        value = _submit(held, attempt).result()
    except ToolRefused as exc:
        return Rejected(exc.reason)
    except ModelBehaviorError as exc:
        return Rejected(f"the tool's arguments were refused: {exc}")
    TOOL_RETURNED.hit()
    return responses.encode_output(held.tool, value)


SINKS = {KIND: _sink}

_INLINE: dict[int, InlineDispatch] = {}
_INLINE_LOCK = threading.Lock()


def inline_for(scope: Scope) -> InlineDispatch:
    """The inline dispatcher of this process for the scope's ledger (one per ledger, kept)."""
    ledger = scope.ledger
    with _INLINE_LOCK:
        inline = _INLINE.get(id(ledger))
        if inline is None or inline.ledger is not ledger:
            inline = _INLINE[id(ledger)] = InlineDispatch(
                ledger,
                SINKS,
                name="agents",
                concurrency=scope.concurrency,
                lease_seconds=scope.lease_seconds,
                retry=scope.retry,
            )
        return inline


def _answer(effect: Effect | None, problem: str | None) -> Any:
    """What the SDK is given for a call once its effect ended (or that got none)."""
    if effect is None:
        return toolcalls.tool_content("failed", {"error": problem})
    if effect.state is EffectState.DONE and effect.result_json is not None:
        import json

        ours, value = responses.decode_output(json.loads(effect.result_json))
        if ours:
            return value
    return toolcalls.effect_content(effect)


def _find_or_accept(scope: Scope, key: str, name: str, arguments: dict[str, Any]) -> Effect:
    ledger: Ledger = scope.ledger
    effect = ledger.store.get_effect(key)
    if effect is not None:
        return effect
    with ledger.transaction() as tx:
        return tx.accept(
            key, KIND, {"tool": name, "arguments": arguments}, max_attempts=scope.max_attempts
        )


async def call_tool(scope: Scope, tool: FunctionTool, context: Any, arguments: str) -> Any:
    """The SDK's invocation of ``tool`` in ``scope`` (see the module docstring)."""
    call_id = str(getattr(context, "tool_call_id", "") or "")
    parsed, problem = toolcalls.parse_arguments(arguments)
    if not call_id:
        problem = "the tool call has no id"
    if problem is not None:
        return _answer(None, problem)
    key = call_key(scope.key, call_id)
    effect = await asyncio.to_thread(_find_or_accept, scope, key, tool.name, parsed)
    if effect.state not in TERMINAL_STATES:
        invoker = _inner_invoker(tool)
        held = HeldCall(
            tool=tool,
            invoke=lambda: invoker(context, arguments),
            loop=asyncio.get_running_loop(),
            context=contextvars.copy_context(),
            scope=scope,
        )
        CALLS.hold(key, held)
        try:
            TOOL_ACCEPTED.hit()
            inline = inline_for(scope)
            inline.enter()
            try:
                accepted = toolcalls.AcceptedCall(call_id, key, effect)
                (ended,) = await asyncio.to_thread(
                    toolcalls.settled,
                    scope.ledger,
                    [accepted],
                    wait_seconds=scope.wait_seconds,
                    subscribe=inline.subscribe,
                )
            finally:
                inline.leave()
        finally:
            CALLS.release(key, held)
        TOOL_SETTLED.hit()
        return _answer(ended, None)
    return _answer(effect, None)
