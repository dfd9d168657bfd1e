"""What a durable tool answered, as the JSON an effect stores, and back as LangGraph outputs.

A tool run by :class:`~oncewire.langgraph.DurableToolNode` answers what a ``ToolNode`` tool
answers: a ``ToolMessage``, a ``Command``, or a list of them. The effect's result is that
answer as JSON (:func:`encode`), so that whichever process ran the tool, a resumed node reads
the same answer back (:func:`decode`) instead of running the tool again:

* a message is ``langchain_core``'s ``message_to_dict`` form; an artifact JSON cannot hold is
  left out and the message says so in ``response_metadata["oncewire"]``;
* a ``Command`` keeps ``graph`` (only the current graph or ``Command.PARENT``), ``update`` (a
  dict whose ``messages`` are messages and whose other values are JSON, or a list of
  messages), ``goto`` (node names and ``Send`` with a JSON argument) and ``resume`` (JSON);
* an answer that cannot be kept (a ``Command`` with something else in it, a return value that
  is neither) is stored as ``unusable`` with why: the tool **ran**, so the effect is ``done``,
  and the model is told the tool ran but its answer could not be used.

:func:`render` turns one call's ended effect into what the node returns for it, through the
same table as :mod:`oncewire.toolcalls` for everything that is not ``done``.
"""

from __future__ import annotations

import json
from typing import Any

from oncewire.core.extras import refusal

try:
    from langchain_core.messages import (
        BaseMessage,
        ToolMessage,
        convert_to_messages,
        message_to_dict,
        messages_from_dict,
    )
    from langgraph.types import Command, Send
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("langgraph", "oncewire.langgraph", exc) from exc

from oncewire.core.canonical import canonical_json
from oncewire.storage.records import Effect, EffectState
from oncewire.toolcalls import effect_content, tool_content

__all__ = ["FORMAT", "Output", "decode", "encode", "error_message", "render", "unusable"]

FORMAT = "oncewire.langgraph/1"  # the marker of a result this module wrote

Output = ToolMessage | Command[Any] | list[ToolMessage | Command[Any]]


class _Unkeepable(ValueError):
    """Part of an answer that JSON cannot hold."""


def _json(value: Any, what: str) -> Any:
    try:
        canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise _Unkeepable(f"{what} is not JSON: {exc}") from None
    return value


def _message(message: BaseMessage) -> dict[str, Any]:
    data = message_to_dict(message)
    try:
        return dict(_json(data, "the message"))
    except _Unkeepable as exc:
        artifact = data["data"].get("artifact")
        if artifact is None:
            raise
        data["data"]["artifact"] = None
        metadata = dict(data["data"].get("response_metadata") or {})
        metadata["oncewire"] = {"artifact_not_stored": str(exc)}
        data["data"]["response_metadata"] = metadata
        return dict(_json(data, "the message without its artifact"))


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list | tuple):
        value = [value]
    return [_message(message) for message in convert_to_messages(value)]


def _goto(goto: Any) -> list[Any]:
    items = goto if isinstance(goto, list | tuple) else [goto]
    encoded: list[Any] = []
    for item in items:
        if isinstance(item, str):
            encoded.append(item)
        elif isinstance(item, Send):
            encoded.append({"send": item.node, "arg": _json(item.arg, "a Send's argument")})
        else:
            raise _Unkeepable(f"a Command's goto holds a {type(item).__name__}")
    return encoded


def _command(command: Command[Any], messages_key: str) -> dict[str, Any]:
    if command.graph not in (None, Command.PARENT):
        raise _Unkeepable("a Command for a graph other than this one or its parent")
    update: Any = command.update
    if isinstance(update, dict):
        update = {
            key: _messages(value) if key == messages_key else _json(value, f"update[{key!r}]")
            for key, value in update.items()
        }
        update = {"dict": update}
    elif isinstance(update, list | tuple):
        update = {"list": _messages(update)}
    elif update is not None:
        raise _Unkeepable(f"a Command's update is a {type(update).__name__}")
    return {
        "graph": "parent" if command.graph == Command.PARENT else None,
        "update": update,
        "goto": _goto(command.goto),
        "resume": _json(command.resume, "a Command's resume"),
    }


def encode(output: Output, messages_key: str) -> dict[str, Any]:
    """The effect result for a tool's normalised answer (see the module docstring)."""
    items = output if isinstance(output, list) else [output]
    try:
        encoded = [
            {"message": _message(item)}
            if isinstance(item, ToolMessage)
            else {"command": _command(item, messages_key)}
            for item in items
        ]
    except _Unkeepable as exc:
        return unusable(f"the tool's answer cannot be stored: {exc}")
    return {"format": FORMAT, "list": isinstance(output, list), "outputs": encoded}


def unusable(why: str) -> dict[str, Any]:
    """The result of a tool that ran but whose answer cannot be given back."""
    return {"format": FORMAT, "unusable": why}


def _decode_messages(items: list[dict[str, Any]]) -> list[BaseMessage]:
    return list(messages_from_dict(items))


def _decode_command(data: dict[str, Any], messages_key: str) -> Command[Any]:
    update = data.get("update")
    if isinstance(update, dict) and "dict" in update:
        update = {
            key: _decode_messages(value) if key == messages_key else value
            for key, value in update["dict"].items()
        }
    elif isinstance(update, dict) and "list" in update:
        update = _decode_messages(update["list"])
    goto = [
        item if isinstance(item, str) else Send(item["send"], item["arg"])
        for item in data.get("goto") or []
    ]
    return Command(
        graph=Command.PARENT if data.get("graph") == "parent" else None,
        update=update,
        goto=goto,
        resume=data.get("resume"),
    )


def decode(result: Any, messages_key: str, call: dict[str, Any]) -> Output | None:
    """The node's output for a stored result, or None when this module did not write it."""
    if not isinstance(result, dict) or result.get("format") != FORMAT:
        return None
    if "unusable" in result:
        return error_message(call, f"error: the tool ran, but {result['unusable']}")
    outputs: list[ToolMessage | Command[Any]] = []
    for item in result.get("outputs") or []:
        if "message" in item:
            message = _decode_messages([item["message"]])[0]
            if isinstance(message, ToolMessage):
                outputs.append(message)
        else:
            outputs.append(_decode_command(item["command"], messages_key))
    if result.get("list"):
        return outputs
    return outputs[0] if len(outputs) == 1 else outputs


def error_message(call: dict[str, Any], content: str) -> ToolMessage:
    """A ``status="error"`` tool message for ``call``."""
    return ToolMessage(
        content=content, name=call.get("name"), tool_call_id=call.get("id") or "", status="error"
    )


def render(
    call: dict[str, Any], effect: Effect | None, problem: str | None, messages_key: str
) -> Output:
    """What the node returns for ``call`` once its effect ended (or for a call that got no
    effect, ``problem`` saying why): a ``done`` effect's stored answer, everything else the
    :mod:`oncewire.toolcalls` table as an error message."""
    if effect is None:
        return error_message(call, tool_content("failed", {"error": problem}))
    if effect.state is EffectState.DONE:
        if effect.result_json is None and effect.last_error:
            return error_message(call, f"error: the tool ran, but {effect.last_error}")
        result = None if effect.result_json is None else json.loads(effect.result_json)
        decoded = decode(result, messages_key, call)
        if decoded is not None:
            return decoded
        # Done by a sink that is not this node's (or its result was not stored): what it said.
        return ToolMessage(
            content=effect_content(effect), name=call.get("name"), tool_call_id=call.get("id")
        )
    return error_message(call, effect_content(effect))
