"""The function tool calls of a durable run: each an effect, performed once.

In a durable run (:mod:`oncewire.agents.scope`) the SDK's invocation of a function tool is
replaced by :func:`call_tool`: the call is the effect ``agents/{run_key}/{tool_call_id}`` of
kind ``agents.tool`` (payload: the tool's name and its arguments object), usually accepted
already in the transaction that recorded the model response asking for it. When the effect has
ended (a resumed run), its answer is given to the SDK and the tool does not run. Else the call's
context (the tool, the SDK's tool context, the run's event loop and context variables) is held
in this process and an inline dispatcher (:class:`~oncewire.dispatch.inline.InlineDispatch`,
the same claim, fence, settle and recovery machinery as ``oncewire dispatch`` workers)
performs it: the sink runs the tool's own invoker on the run's loop, inside the attempt
(:func:`oncewire.agents.current_attempt`) and inside a scope of its own, so a run inside the
tool is durable too. What the tool does decides the outcome:

* it returns: ``Done`` with its answer (:func:`oncewire.agents.responses.encode_output`);
* it raises :class:`~oncewire.agents.ToolRefused`, or the SDK refuses its arguments before its
  body runs (``ModelBehaviorError``): ``Rejected``, never retried;
* it raises anything else: the attempt is ``uncertain`` (the tool may have acted) and is
  retried as a flagged redelivery, up to ``max_attempts``. The SDK's own
  ``failure_error_function`` is not applied: what the model is told of a tool that kept
  failing is what the store knows (:func:`oncewire.toolcalls.effect_content`, "outcome
  unknown" when the tool may have run).

The run waits for the effect to end (on its own loop, so that cancelling the run ends the wait),
then gives the SDK the stored answer, or what :mod:`oncewire.toolcalls` tells a model of an
effect that did not end ``done``. The SDK's local shell and apply-patch tools are performed the
same way (:func:`perform`, :mod:`oncewire.agents.local`). Hosted tools (web search, file search,
code interpreter, ...) run at the provider and are not touched; nor are handoffs, which are not
tools that act.

Which dispatcher performs a call (:func:`inline_for`): one per ledger, run settings
(``concurrency``, ``retry``, ``lease_seconds``) and depth, the depth being how many tool calls'
performing the run is inside. A tool running a run of its own (an agent used as a tool) holds a
slot of its depth's dispatcher while that run's tool calls are performed by the next depth's,
so a nested call never waits for a slot its parent holds, however deep or wide the nesting.
Each dispatcher claims only the calls held for it in this process (:data:`CALLS`), which are
all it can perform: a call whose run is not running here (crashed, abandoned, or running in
another process on the same store) stays as it is, uncharged, for its own run to perform when
it resumes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import json
import os
import threading
from collections.abc import Awaitable, Callable, Hashable
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
    "perform",
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

# When an attempt claimed after its run stopped holding the call (a cancelled run) is tried
# again: not before a run holds it again, since only a held call is claimed.
CONTEXT_ELSEWHERE_RETRY_SECONDS = 1.0
# The longest a run waits for its call's effect without looking at the store.
WAIT_POLL_SECONDS = 0.1
# How often a dispatcher's thread waiting for a tool on its run's loop checks the loop is there.
LOOP_CHECK_SECONDS = 1.0

Setting = tuple[Hashable, ...]  # which inline dispatcher performs a call (see inline_for)


@dataclass
class HeldCall:
    """What the run knows of one call it waits for: how to run the tool and store its answer,
    and which dispatcher of this process performs it."""

    invoke: Callable[[], Awaitable[Any]]
    encode: Callable[[Any], Any]  # the tool's answer as the effect's result
    loop: asyncio.AbstractEventLoop
    context: contextvars.Context
    scope: Scope
    setting: Setting


class _Calls:
    """The calls the durable runs of this process wait for, by effect key and by dispatcher."""

    def __init__(self) -> None:
        self._forked()
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, HeldCall] = {}
        self._by_setting: dict[Setting, set[str]] = {}

    def hold(self, key: str, held: HeldCall) -> None:
        with self._lock:
            before = self._by_key.get(key)
            if before is not None:
                self._by_setting.get(before.setting, set()).discard(key)
            self._by_key[key] = held
            self._by_setting.setdefault(held.setting, set()).add(key)

    def release(self, key: str, held: HeldCall) -> None:
        with self._lock:
            if self._by_key.get(key) is held:
                del self._by_key[key]
                self._by_setting.get(held.setting, set()).discard(key)

    def get(self, key: str) -> HeldCall | None:
        with self._lock:
            return self._by_key.get(key)

    def keys(self, setting: Setting) -> set[str]:
        """The keys held for the dispatcher of ``setting``: all it may claim."""
        with self._lock:
            return set(self._by_setting.get(setting, ()))


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


def _result(done: concurrent.futures.Future[Any], loop: asyncio.AbstractEventLoop) -> Any:
    """The tool's answer once it ran on ``loop``; an error if the loop closed under it (the
    run was torn down: the tool may have acted)."""
    while not concurrent.futures.wait([done], timeout=LOOP_CHECK_SECONDS).done:
        if loop.is_closed():
            raise RuntimeError("the durable run's event loop closed while its tool ran")
    return done.result()


def _sink(attempt: Attempt) -> Any:
    """The sink of kind ``agents.tool`` (see the module docstring)."""
    held = CALLS.get(attempt.key)
    if held is None or held.loop.is_closed():
        return NotSent(
            "the durable run that asked for this tool call no longer waits for it here",
            retry_after=CONTEXT_ELSEWHERE_RETRY_SECONDS,
        )
    TOOL_PERFORMING.hit()
    try:
        value = _result(_submit(held, attempt), held.loop)
    except ToolRefused as exc:
        return Rejected(exc.reason)
    except ModelBehaviorError as exc:
        return Rejected(f"the tool's arguments were refused: {exc}")
    TOOL_RETURNED.hit()
    return held.encode(value)


SINKS = {KIND: _sink}

_INLINE: dict[Setting, InlineDispatch] = {}
_INLINE_LOCK = threading.Lock()


def setting_of(scope: Scope) -> Setting:
    """Which dispatcher performs the scope's calls: its ledger, ``concurrency``,
    ``lease_seconds``, ``retry`` (by value) and depth."""
    retry = scope.retry
    policy = None
    if retry is not None:
        policy = tuple(
            getattr(retry, item.name) for item in dataclasses.fields(retry) if item.compare
        )
    return (id(scope.ledger), scope.concurrency, scope.lease_seconds, policy, scope.depth)


def inline_for(scope: Scope) -> tuple[Setting, InlineDispatch]:
    """The inline dispatcher of this process for the scope's calls (see the module docstring;
    one per setting, kept), with its setting. It claims only the calls held for it."""
    ledger, setting = scope.ledger, setting_of(scope)
    with _INLINE_LOCK:
        inline = _INLINE.get(setting)
        if inline is None or inline.ledger is not ledger:
            inline = _INLINE[setting] = InlineDispatch(
                ledger,
                SINKS,
                name=f"agents-{scope.depth}" if scope.depth else "agents",
                concurrency=scope.concurrency,
                lease_seconds=scope.lease_seconds,
                retry=scope.retry,
                keys=lambda: CALLS.keys(setting),
            )
        return setting, inline


def _answer(effect: Effect | None, problem: str | None) -> Any:
    """What the SDK is given for a call once its effect ended (or that got none)."""
    if effect is None:
        return toolcalls.tool_content("failed", {"error": problem})
    if effect.state is EffectState.DONE and effect.result_json is not None:
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
    invoker = _inner_invoker(tool)
    effect = await perform(
        scope,
        call_key(scope.key, call_id),
        tool.name,
        parsed,
        lambda: invoker(context, arguments),
        lambda value: responses.encode_output(tool, value),
    )
    return _answer(effect, None)


async def perform(
    scope: Scope,
    key: str,
    name: str,
    arguments: dict[str, Any],
    invoke: Callable[[], Awaitable[Any]],
    encode: Callable[[Any], Any],
) -> Effect:
    """The effect ``key`` of the tool ``name`` in ``scope`` once it has ended: accepted if it
    was not, and performed by the inline dispatcher (``invoke`` running the tool, ``encode``
    storing its answer) unless it had ended already."""
    effect = await asyncio.to_thread(_find_or_accept, scope, key, name, arguments)
    if effect.state not in TERMINAL_STATES:
        setting, inline = inline_for(scope)
        held = HeldCall(
            invoke=invoke,
            encode=encode,
            loop=asyncio.get_running_loop(),
            context=contextvars.copy_context(),
            scope=scope,
            setting=setting,
        )
        CALLS.hold(key, held)
        try:
            TOOL_ACCEPTED.hit()
            inline.enter()
            try:
                effect = await _settled(scope, inline, key)
            finally:
                inline.leave()
        finally:
            CALLS.release(key, held)
        TOOL_SETTLED.hit()
    return effect


async def _settled(scope: Scope, inline: InlineDispatch, key: str) -> Effect:
    """The effect ``key`` once it has ended, read from the store (whoever ran it), waiting on
    the run's loop: woken by the store's announcements and by the dispatcher's records, and
    ended by cancelling the run. After ``wait_seconds``:
    :class:`~oncewire.toolcalls.ToolCallPending`."""
    ledger, loop = scope.ledger, asyncio.get_running_loop()
    changed = asyncio.Event()

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the run's loop is closed: nobody waits
            loop.call_soon_threadsafe(changed.set)

    deadline = None if scope.wait_seconds is None else loop.time() + scope.wait_seconds
    stops = [inline.subscribe(wake)]
    try:
        stops.append(await asyncio.to_thread(ledger.store.subscribe_settled, wake))
        while True:
            changed.clear()
            effect = await asyncio.to_thread(ledger.effects.get, key)
            if effect.state in TERMINAL_STATES:
                return effect
            timeout = WAIT_POLL_SECONDS
            if deadline is not None:
                left = deadline - loop.time()
                if left <= 0:
                    raise toolcalls.ToolCallPending(key, effect.state)
                timeout = min(timeout, left)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout)
    finally:
        for stop in stops:
            stop()
