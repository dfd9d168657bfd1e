"""A model response and a tool's answer as the JSON the store holds, and back.

A :class:`~agents.items.ModelResponse` is written whole (:func:`encode_response`): each output
item as its Responses API JSON (pydantic's ``model_dump(mode="json")``, read back through the
output item union), the :class:`~agents.usage.Usage` through the SDK's own
``serialize_usage`` / ``deserialize_usage``, ``response_id``, ``request_id`` and
``raw_usage``. :func:`decode_response` gives the SDK an equal object.

What a step answered is kept beside it as a digest (:class:`Request`): the agent's name, its
instructions, the input items and the names of the tools it was offered, so that a resumed run
asking anything else is refused rather than given an answer to another question.

A replayed step of a streamed run is one ``response.completed`` event carrying the recorded
response (:func:`replay_events`): no ``response.created``, no text or argument deltas, so a
consumer sees the step's items once, complete, as the SDK's run item events.

A tool's answer is kept as what the model is shown (:func:`encode_output`): a string as itself,
a JSON value (or the answer of a tool with an output schema) as JSON, the SDK's structured
outputs (text, image, file) in their JSON form, anything else as ``str(answer)``, which is what
the SDK would send the model for it. The run is given the decoded answer whether the tool ran
in this process or another, so a resumed run and an uninterrupted one see the same.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from oncewire.core.extras import refusal

try:
    from agents.items import ItemHelpers, ModelResponse
    from agents.tool import FunctionTool
    from agents.usage import Usage, deserialize_usage, serialize_usage
    from openai.types.responses import (
        Response,
        ResponseCompletedEvent,
        ResponseOutputItem,
        ResponseUsage,
    )
    from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
    from pydantic import BaseModel, TypeAdapter
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("agents", "oncewire.agents", exc) from exc

__all__ = [
    "DIGEST_PREFIX",
    "FORMAT",
    "Request",
    "decode_output",
    "decode_response",
    "encode_output",
    "encode_response",
    "replay_events",
    "request_digest",
    "tool_names",
]

FORMAT = "oncewire.agents/1"  # the marker of what this module wrote
DIGEST_PREFIX = "2:"  # request digests that cover the agent and its tools' names

_ITEM = TypeAdapter(ResponseOutputItem)
_ANY: TypeAdapter[Any] = TypeAdapter(Any)


def _item_json(item: Any) -> Any:
    if isinstance(item, BaseModel):
        return item.model_dump(mode="json", exclude_unset=True)
    return _ANY.dump_python(item, mode="json")


def encode_response(response: ModelResponse) -> str:
    """The stored form of ``response`` (see the module docstring)."""
    return json.dumps(
        {
            "format": FORMAT,
            "output": [_item_json(item) for item in response.output],
            "usage": serialize_usage(response.usage),
            "response_id": response.response_id,
            "request_id": response.request_id,
            "raw_usage": response.raw_usage,
        },
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
    )


def decode_response(text: str) -> ModelResponse:
    """The :class:`ModelResponse` that :func:`encode_response` wrote."""
    data = json.loads(text)
    return ModelResponse(
        output=[_ITEM.validate_python(item) for item in data["output"]],
        usage=deserialize_usage(data["usage"]),
        response_id=data.get("response_id"),
        request_id=data.get("request_id"),
        raw_usage=data.get("raw_usage"),
    )


def _sha256(material: dict[str, Any]) -> str:
    text = json.dumps(material, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def request_digest(
    agent: str,
    system_instructions: str | None,
    input: Any,
    tool_names: list[str],
) -> str:
    """What a model call asked, as the store keeps it: ``2:`` and the sha256 of the agent's
    name, its instructions, the input items and the names of the tools it was offered
    (function, hosted and handoff tools, sorted), as JSON."""
    material = {
        "agent": agent,
        "instructions": system_instructions,
        "input": _ANY.dump_python(input, mode="json"),
        "tools": sorted(tool_names),
    }
    return DIGEST_PREFIX + _sha256(material)


def _first_digest(system_instructions: str | None, input: Any) -> str:
    """The digest the first format of step records kept: instructions and input only."""
    return _sha256(
        {"instructions": system_instructions, "input": _ANY.dump_python(input, mode="json")}
    )


def tool_names(tools: list[Any], handoffs: list[Any]) -> list[str]:
    """The names a model call offers its model: each tool's, and each handoff's tool name."""
    names = [str(getattr(tool, "name", type(tool).__name__)) for tool in tools]
    return names + [str(getattr(handoff, "tool_name", handoff)) for handoff in handoffs]


class Request:
    """One model call's request, as a recorded step is checked against it."""

    def __init__(
        self,
        agent: str,
        system_instructions: str | None,
        input: Any,
        tools: list[Any],
        handoffs: list[Any],
    ) -> None:
        self.system_instructions = system_instructions
        self.input = input
        self.digest = request_digest(agent, system_instructions, input, tool_names(tools, handoffs))

    def answered_by(self, stored_digest: str) -> bool:
        """Whether a step recorded with ``stored_digest`` answered this request. A step
        recorded in the first format (a bare sha256) is checked on what that format kept:
        the instructions and the input items."""
        if stored_digest.startswith(DIGEST_PREFIX):
            return stored_digest == self.digest
        return stored_digest == _first_digest(self.system_instructions, self.input)


