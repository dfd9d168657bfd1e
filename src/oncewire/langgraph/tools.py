"""``DurableToolNode``: LangGraph's ``ToolNode`` whose tool calls are oncewire effects.

Every tool call of the AI message a node runs is an effect keyed by the graph's thread, its
checkpoint namespace and the call's id (:func:`turn_of`), all of the message's calls accepted
in one transaction (:func:`oncewire.toolcalls.accept_in_tx`) before any runs. A dispatcher then
performs each once: by default the node's own, started at its first step and kept
(``dispatch="inline"``, :mod:`oncewire.dispatch.inline`), or the separate ``oncewire
dispatch`` workers (``dispatch="workers"``, with :func:`tool_sinks`). The node waits for
every effect to end, reading the store (:func:`oncewire.toolcalls.settled`), and returns one
output per call: the tool's own answer when its effect is ``done``, else what
:mod:`oncewire.toolcalls` tells a model (:mod:`oncewire.langgraph.tools_results`).

So a node that runs again for the same checkpoint (resumed after a crash, replayed, re-executed
after a failure elsewhere in its step) accepts the same keys, finds the same effects and runs
no tool whose effect is done; a tool whose process died while it ran is retried as a flagged
redelivery (:func:`~oncewire.langgraph.current_attempt`), and one that kept failing is told to
the model as "outcome unknown".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any, Literal
from urllib.parse import quote

from oncewire.core.extras import refusal

try:
    from langchain_core.messages import AnyMessage, ToolMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.runnables.config import get_config_list
    from langchain_core.tools import BaseTool
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolRuntime
    from langgraph.runtime import Runtime
    from pydantic import BaseModel
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("langgraph", "oncewire.langgraph", exc) from exc

from oncewire import toolcalls
from oncewire.core import crash
from oncewire.core.errors import ConfigurationError, OncewireError, WrongType
from oncewire.dispatch.inline import InlineDispatch
from oncewire.dispatch.retry import RetryPolicy
from oncewire.langgraph.tools_results import Output, error_message, render
from oncewire.langgraph.tools_sinks import (
    CALLS,
    KEY_PREFIX,
    CallContext,
    default_kind,
    sinks_for,
)
from oncewire.ledger import Ledger
from oncewire.storage.records import TERMINAL_STATES, Effect, EffectState

__all__ = [
    "TOOLS_ACCEPTED",
    "TOOLS_SETTLED",
    "DurableToolNode",
    "ToolCallFailed",
    "tool_sinks",
    "turn_of",
]

TOOLS_ACCEPTED = crash.register(
    "langgraph.tools_accepted",
    "every tool call of the AI message is accepted and committed; no tool has run",
)
TOOLS_SETTLED = crash.register(
    "langgraph.tools_settled",
    "every tool call's effect has ended; the node has not returned (nothing checkpointed)",
)

Dispatch = Literal["inline", "workers"]


class ToolCallFailed(OncewireError):
    """A tool call's effect did not end ``done`` and the node was told not to handle tool
    errors (``handle_tool_errors=False``): what the model would have been told is the
    message."""

    code = "tool_call_failed"

    def __init__(self, key: str, state: EffectState | None, content: str) -> None:
        super().__init__(content, key=key, state=None if state is None else str(state))
        self.key = key
        self.state = state


def _namespace(checkpoint_ns: str) -> str:
    """The namespace of the graph a task runs in, without task ids: ``""`` for the root graph,
    ``"agent"`` for a task of the subgraph node ``agent``. LangGraph's task ids change with the
    checkpoint a step starts from; the node and subgraph names do not."""
    segments = [segment for segment in checkpoint_ns.split("|") if segment][:-1]
    return "|".join(segment.split(":", 1)[0] for segment in segments)


def turn_of(config: RunnableConfig) -> str:
    """``langgraph/{thread_id}/{namespace}``: the turn of a node's tool calls, each call's key
    being ``{turn}/{tool_call_id}`` (the thread and namespace quoted, so no two tuples of
    thread, namespace and id give one key). A ``ConfigurationError`` without a thread id."""
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None or str(thread_id) == "":
        raise ConfigurationError(
            "DurableToolNode keys each tool call by the graph's thread: invoke the graph "
            'with config={"configurable": {"thread_id": ...}}'
        )
    namespace = _namespace(str(configurable.get("checkpoint_ns") or ""))
    return f"{KEY_PREFIX}/{quote(str(thread_id), safe='')}/{quote(namespace, safe='')}"


def _openai_call(call: dict[str, Any]) -> dict[str, Any]:
    """LangChain's tool call in the OpenAI form :func:`oncewire.toolcalls.accept_in_tx` reads."""
    return {
        "id": call.get("id"),
        "function": {"name": call.get("name"), "arguments": json.dumps(call.get("args") or {})},
    }


