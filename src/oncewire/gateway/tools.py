"""The tools a gateway's model may call: each one a name, a JSON schema and a dispatcher sink.

A tool call is an effect (the run ledger's ``propose_action(..., dispatch=...)``): the turn
accepts it into the outbox under ``turn/{inbound}/s{step}/{index}`` with the kind
:attr:`Tool.kind` (``tool.{name}``) and the call's arguments, a JSON object, as its payload; the
gateway's :class:`~oncewire.Dispatcher` runs the tool's sink. A sink is what any dispatcher
sink is: a callable taking an :class:`~oncewire.Attempt` (``attempt.payload`` is the
arguments) and answering ``Done``/``NotSent``/``MaybeSent``/``Rejected`` or a plain JSON value
(``Done``). A sink that raises may have done its work, so its effect is retried as a flagged
redelivery up to ``max_attempts``, then ``dead``: the model is told the outcome is unknown.

How a call's arguments are read and its result told to the model is :mod:`oncewire.toolcalls`'s,
shared with callers that run tool calls outside the gateway.

Tools come from ``[[tools]]`` (:meth:`ToolRegistry.from_config`: the sink is imported from
``module:callable`` and the schema read from ``schema_file``) or from Python
(:meth:`ToolRegistry.register`).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncewire.core.errors import ConfigurationError
from oncewire.gateway.config import SIDE_EFFECTS, ToolConfig
from oncewire.gateway.model_results import ToolCall
from oncewire.toolcalls import parse_arguments, tool_content

__all__ = [
    "TOOL_KIND_PREFIX",
    "Tool",
    "ToolRegistry",
    "assistant_message",
    "call_from_record",
    "load_sink",
    "parse_arguments",
    "recorded_calls",
    "tool_content",
]

TOOL_KIND_PREFIX = "tool."
# The names OpenAI-compatible servers accept for a function.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tool:
    """One callable tool. ``parameters`` is the JSON schema of its arguments (an object);
    ``side_effect`` one of ``read_only``, ``workspace_write``, ``external``, ``unknown``
    (anything but ``read_only`` counts as world-changing in the run ledger)."""

    name: str
    sink: Any
    parameters: dict[str, Any] = field(default_factory=lambda: dict(_EMPTY_SCHEMA))
    description: str = ""
    side_effect: str = "unknown"
    timeout_seconds: float = 30.0
    max_attempts: int = 3

    @property
    def kind(self) -> str:
        """The outbox effect kind of this tool's calls."""
        return TOOL_KIND_PREFIX + self.name

    def spec(self) -> dict[str, Any]:
        """This tool as the model request's ``tools`` list names it."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


class ToolRegistry:
    """The tools a gateway offers, by name, in the order they were registered."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self._add(tool)

    @classmethod
    def from_config(cls, tools: Iterable[ToolConfig], *, origin: str = "[[tools]]") -> ToolRegistry:
        """The registry of ``[[tools]]``: each sink imported, each schema read. A sink that
        cannot be imported or is not callable, or a schema that is not a JSON object, is a
        :class:`ConfigurationError` naming the tool."""
        registry = cls()
        for config in tools:
            schema: Mapping[str, Any] = _EMPTY_SCHEMA
            if config.schema_file is not None:
                schema = _read_schema(config.name, config.schema_file, origin)
            description = schema.get("description", "")
            registry.register(
                config.name,
                load_sink(config.sink, tool=config.name, origin=origin),
                schema,
                side_effect=config.side_effect,
                description=description if isinstance(description, str) else "",
                timeout_seconds=config.timeout_seconds,
                max_attempts=config.max_attempts,
            )
        return registry

    def register(
        self,
        name: str,
        fn: Any,
        schema: Mapping[str, Any] | None = None,
        *,
        side_effect: str = "unknown",
        description: str = "",
        timeout_seconds: float = 30.0,
        max_attempts: int = 3,
    ) -> Tool:
        """Offer ``fn`` (a dispatcher sink: called with an Attempt whose payload is the
        arguments) as the tool ``name``; ``schema`` is the JSON schema of its arguments."""
        tool = Tool(
            name=name,
            sink=fn,
            parameters=dict(_EMPTY_SCHEMA if schema is None else schema),
            description=description,
            side_effect=side_effect,
            timeout_seconds=timeout_seconds,
            max_attempts=max_attempts,
        )
        self._add(tool)
        return tool

    def _add(self, tool: Tool) -> None:
        name = tool.name
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigurationError(
                f"tool name {name!r} must be 1 to 64 letters, digits, '_' or '-'"
            )
        if name in self._tools:
            raise ConfigurationError(f"tool {name!r} is registered twice")
        if not callable(tool.sink) and not callable(getattr(tool.sink, "call_batch", None)):
            raise ConfigurationError(f"tool {name!r}: its sink {tool.sink!r} is not callable")
        if not isinstance(tool.parameters, dict) or tool.parameters.get("type") != "object":
            raise ConfigurationError(
                f'tool {name!r}: its schema must be a JSON object schema ("type": "object")'
            )
        if tool.side_effect not in SIDE_EFFECTS:
            raise ConfigurationError(
                f"tool {name!r}: side_effect must be one of {', '.join(SIDE_EFFECTS)}, "
                f"not {tool.side_effect!r}"
            )
        if not (isinstance(tool.timeout_seconds, int | float) and tool.timeout_seconds > 0):
            raise ConfigurationError(f"tool {name!r}: timeout_seconds must be positive")
        if (
            not isinstance(tool.max_attempts, int)
            or isinstance(tool.max_attempts, bool)
            or tool.max_attempts < 1
        ):
            raise ConfigurationError(f"tool {name!r}: max_attempts must be at least 1")
        self._tools[name] = tool

    def __bool__(self) -> bool:
        return bool(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> list[dict[str, Any]]:
        """The model request's ``tools`` list: ``{"type": "function", "function": {...}}``."""
        return [tool.spec() for tool in self._tools.values()]

    def sinks(self) -> dict[str, Any]:
        """The dispatcher's sinks: effect kind -> sink."""
        return {tool.kind: tool.sink for tool in self._tools.values()}

    def attempt_timeouts(self) -> dict[str, float | None]:
        """Each kind's attempt timeout, for the dispatcher."""
        return {tool.kind: float(tool.timeout_seconds) for tool in self._tools.values()}


def load_sink(spec: str, *, tool: str, origin: str = "[[tools]]") -> Callable[..., Any]:
    """Import ``module:callable`` (dots after the colon reach attributes); a clear
    :class:`ConfigurationError` naming ``tool`` when it cannot be imported or called."""
    where = f"{origin}: tool {tool!r}: sink {spec!r}"
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"{where} must look like module:callable")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # an import runs arbitrary code: any failure is the config's
        raise ConfigurationError(f"{where}: cannot import {module_name}: {exc}") from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigurationError(f"{where}: {module_name} has no {attribute}") from None
    if not callable(target) and not callable(getattr(target, "call_batch", None)):
        raise ConfigurationError(f"{where}: {attribute} is not callable")
    return target  # type: ignore[no-any-return]


