"""The SDK's local tools in a durable run: each call an effect, performed once.

``ShellTool`` with a local executor, ``LocalShellTool`` and ``ApplyPatchTool`` are not function
tools: the SDK's run loop calls their executor (or editor) itself, in
``agents.run_internal.tool_actions`` (``ShellAction``, ``LocalShellAction`` and
``ApplyPatchAction``'s ``execute``), after its approvals and before its hooks. In a durable run
(:mod:`oncewire.agents.patches`) each ``execute`` first gives its tool a durable executor
(:class:`DurableExecutor`) or editor (:class:`DurableEditor`) in place of the one it has,
wrapping it, once: outside a durable run the wrapper calls the tool's own, unchanged. Inside
one, a call of it is the effect ``agents/{run_key}/{call_id}`` of kind ``agents.tool``, the call
id being the model's, performed as a function tool's is (:func:`oncewire.agents.tools.perform`):
accepted, run once by the run's inline dispatcher inside its attempt
(:func:`oncewire.agents.current_attempt`) and a scope of its own, retried flagged when the
executor raised (it may have acted), and answered from the store when it has ended (a replayed
step, a resumed run, the same ``run_key`` called again):

* a shell executor's answer is stored as given (text, or a ``ShellResult`` rebuilt as one); a
  call that did not end ``done`` fails as if the executor had raised what the store knows
  ("outcome unknown" when it may have run), which the SDK tells the model with status
  ``failed``;
* a local shell executor's text is stored; a call that did not end ``done`` answers what the
  store knows, as text (the SDK does not catch a local shell executor's error: the run would
  end);
* an editor's operation answer is stored as the SDK reads it (``ApplyPatchResult``); one that
  did not end ``done`` answers ``failed`` with what the store knows. The SDK gives the editor
  only the operation, so ``ApplyPatchAction.execute`` says which call the operations are of; a
  call with more than one operation (the SDK accepts a list) has one effect per operation, the
  first keyed by the call id, the ``n``-th (from 1) that key followed by ``/n``.

``ComputerTool`` is not made durable: the SDK calls its ``Computer`` several times per call (each
action, then a screenshot of the screen as it is), none of them knowing the call, and the
answer the model is given is that screenshot, which a replay from the store would give of a
screen that may have changed since.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

from oncewire import toolcalls
from oncewire.core.extras import refusal
from oncewire.storage.records import Effect, EffectState

try:
    from agents.editor import ApplyPatchOperation, ApplyPatchResult
    from agents.run_internal.tool_execution import normalize_apply_patch_result
    from agents.tool import ShellCallOutcome, ShellCommandOutput, ShellResult
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("agents", "oncewire.agents", exc) from exc

from oncewire.agents.responses import FORMAT
from oncewire.agents.scope import Scope, call_key, current_scope
from oncewire.agents.tools import perform

__all__ = [
    "DurableEditor",
    "DurableExecutor",
    "UnknownOutcome",
    "field_of",
    "patch_call",
    "patch_call_done",
    "wrap_editor",
    "wrap_executor",
]

# The apply_patch call ApplyPatchAction.execute is running: [call id, operations given so far].
_PATCH_CALL: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "oncewire_agents_patch_call", default=None
)


def field_of(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    dump = getattr(value, "model_dump", None)
    return dump(mode="json", exclude_none=True) if dump is not None else value


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class UnknownOutcome(RuntimeError):
    """What the store knows of a shell call that did not end ``done``, raised as its
    executor's error so that the SDK reports the call ``failed``."""


def _stored(effect: Effect) -> tuple[bool, dict[str, Any]]:
    """(whether the effect is ``done`` with a result this module wrote, that result)."""
    if effect.state is EffectState.DONE and effect.result_json is not None:
        result = json.loads(effect.result_json)
        if isinstance(result, dict) and result.get("format") == FORMAT:
            return True, result
    return False, {}


def _encode_shell(value: Any) -> dict[str, Any]:
    if isinstance(value, ShellResult):
        return {"format": FORMAT, "shell": dataclasses.asdict(value)}
    return {"format": FORMAT, "str": str(value)}


def _decode_shell(result: dict[str, Any]) -> Any:
    shell = result.get("shell")
    if not isinstance(shell, dict):
        return str(result.get("str", ""))
    output = [
        ShellCommandOutput(**{**entry, "outcome": ShellCallOutcome(**entry["outcome"])})
        for entry in shell.get("output", [])
    ]
    return ShellResult(**{**shell, "output": output})