def _response_usage(usage: Usage) -> ResponseUsage:
    response_usage = ResponseUsage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        total_tokens=usage.total_tokens,
        input_tokens_details=InputTokensDetails.model_validate(
            {
                "cached_tokens": getattr(usage.input_tokens_details, "cached_tokens", 0) or 0,
                "cache_write_tokens": getattr(usage.input_tokens_details, "cache_write_tokens", 0)
                or 0,
            }
        ),
        output_tokens_details=OutputTokensDetails(
            reasoning_tokens=getattr(usage.output_tokens_details, "reasoning_tokens", 0) or 0
        ),
    )
    # The SDK reads an exact Usage back from this (agents.usage._response_usage_to_usage), so
    # the replayed step counts what the recorded one did, requests and per-request entries too.
    from agents import usage as sdk_usage

    attach = getattr(sdk_usage, "_attach_normalized_usage", None)
    if attach is not None:
        attach(response_usage, usage)
    return response_usage


def replay_events(response: ModelResponse, model: str = "oncewire-replay") -> list[Any]:
    """The stream of a recorded step: one ``response.completed`` with the whole response."""
    replayed = Response(
        id=response.response_id or "oncewire-replay",
        created_at=0,
        model=model,
        object="response",
        output=list(response.output),
        tool_choice="auto",
        tools=[],
        top_p=None,
        parallel_tool_calls=True,
        status="completed",
        usage=_response_usage(response.usage),
    )
    if response.response_id is None:
        object.__setattr__(replayed, "id", None)
    if response.request_id is not None:
        replayed._request_id = response.request_id
    return [ResponseCompletedEvent(type="response.completed", response=replayed, sequence_number=0)]


def completed_response(event: ResponseCompletedEvent, streamed_items: list[Any]) -> ModelResponse:
    """The ModelResponse the SDK builds from a stream's completed event (as its run loop does)."""
    from agents.usage import _response_usage_to_usage

    terminal = event.response
    output = list(terminal.output) if terminal.output else list(streamed_items)
    usage = _response_usage_to_usage(terminal.usage) if terminal.usage else Usage(requests=1)
    return ModelResponse(
        output=output,
        usage=usage,
        response_id=terminal.id,
        request_id=getattr(terminal, "_request_id", None),
    )


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def encode_output(tool: FunctionTool, value: Any) -> dict[str, Any]:
    """The effect result of a tool's answer (see the module docstring)."""
    if isinstance(value, str):
        return {"format": FORMAT, "str": value}
    if tool.output_json_schema is not None or isinstance(value, dict | list | int | float | bool):
        dumped = _ANY.dump_python(value, mode="json")
        if _is_json(dumped):
            return {"format": FORMAT, "json": dumped}
    if value is None:
        return {"format": FORMAT, "json": None}
    structured = ItemHelpers._convert_tool_output_as_structured(value)
    if structured is not None:
        dumped = _ANY.dump_python(structured, mode="json")
        if _is_json(dumped):
            return {"format": FORMAT, "json": dumped}
    return {"format": FORMAT, "str": str(value)}


def decode_output(result: Any) -> tuple[bool, Any]:
    """(whether this module wrote ``result``, the tool's answer)."""
    if not isinstance(result, dict) or result.get("format") != FORMAT:
        return False, None
    if "str" in result:
        return True, str(result["str"])
    return True, result.get("json")
