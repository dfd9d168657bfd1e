"""OpenAI-style tool calls as effects, outside the gateway: one effect per ``tool_call.id``.

The recipe (docs/tools.md): when a model response asks for tool calls, accept one effect per
call in the transaction that records the response (:func:`accept_in_tx`), keyed stably per turn
as ``f"{turn}/{tool_call.id}"``, so that a retried turn finds the same effects instead of making
new ones; commit; let a :class:`~oncewire.Dispatcher` run the tools' sinks (kind
``tool.{name}`` by default); then wait for each effect, reading the store, and hand the model one
tool message per call (:func:`results`). :func:`call` does both for a caller with no
transaction of its own.

What the model is told is what the store holds, nothing kinder: ``done`` is the sink's result;
``rejected`` is "the tool refused the call"; ``dead`` or ``cancelled`` after an attempt that may
have run is "outcome unknown: the tool may or may not have run"; before any attempt could have
run it is "the tool did not run". A call whose arguments are not a JSON object gets no effect
and an error message. The gateway's tools speak through the same messages.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oncewire.core.errors import OncewireError, WrongType
from oncewire.ledger import Ledger, LedgerTransaction
from oncewire.storage.records import TERMINAL_STATES, Effect, EffectState

__all__ = [
    "UNKNOWN_OUTCOME",
    "AcceptedCall",
    "ToolCallPending",
    "accept_in_tx",
    "call",
    "effect_content",
    "parse_arguments",
    "results",
    "settled",
    "tool_call_key",
    "tool_content",
]

UNKNOWN_OUTCOME = "outcome unknown: the tool may or may not have run; do not assume either"


class ToolCallPending(OncewireError):
    """A tool call's effect did not end within the wait; it may still run."""

    code = "tool_call_pending"

    def __init__(self, key: str, state: EffectState) -> None:
        super().__init__(
            f"the effect {key!r} of a tool call is still {state} after the wait; it may still run",
            key=key,
            state=str(state),
        )
        self.key = key
        self.state = state


@dataclass(frozen=True, slots=True)
class AcceptedCall:
    """One tool call of a response: its id, its effect key, and its effect (None when its
    arguments were refused, ``problem`` says why)."""

    tool_call_id: str
    key: str
    effect: Effect | None
    problem: str | None = None


def tool_call_key(turn: str, tool_call_id: str) -> str:
    """The effect key of call ``tool_call_id`` in ``turn``: stable, so a retry finds it."""
    return f"{turn}/{tool_call_id}"


_CALL = "a tool call (an object with .id and .function, or its dict form)"


def _parts(tool_call: Any, index: int) -> tuple[str, str, str]:
    """(id, name, arguments text) of an OpenAI SDK tool call object or its dict form; a
    :class:`WrongType` naming ``tool_calls[index]`` for anything else."""
    where = f"accept_in_tx: tool_calls[{index}]"
    if isinstance(tool_call, Mapping):
        function = tool_call.get("function") or {}
        if not isinstance(function, Mapping):
            raise WrongType(
                f"{where}.function must be an object with name and arguments, "
                f"not a {type(function).__name__}"
            )
        return (
            str(tool_call.get("id") or ""),
            str(function.get("name") or ""),
            str(function.get("arguments") or ""),
        )
    function = getattr(tool_call, "function", None)
    if function is None or isinstance(tool_call, str | bytes) or not hasattr(tool_call, "id"):
        raise WrongType(f"{where} is a {type(tool_call).__name__}, not {_CALL}")
    if not (hasattr(function, "name") and hasattr(function, "arguments")):
        raise WrongType(
            f"{where}.function must have name and arguments, not be a {type(function).__name__}"
        )
    return str(tool_call.id or ""), str(function.name or ""), str(function.arguments or "")


def _all_parts(tx: Any, tool_calls: Any) -> list[tuple[str, str, str]]:
    """Every call's parts, read before any is accepted: a mistake stores nothing."""
    if not isinstance(tx, LedgerTransaction):
        raise WrongType(
            "accept_in_tx takes the LedgerTransaction of `with ledger.transaction() as tx`, "
            f"not a {type(tx).__name__}"
        )
    if isinstance(tool_calls, Mapping | str | bytes) or not isinstance(tool_calls, Iterable):
        hint = ""
        if isinstance(tool_calls, Mapping):
            hint = (
                '; pass message["tool_calls"]'
                if "tool_calls" in tool_calls
                else "; for one call, pass [call]"
            )
        raise WrongType(
            "accept_in_tx takes the list of a response's tool calls (message.tool_calls, or "
            f"their dict form), not a {type(tool_calls).__name__}{hint}"
        )
    return [_parts(tool_call, index) for index, tool_call in enumerate(tool_calls)]


def parse_arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    """The call's arguments as an object, or why they are not one."""
    if not raw.strip():
        return {}, None  # some models send nothing for a call without parameters
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return {}, f"the arguments are not valid JSON: {exc}"
    if not isinstance(value, dict):
        return {}, f"the arguments must be a JSON object, not {type(value).__name__}"
    return value, None


def tool_content(status: str, result: Any) -> str:
    """A resolved call's result as the tool message's content (``succeeded`` or not)."""
    if status == "succeeded":
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    error = result.get("error") if isinstance(result, dict) else None
    return f"error: {error if error is not None else json.dumps(result)}"