def _encode_patch(value: Any) -> dict[str, Any]:
    normalized = normalize_apply_patch_result(value)
    return {"format": FORMAT, "patch": normalized and dataclasses.asdict(normalized)}


async def _perform(
    scope: Scope,
    key: str,
    name: str,
    arguments: dict[str, Any],
    invoke: Callable[[], Awaitable[Any]],
    encode: Callable[[Any], Any],
) -> tuple[bool, Any]:
    """(whether it ended ``done`` with a stored answer, that answer or what the store knows)."""
    effect = await perform(scope, key, name, arguments, invoke, encode)
    ours, result = _stored(effect)
    return (True, result) if ours else (False, toolcalls.effect_content(effect))


class DurableExecutor:
    """A shell or local shell tool's executor, durable inside a durable run (see the module
    docstring); ``local`` is whether it is a ``LocalShellTool``'s."""

    def __init__(self, inner: Callable[[Any], Any], name: str, *, local: bool) -> None:
        self.inner = inner
        self.name = name
        self.local = local

    def __call__(self, request: Any) -> Any:
        scope = current_scope()
        if scope is None:
            return self.inner(request)
        return self._durable(scope, request)

    async def _durable(self, scope: Scope, request: Any) -> Any:
        data = request.data
        call_id = str(field_of(data, "call_id") or "")
        if not call_id:
            return await _awaited(self.inner(request))  # no key to perform it under
        arguments = _jsonable(field_of(data, "action"))
        done, answer = await _perform(
            scope,
            call_key(scope.key, call_id),
            self.name,
            arguments if isinstance(arguments, dict) else {"action": arguments},
            lambda: _awaited(self.inner(request)),
            (lambda value: {"format": FORMAT, "str": str(value)}) if self.local else _encode_shell,
        )
        if done:
            return _decode_shell(answer)
        if self.local:
            return answer
        raise UnknownOutcome(answer)


class DurableEditor:
    """An apply_patch tool's editor, durable inside a durable run (see the module
    docstring)."""

    def __init__(self, inner: Any, name: str) -> None:
        self.inner = inner
        self.name = name

    def create_file(self, operation: ApplyPatchOperation) -> Any:
        return self._apply("create_file", operation)

    def update_file(self, operation: ApplyPatchOperation) -> Any:
        return self._apply("update_file", operation)

    def delete_file(self, operation: ApplyPatchOperation) -> Any:
        return self._apply("delete_file", operation)

    def _apply(self, method: str, operation: ApplyPatchOperation) -> Any:
        scope, call = current_scope(), _PATCH_CALL.get()
        if scope is None or call is None:
            return getattr(self.inner, method)(operation)
        call_id, index = call
        call[1] = index + 1
        key = call_key(scope.key, call_id) + (f"/{index}" if index else "")
        return self._durable(scope, key, method, operation)

    async def _durable(
        self, scope: Scope, key: str, method: str, operation: ApplyPatchOperation
    ) -> Any:
        arguments = {
            "type": operation.type,
            "path": operation.path,
            "diff": operation.diff,
            "move_to": operation.move_to,
        }
        done, answer = await _perform(
            scope,
            key,
            self.name,
            arguments,
            lambda: _awaited(getattr(self.inner, method)(operation)),
            _encode_patch,
        )
        if not done:
            return ApplyPatchResult(status="failed", output=answer)
        patch = answer.get("patch")
        return None if patch is None else ApplyPatchResult(**patch)


def wrap_executor(tool: Any, *, local: bool) -> None:
    """Give ``tool`` (a ``ShellTool`` or ``LocalShellTool``) a :class:`DurableExecutor`
    wrapping its executor, unless it has one (or none)."""
    executor = tool.executor
    if executor is not None and not isinstance(executor, DurableExecutor):
        tool.executor = DurableExecutor(executor, str(tool.name), local=local)


def wrap_editor(tool: Any) -> None:
    """Give ``tool`` (an ``ApplyPatchTool``) a :class:`DurableEditor` wrapping its editor,
    unless it has one."""
    if not isinstance(tool.editor, DurableEditor):
        tool.editor = DurableEditor(tool.editor, str(tool.name))


def patch_call(call_id: str) -> contextvars.Token[list[Any] | None]:
    """The editor's operations from now on are of the apply_patch call ``call_id``; reset the
    token when its ``execute`` returns."""
    return _PATCH_CALL.set([call_id, 0] if call_id else None)


def patch_call_done(token: contextvars.Token[list[Any] | None]) -> None:
    _PATCH_CALL.reset(token)