class DurableToolNode(ToolNode):
    """``DurableToolNode(tools, ledger=ledger)`` where a graph has ``ToolNode(tools)``.

    ``tools``, ``name``, ``tags`` and ``messages_key`` are ``ToolNode``'s. ``ledger`` is the
    :class:`~oncewire.Ledger` (or its path or URL) holding the effects. ``handle_tool_errors``
    is True (a call whose effect did not end ``done`` becomes an error ``ToolMessage`` saying
    what the store knows) or False (it raises :class:`ToolCallFailed`); the string, callable
    and exception-type forms of ``ToolNode`` are refused, because a tool that raised is retried
    as a redelivery, not turned into a message, and what the model is told is the store's.

    ``dispatch="inline"`` runs the node's tools with a :class:`~oncewire.Dispatcher` of its
    own, started at the first step that needs it and kept until :meth:`close` or the
    process's exit (``concurrency`` tools at once, ``retry`` between attempts,
    ``lease_seconds`` per claim); ``"workers"`` leaves the effects to ``oncewire dispatch --app
    module:sinks`` processes, ``sinks`` being :func:`tool_sinks` of the same tools.
    ``max_attempts`` bounds the attempts of a tool that raises; ``wait_seconds`` bounds the
    node's wait (None: until every call's effect ends), then
    :class:`~oncewire.toolcalls.ToolCallPending`. ``kind`` names each tool's effect kind
    (``tool.{name}``).
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        ledger: Ledger | str,
        name: str = "tools",
        tags: list[str] | None = None,
        handle_tool_errors: bool = True,
        messages_key: str = "messages",
        dispatch: Dispatch = "inline",
        max_attempts: int = 3,
        wait_seconds: float | None = None,
        poll_seconds: float = 0.1,
        concurrency: int = 8,
        retry: RetryPolicy | None = None,
        lease_seconds: float = 30.0,
        kind: Callable[[str], str] = default_kind,
    ) -> None:
        if not isinstance(handle_tool_errors, bool):
            raise ConfigurationError(
                "DurableToolNode: handle_tool_errors is True or False; a tool that raises is "
                "retried as a redelivery and the model told what the store holds, so a "
                f"{type(handle_tool_errors).__name__} cannot choose the message"
            )
        if dispatch not in ("inline", "workers"):
            raise ConfigurationError(f"dispatch is 'inline' or 'workers', not {dispatch!r}")
        if isinstance(ledger, str):
            ledger = Ledger(ledger)
        if not isinstance(ledger, Ledger):
            raise WrongType(
                f"ledger is an oncewire.Ledger or its path, not {type(ledger).__name__}"
            )
        super().__init__(
            tools,
            name=name,
            tags=tags,
            handle_tool_errors=handle_tool_errors,
            messages_key=messages_key,
        )
        self.ledger = ledger
        self.dispatch = dispatch
        self.max_attempts = max_attempts
        self.wait_seconds = wait_seconds
        self.poll_seconds = poll_seconds
        self.concurrency = concurrency
        self.retry = retry
        self.lease_seconds = lease_seconds
        self.kind = kind
        self._calls = CALLS
        self._sinks = sinks_for(self, self._calls, kind)
        self._inline = (
            InlineDispatch(
                ledger,
                self._sinks,
                name=name,
                concurrency=concurrency,
                lease_seconds=lease_seconds,
                retry=retry,
            )
            if dispatch == "inline"
            else None
        )

    def sinks(self) -> dict[str, Any]:
        """The node's tools as dispatcher sinks, by kind (what its inline dispatcher runs)."""
        return dict(self._sinks)

    # -- the steps, shared by invoke and ainvoke ------------------------------------------------
    def _runtimes(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
        tool_calls: list[Any],
    ) -> list[ToolRuntime[Any, Any]]:
        # As ToolNode builds them: one per call, with that call's config.
        runtimes = []
        for call, cfg in zip(tool_calls, get_config_list(config, len(tool_calls)), strict=False):
            runtimes.append(
                ToolRuntime(
                    state=self._extract_state(input, cfg),
                    tool_call_id=call["id"],
                    config=cfg,
                    context=runtime.context,
                    store=runtime.store,
                    stream_writer=runtime.stream_writer,
                    tools=list(self.tools_by_name.values()),
                    execution_info=runtime.execution_info,
                    server_info=runtime.server_info,
                )
            )
        return runtimes

    def _accept(
        self,
        turn: str,
        tool_calls: list[Any],
        runtimes: list[ToolRuntime[Any, Any]],
        input_type: Any,
        loop: asyncio.AbstractEventLoop | None,
    ) -> tuple[list[toolcalls.AcceptedCall | ToolMessage], list[tuple[str, CallContext]]]:
        """Hold each known call's context, then accept them all in one transaction; a call to
        a tool the node does not have gets ToolNode's message and no effect."""
        known: list[tuple[int, Any]] = []
        plan: list[toolcalls.AcceptedCall | ToolMessage] = []
        held: list[tuple[str, CallContext]] = []
        try:
            for index, (call, runtime) in enumerate(zip(tool_calls, runtimes, strict=True)):
                tool = self.tools_by_name.get(call["name"])
                refusal = self._validate_tool_call(call)
                if tool is None or refusal is not None:
                    plan.append(refusal or error_message(call, "error: unknown tool"))
                    continue
                injected = self._inject_tool_args(call, runtime, tool)
                context = CallContext(
                    call=dict(injected),
                    config=runtime.config,
                    input_type=input_type,
                    loop=loop,
                    sink=self._sinks.get(self.kind(call["name"])),
                )
                key = toolcalls.tool_call_key(turn, str(call.get("id") or ""))
                self._calls.hold(key, context)
                held.append((key, context))
                known.append((index, call))
                plan.append(refusal or error_message(call, ""))  # its accepted call, below
            with self.ledger.transaction() as tx:
                accepted = toolcalls.accept_in_tx(
                    tx,
                    turn,
                    [_openai_call(call) for _, call in known],
                    kind=self.kind,
                    max_attempts=self.max_attempts,
                )
        except BaseException:
            self._release(held)
            raise
        for (index, _), item in zip(known, accepted, strict=True):
            plan[index] = item
        TOOLS_ACCEPTED.hit()
        return plan, held

    def _release(self, held: list[tuple[str, CallContext]]) -> None:
        for key, context in held:
            self._calls.release(key, context)

    def _enter(self, plan: list[toolcalls.AcceptedCall | ToolMessage]) -> bool:
        """Wake the node's dispatcher (started at the first step that needs it) when some
        accepted call has not ended yet; whether the step is to :meth:`_leave` it after."""
        if self._inline is None:
            return False
        waiting = any(
            isinstance(item, toolcalls.AcceptedCall)
            and item.effect is not None
            and item.effect.state not in TERMINAL_STATES
            for item in plan
        )
        if waiting:
            self._inline.enter()
        return waiting

    def _leave(self, entered: bool) -> None:
        if entered and self._inline is not None:
            self._inline.leave()

    def close(self) -> None:
        """Stop the node's inline dispatcher: claims whose tools have not started go back, and
        it waits for the tools running (see :mod:`oncewire.dispatch.inline`). A later
        step starts it again; the process's exit stops it too."""
        if self._inline is not None:
            self._inline.close()

    def _settle(self, plan: list[toolcalls.AcceptedCall | ToolMessage]) -> list[Effect | None]:
        accepted = [item for item in plan if isinstance(item, toolcalls.AcceptedCall)]
        return toolcalls.settled(
            self.ledger,
            accepted,
            wait_seconds=self.wait_seconds,
            poll_seconds=self.poll_seconds,
            subscribe=None if self._inline is None else self._inline.subscribe,
        )

    def _outputs(
        self,
        tool_calls: list[Any],
        plan: list[toolcalls.AcceptedCall | ToolMessage],
        effects: list[Effect | None],
    ) -> list[Output]:
        TOOLS_SETTLED.hit()
        ended = iter(effects)
        outputs: list[Output] = []
        for call, item in zip(tool_calls, plan, strict=True):
            if isinstance(item, ToolMessage):
                outputs.append(item)
                continue
            effect = next(ended)
            output = render(dict(call), effect, item.problem, self._messages_key)
            if not self._handle_tool_errors and (
                effect is None or effect.state is not EffectState.DONE
            ):
                assert isinstance(output, ToolMessage)
                raise ToolCallFailed(
                    item.key, None if effect is None else effect.state, str(output.content)
                )
            outputs.append(output)
        return outputs

    # -- ToolNode's entry points ----------------------------------------------------------------
    def _func(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
    ) -> Any:
        tool_calls, input_type = self._parse_input(input)
        turn = turn_of(config)
        runtimes = self._runtimes(input, config, runtime, tool_calls)
        plan, held = self._accept(turn, tool_calls, runtimes, input_type, None)
        try:
            entered = self._enter(plan)
            try:
                effects = self._settle(plan)
            finally:
                self._leave(entered)
        finally:
            self._release(held)
        outputs = self._outputs(tool_calls, plan, effects)
        return self._combine_tool_outputs(outputs, input_type)

    async def _afunc(
        self,
        input: list[AnyMessage] | dict[str, Any] | BaseModel,
        config: RunnableConfig,
        runtime: Runtime[Any],
    ) -> Any:
        tool_calls, input_type = self._parse_input(input)
        turn = turn_of(config)
        runtimes = self._runtimes(input, config, runtime, tool_calls)
        loop = asyncio.get_running_loop()
        plan, held = await asyncio.to_thread(
            self._accept, turn, tool_calls, runtimes, input_type, loop
        )
        try:
            entered = self._enter(plan)
            try:
                effects = await asyncio.to_thread(self._settle, plan)
            finally:
                self._leave(entered)
        finally:
            self._release(held)
        outputs = self._outputs(tool_calls, plan, effects)
        return self._combine_tool_outputs(outputs, input_type)


def tool_sinks(
    tools: Sequence[BaseTool | Callable[..., Any]],
    *,
    messages_key: str = "messages",
    kind: Callable[[str], str] = default_kind,
) -> dict[str, Any]:
    """The sinks of ``tools`` for ``oncewire dispatch`` workers serving a
    ``DurableToolNode(tools, dispatch="workers")``: ``sinks = tool_sinks([...])`` in a module,
    then ``oncewire dispatch --db ... --app module:sinks``. They run each tool with the
    arguments its effect holds (no graph state, store or runtime: a tool that needs them runs
    only inline)."""
    return sinks_for(ToolNode(tools, messages_key=messages_key), None, kind)
