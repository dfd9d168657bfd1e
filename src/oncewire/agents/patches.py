"""The places of the OpenAI Agents SDK (openai-agents 0.24) a durable scope sees.

:func:`install` routes them through the durable scope once per process; outside a scope each
does exactly what it did:

* the model the run loop resolves for each turn (``agents.run_internal.run_loop.get_model``)
  is wrapped in a :class:`~oncewire.agents.scope.DurableModel` of the current scope, for the
  agent it was resolved for;
* a function tool's invocation (``agents.run_internal.tool_execution``'s
  ``_invoke_function_tool_with_metadata``) is an effect performed once
  (:func:`oncewire.agents.tools.call_tool`);
* a local tool's action (``agents.run_internal.tool_actions``: ``ShellAction``,
  ``LocalShellAction`` and ``ApplyPatchAction``'s ``execute``) first gives the tool a durable
  executor or editor (:mod:`oncewire.agents.local`), so that each call of it is an effect
  performed once;
* every run (``AgentRunner.run`` and ``run_streamed``, which ``Runner.run``, ``run_sync`` and
  ``run_streamed`` call) records in the scope :meth:`~oncewire.agents.scope.Scope.begin_run`
  gives it, until it ends: the current one when none of its runs is in progress, else a scope
  of its own. A run started inside a guardrail (input, output, tool input or tool output) is
  labelled by the guardrail's name (and a tool guardrail's by its call id), any other by its
  agent's name: what keys its scope, with how many such runs came before, the same on every
  attempt however the runs interleave.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any

from oncewire.core.extras import refusal

try:
    from agents import tool as sdk_tool
    from agents.guardrail import InputGuardrail, OutputGuardrail
    from agents.run import AgentRunner
    from agents.run_internal import run_loop, tool_actions, tool_execution
    from agents.tool_guardrails import ToolInputGuardrail, ToolOutputGuardrail
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("agents", "oncewire.agents", exc) from exc

from oncewire.agents import local
from oncewire.agents import scope as scopes
from oncewire.agents.tools import call_tool

__all__ = ["install"]

_INSTALLED = threading.Lock()
# The SDK's function tool invocation, as its tool executor names it.
_INVOKE = "_invoke_function_tool_with_metadata"
_installed = False

# What the code running now was started by, when a guardrail: its label for a run it starts.
_WHERE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "oncewire_agents_where", default=None
)


def _label(agent: Any) -> str:
    """What a run of ``agent`` starting here is labelled (see the module docstring)."""
    name = str(getattr(agent, "name", "") or type(agent).__name__)
    where = _WHERE.get()
    return name if where is None else f"{where}:{name}"


def _enter(agent: Any) -> tuple[scopes.Scope, list[contextvars.Token[Any]]] | None:
    """A run of ``agent`` starts: its scope, entered (None outside a durable run)."""
    scope = scopes.current_scope()
    if scope is None:
        return None
    inner = scope.begin_run(_label(agent))
    return inner, [scopes.enter(inner), _WHERE.set(None)]


def _leave(tokens: list[contextvars.Token[Any]]) -> None:
    _WHERE.reset(tokens[1])
    scopes.leave(tokens[0])


def _install_runs() -> None:
    original_run = AgentRunner.run
    original_streamed = AgentRunner.run_streamed

    async def run(self: Any, starting_agent: Any, input: Any, **kwargs: Any) -> Any:
        entered = _enter(starting_agent)
        if entered is None:
            return await original_run(self, starting_agent, input, **kwargs)
        inner, tokens = entered
        try:
            return await original_run(self, starting_agent, input, **kwargs)
        finally:
            _leave(tokens)
            inner.end_run()

    def run_streamed(self: Any, starting_agent: Any, input: Any, **kwargs: Any) -> Any:
        entered = _enter(starting_agent)
        if entered is None:
            return original_streamed(self, starting_agent, input, **kwargs)
        inner, tokens = entered
        try:
            # The SDK starts the run's task here: it keeps a copy of the context.
            result = original_streamed(self, starting_agent, input, **kwargs)
        except BaseException:
            inner.end_run()
            raise
        finally:
            _leave(tokens)
        task = getattr(result, "run_loop_task", None)
        if task is None:
            inner.end_run()
        else:
            task.add_done_callback(lambda _task: inner.end_run())
        return result

    AgentRunner.run = run  # type: ignore[method-assign]
    AgentRunner.run_streamed = run_streamed  # type: ignore[method-assign]


def _labelled(original: Callable[..., Any], where: Callable[..., str]) -> Callable[..., Any]:
    """``original`` (a guardrail's ``run``) with the runs it starts labelled ``where(...)``."""

    async def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if scopes.current_scope() is None:
            return await original(self, *args, **kwargs)
        token = _WHERE.set(where(self, *args, **kwargs))
        try:
            return await original(self, *args, **kwargs)
        finally:
            _WHERE.reset(token)

    return run


def _tool_guardrail(kind: str) -> Callable[..., str]:
    def where(guardrail: Any, data: Any, *args: Any, **kwargs: Any) -> str:
        call_id = getattr(getattr(data, "context", None), "tool_call_id", "") or ""
        return f"{kind}:{guardrail.get_name()}@{call_id}"

    return where


def _install_guardrails() -> None:
    InputGuardrail.run = _labelled(  # type: ignore[method-assign]
        InputGuardrail.run, lambda guardrail, *_, **__: f"input_guardrail:{guardrail.get_name()}"
    )
    OutputGuardrail.run = _labelled(  # type: ignore[method-assign]
        OutputGuardrail.run,
        lambda guardrail, *_, **__: f"output_guardrail:{guardrail.get_name()}",
    )
    ToolInputGuardrail.run = _labelled(  # type: ignore[method-assign]
        ToolInputGuardrail.run, _tool_guardrail("tool_input_guardrail")
    )
    ToolOutputGuardrail.run = _labelled(  # type: ignore[method-assign]
        ToolOutputGuardrail.run, _tool_guardrail("tool_output_guardrail")
    )


def _install_local_tools() -> None:
    shell, local_shell = tool_actions.ShellAction, tool_actions.LocalShellAction
    apply_patch = tool_actions.ApplyPatchAction
    shell_execute, local_execute = shell.execute, local_shell.execute
    patch_execute = apply_patch.execute

    async def execute_shell(cls: Any, /, *, call: Any, **kwargs: Any) -> Any:
        if scopes.current_scope() is not None:
            local.wrap_executor(call.shell_tool, local=False)
        return await shell_execute(call=call, **kwargs)

    async def execute_local_shell(cls: Any, /, *, call: Any, **kwargs: Any) -> Any:
        if scopes.current_scope() is not None:
            local.wrap_executor(call.local_shell_tool, local=True)
        return await local_execute(call=call, **kwargs)

    async def execute_apply_patch(cls: Any, /, *, call: Any, **kwargs: Any) -> Any:
        if scopes.current_scope() is None:
            return await patch_execute(call=call, **kwargs)
        local.wrap_editor(call.apply_patch_tool)
        token = local.patch_call(str(local.field_of(call.tool_call, "call_id") or ""))
        try:
            return await patch_execute(call=call, **kwargs)
        finally:
            local.patch_call_done(token)

    shell.execute = classmethod(execute_shell)  # type: ignore[method-assign,assignment]
    local_shell.execute = classmethod(execute_local_shell)  # type: ignore[method-assign,assignment]
    apply_patch.execute = classmethod(execute_apply_patch)  # type: ignore[method-assign,assignment]


def install() -> None:
    """Route the SDK's places (see the module docstring) through the durable scope, once."""
    global _installed
    with _INSTALLED:
        if _installed:
            return
        original_get_model = run_loop.get_model
        original_invoke = getattr(tool_execution, _INVOKE)
        result_type = sdk_tool._FunctionToolInvocationResult
        invoke_context = sdk_tool._get_function_tool_invoke_context

        def get_model(agent: Any, run_config: Any) -> Any:
            model = original_get_model(agent, run_config)
            scope = scopes.current_scope()
            return model if scope is None else scope.model(model, str(agent.name))

        async def invoke(*, function_tool: Any, context: Any, arguments: str) -> Any:
            scope = scopes.current_scope()
            if scope is None:
                return await original_invoke(
                    function_tool=function_tool, context=context, arguments=arguments
                )
            output = await call_tool(
                scope, function_tool, invoke_context(function_tool, context), arguments
            )
            return result_type(output)

        run_loop.get_model = get_model
        setattr(tool_execution, _INVOKE, invoke)
        _install_runs()
        _install_guardrails()
        _install_local_tools()
        _installed = True