def _read_schema(name: str, path: Path, origin: str) -> dict[str, Any]:
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(
            f"{origin}: tool {name!r}: cannot read schema_file {path}: {exc.strerror or exc}"
        ) from exc
    except ValueError as exc:
        raise ConfigurationError(
            f"{origin}: tool {name!r}: schema_file {path} is not JSON: {exc}"
        ) from exc
    if not isinstance(schema, dict):
        raise ConfigurationError(f"{origin}: tool {name!r}: schema_file {path} is not an object")
    return schema


# -- the calls' wire shapes (pure: the turn records and replays them) ------------------------
def recorded_calls(calls: tuple[ToolCall, ...], step: int) -> list[dict[str, Any]]:
    """The step's calls as recorded: id (made up when missing or repeated: the ledger needs
    distinct ids), name, and the arguments exactly as the model wrote them."""
    seen: set[str] = set()
    recorded: list[dict[str, Any]] = []
    for index, call in enumerate(calls):
        call_id = call.id if call.id and call.id not in seen else f"call_s{step}_{index}"
        seen.add(call_id)
        name = call.name or "(unnamed)"
        recorded.append({"id": call_id, "name": name, "arguments": call.arguments})
    return recorded


def call_from_record(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A call as :func:`recorded_calls` wrote it into a step, read back from the run ledger."""
    return {
        "id": str(recorded["id"]),
        "name": str(recorded["name"]),
        "arguments": str(recorded.get("arguments", "")),
    }


def assistant_message(text: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat message of a step that asked for ``calls`` (recorded calls), as the model
    wrote it: each call's id, name and arguments text unchanged."""
    return {
        "role": "assistant",
        "content": text or None,
        "tool_calls": [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"]},
            }
            for call in calls
        ],
    }