def effect_content(effect: Effect) -> str:
    """What the model is told of a terminal tool-call effect (see the module docstring)."""
    if effect.state is EffectState.DONE:
        result = None if effect.result_json is None else json.loads(effect.result_json)
        return tool_content("succeeded", result)
    if effect.state is EffectState.REJECTED:
        reason = effect.last_error or "no reason"
        return tool_content("failed", {"error": f"the tool refused the call: {reason}"})
    if effect.maybe_sent:
        return f"{UNKNOWN_OUTCOME} ({effect.last_error or effect.state})"
    return tool_content("not_run", {"error": f"the tool did not run: {effect.last_error}"})


def _default_kind(name: str) -> str:
    return f"tool.{name}"


def accept_in_tx(
    tx: LedgerTransaction,
    turn: str,
    tool_calls: Iterable[Any],
    *,
    kind: Callable[[str], str] = _default_kind,
    max_attempts: int = 3,
) -> list[AcceptedCall]:
    """Accept one effect per tool call in the caller's transaction ``tx``: key
    ``{turn}/{tool_call.id}``, kind ``kind(name)`` (``tool.{name}``), the arguments object as
    payload. A call whose arguments are not a JSON object, or without an id, gets no effect.
    The same turn accepted again finds the same effects (``PayloadConflict`` if a call's
    arguments changed under its id). Anything that is not a list of tool calls is a
    ``WrongType`` (a ``TypeError``), raised before any effect is accepted."""
    accepted: list[AcceptedCall] = []
    for call_id, name, raw in _all_parts(tx, tool_calls):
        key = tool_call_key(turn, call_id)
        arguments, problem = parse_arguments(raw)
        if not call_id:
            problem = "the tool call has no id"
        elif not name:
            problem = "the tool call names no function"
        if problem is not None:
            accepted.append(AcceptedCall(call_id, key, None, problem))
            continue
        effect = tx.accept(key, kind(name), arguments, max_attempts=max_attempts)
        accepted.append(AcceptedCall(call_id, key, effect))
    return accepted


def _wait(
    ledger: Ledger, key: str, deadline: float | None, poll_seconds: float, changed: threading.Event
) -> Effect:
    effect = ledger.effects.get(key)
    while effect.state not in TERMINAL_STATES:
        timeout = poll_seconds
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ToolCallPending(key, effect.state)
            timeout = min(timeout, left)
        changed.wait(timeout)
        changed.clear()
        effect = ledger.effects.get(key)
    return effect


def settled(
    ledger: Ledger,
    accepted: Sequence[AcceptedCall],
    *,
    wait_seconds: float | None = None,
    poll_seconds: float = 0.1,
    subscribe: Callable[[Callable[[], None]], Callable[[], None]] | None = None,
) -> list[Effect | None]:
    """Each call's effect once it has ended, in order, read from the store (whichever process
    ran it); None for a call that got no effect. Waits at most ``wait_seconds`` in all (None:
    until they end), then :class:`ToolCallPending`.

    The store wakes the wait when something commits where the backend can tell (SQLite: any
    commit to the file, within milliseconds), and so does ``subscribe`` when given (another
    source of wake-ups, such as a dispatcher of this process saying it recorded outcomes: it
    takes a callable and returns its stopper); ``poll_seconds`` is the longest it sleeps
    without being woken."""
    deadline = None if wait_seconds is None else time.monotonic() + wait_seconds
    effects: list[Effect | None] = []
    changed = threading.Event()
    stoppers: list[Callable[[], None]] = []
    try:
        for item in accepted:
            if item.effect is None:
                effects.append(None)
                continue
            if not stoppers and item.effect.state not in TERMINAL_STATES:
                stoppers.append(ledger.store.subscribe_settled(changed.set))
                if subscribe is not None:
                    stoppers.append(subscribe(changed.set))
            effects.append(_wait(ledger, item.key, deadline, poll_seconds, changed))
    finally:
        for stop in stoppers:
            stop()
    return effects


def results(
    ledger: Ledger,
    accepted: Sequence[AcceptedCall],
    *,
    wait_seconds: float | None = None,
    poll_seconds: float = 0.1,
) -> list[dict[str, Any]]:
    """One ``{"role": "tool", "tool_call_id", "content"}`` message per call, in order, once
    each effect has ended (:func:`settled`, which says how it waits): the effect's
    :func:`effect_content`, or the error of a call that got no effect."""
    effects = settled(ledger, accepted, wait_seconds=wait_seconds, poll_seconds=poll_seconds)
    messages: list[dict[str, Any]] = []
    for item, effect in zip(accepted, effects, strict=True):
        if effect is None:
            content = tool_content("failed", {"error": item.problem})
        else:
            content = effect_content(effect)
        messages.append({"role": "tool", "tool_call_id": item.tool_call_id, "content": content})
    return messages


def call(
    ledger: Ledger,
    turn: str,
    tool_calls: Iterable[Any],
    *,
    kind: Callable[[str], str] = _default_kind,
    max_attempts: int = 3,
    wait_seconds: float | None = None,
    poll_seconds: float = 0.1,
) -> list[dict[str, Any]]:
    """:func:`accept_in_tx` in a transaction of its own, then :func:`results`."""
    with ledger.transaction() as tx:
        accepted = accept_in_tx(tx, turn, tool_calls, kind=kind, max_attempts=max_attempts)
    return results(ledger, accepted, wait_seconds=wait_seconds, poll_seconds=poll_seconds)
