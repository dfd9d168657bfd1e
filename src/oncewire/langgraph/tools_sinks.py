"""A LangChain tool as a dispatcher sink: one attempt of a tool call's effect runs the tool.

The sink of kind ``tool.{name}`` runs the tool the way ``ToolNode`` does (``tool.invoke`` with
the call, so that the tool's own ``ToolMessage``, artifact and status come out as they would
there) inside :func:`~oncewire.dispatch.attempt.running`, so that
:func:`~oncewire.langgraph.current_attempt` gives the tool its key and redelivery flag. What
the tool does decides the outcome:

* it answers (a ``ToolMessage``, a ``Command``, a value the tool turns into a message):
  ``Done`` with the answer as JSON (:mod:`oncewire.langgraph.tools_results`);
* its arguments fail the tool's schema (the tool body never ran), it raises
  :class:`~oncewire.langgraph.ToolRefused`, or it calls ``interrupt()`` (not supported inside
  a durable tool): ``Rejected``, never retried;
* it raises anything else: the exception reaches the dispatcher, which records the attempt
  ``uncertain`` (the tool may have acted) and retries it as a flagged redelivery.

A call accepted by a node in this process carries its graph context here (:data:`CALLS`, one
registry per process: the node's config, the injected state, store and runtime, the event loop
of an ``ainvoke``, and the node's own sink for the call), whichever node's dispatcher of this
process claims it: it runs with the tool of the node that accepted it. An attempt whose
context is elsewhere (another process accepted it, or a worker started by
``oncewire dispatch`` runs it) runs the tool with the arguments the effect holds and a plain
config; a tool that needs injected arguments cannot, and its attempt is ``NotSent`` (it did
not run) until a node that holds its context claims it.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from oncewire.core.extras import refusal

try:
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool
    from langgraph.errors import GraphBubbleUp
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolInvocationError, _filter_validation_errors
    from pydantic import ValidationError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("langgraph", "oncewire.langgraph", exc) from exc

from oncewire.core import crash
from oncewire.dispatch.attempt import ToolRefused, arunning, running
from oncewire.effects.attempt import Attempt
from oncewire.effects.outcomes import NotSent, Rejected
from oncewire.langgraph.tools_results import encode, unusable

__all__ = ["CALLS", "TOOL_RETURNED", "CallContext", "Calls", "default_kind", "sinks_for"]

TOOL_RETURNED = crash.register(
    "langgraph.tool_returned",
    "a durable tool returned inside its attempt (the world may have changed); its outcome "
    "is not recorded",
)

InputType = Literal["list", "dict", "tool_calls"]
KEY_PREFIX = "langgraph"
# How long an attempt whose graph context is in another process waits before it is tried again.
CONTEXT_ELSEWHERE_RETRY_SECONDS = 1.0


def default_kind(name: str) -> str:
    """The effect kind of tool ``name``: ``tool.{name}``, as :mod:`oncewire.toolcalls`."""
    return f"tool.{name}"


@dataclass
class CallContext:
    """What a node in this process knows of one accepted call: the call with its injected
    arguments, the config and context it runs in, the loop of an ``ainvoke``, and the sink
    of the node's tool (None: whichever sink claims it)."""

    call: dict[str, Any]
    config: RunnableConfig
    input_type: InputType
    context: contextvars.Context = field(default_factory=contextvars.copy_context)
    loop: asyncio.AbstractEventLoop | None = None
    sink: _ToolSink | None = None


class Calls:
    """The graph contexts of the calls that nodes of this process wait for, by effect key."""

    def __init__(self) -> None:
        self._forked()
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        # A forked child holds none of its parent's calls (nor a lock another thread held).
        self._lock = threading.Lock()
        self._by_key: dict[str, CallContext] = {}

    def hold(self, key: str, context: CallContext) -> None:
        with self._lock:
            self._by_key[key] = context

    def release(self, key: str, context: CallContext) -> None:
        with self._lock:
            if self._by_key.get(key) is context:
                del self._by_key[key]

    def get(self, key: str) -> CallContext | None:
        with self._lock:
            return self._by_key.get(key)


CALLS = Calls()


def call_id_of(key: str) -> str:
    """The tool call id at the end of a node's effect key ``langgraph/{thread}/{ns}/{id}``."""
    parts = key.split("/", 3)
    return parts[3] if len(parts) == 4 and parts[0] == KEY_PREFIX else key


def _needs_context(node: ToolNode, name: str) -> bool:
    injected = node._injected_args.get(name)
    return bool(injected and (injected.state or injected.store or injected.runtime))


class _ToolSink:
    """The sink of one tool (see the module docstring)."""

    def __init__(self, node: ToolNode, tool: BaseTool, calls: Calls | None) -> None:
        self.node = node
        self.tool = tool
        self.calls = calls
        self.needs_context = _needs_context(node, tool.name)

    def __call__(self, attempt: Attempt) -> Any:
        held = None if self.calls is None else self.calls.get(attempt.key)
        if held is None:
            if self.needs_context:
                return NotSent(
                    f"the tool {self.tool.name!r} needs its graph's state, store or runtime, "
                    "held by the node that accepted the call, not here",
                    retry_after=CONTEXT_ELSEWHERE_RETRY_SECONDS,
                )
            args = attempt.payload if isinstance(attempt.payload, Mapping) else {}
            call = {"name": self.tool.name, "args": dict(args), "id": call_id_of(attempt.key)}
            held = CallContext(call=call, config={}, input_type="dict")
        elif held.sink is not None and held.sink is not self:
            return held.sink._perform(attempt, held)  # accepted by another node of this process
        return self._perform(attempt, held)

    def _invoke(self, attempt: Attempt, held: CallContext) -> Any:
        call_args = {**held.call, "type": "tool_call"}
        if held.loop is not None and not held.loop.is_closed():
            coroutine = arunning(attempt, lambda: self.tool.ainvoke(call_args, held.config))
            return asyncio.run_coroutine_threadsafe(coroutine, held.loop).result()
        if getattr(self.tool, "func", True) is None and getattr(self.tool, "coroutine", None):
            return asyncio.run(arunning(attempt, lambda: self.tool.ainvoke(call_args, held.config)))
        return held.context.copy().run(
            running, attempt, lambda: self.tool.invoke(call_args, held.config)
        )

    def _perform(self, attempt: Attempt, held: CallContext) -> Any:
        call = held.call
        try:
            # The schema first, apart: arguments it refuses never reach the tool's body, while
            # a ValidationError raised from inside the body may follow an action.
            self.tool._parse_input(call["args"], call.get("id"))
        except ValidationError as exc:
            injected = self.node._injected_args.get(call["name"])
            errors = _filter_validation_errors(exc, injected)
            model_args = attempt.payload if isinstance(attempt.payload, dict) else {}
            return Rejected(ToolInvocationError(call["name"], exc, model_args, errors).message)
        try:
            response = self._invoke(attempt, held)
        except ToolRefused as exc:
            return Rejected(exc.reason)
        except GraphBubbleUp:
            return Rejected("interrupt() inside a durable tool is not supported")
        TOOL_RETURNED.hit()
        try:
            output = self.node._normalize_tool_response(response, call, held.input_type)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            return unusable(f"its answer could not be used: {exc}")
        return encode(output, self.node._messages_key)


def sinks_for(
    node: ToolNode, calls: Calls | None, kind: Callable[[str], str] = default_kind
) -> dict[str, Any]:
    """One sink per tool of ``node``, by effect kind ``kind(name)``."""
    return {kind(name): _ToolSink(node, tool, calls) for name, tool in node.tools_by_name.items()}
