"""The tool registry: what the model is offered, the dispatcher's sinks, and a clear
ConfigurationError naming the tool for every sink or schema that cannot be used (so that
``oncewire gateway run`` refuses the configuration at start, exit 2, instead of failing a turn)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oncewire import Attempt
from oncewire.core.errors import ConfigurationError
from oncewire.gateway.config import ToolConfig, load_config
from oncewire.gateway.model_results import ToolCall
from oncewire.gateway.tools import (
    Tool,
    ToolRegistry,
    assistant_message,
    call_from_record,
    load_sink,
    parse_arguments,
    recorded_calls,
    tool_content,
)
from tests.conftest import _child_env


def echo(attempt: Attempt) -> Any:
    return attempt.payload


NOT_CALLABLE = 42


def config(name: str, sink: str, schema_file: Path | None = None) -> ToolConfig:
    return ToolConfig(
        name=name, sink=sink, schema_file=schema_file, side_effect="read_only", timeout_seconds=5
    )


def test_registered_tools_are_offered_in_order_with_their_schema_and_kind() -> None:
    registry = ToolRegistry()
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    registry.register("search", echo, schema, side_effect="read_only", description="Look up.")
    registry.register("ping", echo)
    assert registry.names() == ["search", "ping"]
    assert registry.specs() == [
        {
            "type": "function",
            "function": {"name": "search", "parameters": schema, "description": "Look up."},
        },
        {
            "type": "function",
            "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}},
        },
    ]
    assert registry.sinks() == {"tool.search": echo, "tool.ping": echo}
    assert registry.attempt_timeouts() == {"tool.search": 30.0, "tool.ping": 30.0}
    tool = registry.get("ping")
    assert isinstance(tool, Tool) and tool.side_effect == "unknown" and tool.max_attempts == 3
    assert registry.get("nope") is None and "search" in registry and len(registry) == 2


@pytest.mark.parametrize(
    ("name", "fn", "schema", "options", "message"),
    [
        ("bad name!", echo, None, {}, "1 to 64 letters"),
        ("t", NOT_CALLABLE, None, {}, "is not callable"),
        ("t", echo, {"type": "array"}, {}, '"type": "object"'),
        ("t", echo, None, {"side_effect": "sometimes"}, "side_effect must be one of"),
        ("t", echo, None, {"timeout_seconds": 0}, "timeout_seconds must be positive"),
        ("t", echo, None, {"max_attempts": 0}, "max_attempts must be at least 1"),
    ],
)
def test_a_tool_that_cannot_be_offered_is_refused(
    name: str, fn: Any, schema: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match="tool") as caught:
        ToolRegistry().register(name, fn, schema, **options)
    assert message in str(caught.value)


def test_a_name_registered_twice_is_refused() -> None:
    registry = ToolRegistry()
    registry.register("t", echo)
    with pytest.raises(ConfigurationError, match="'t' is registered twice"):
        registry.register("t", echo)


def test_config_tools_import_their_sink_and_read_their_schema(tmp_path: Path) -> None:
    schema = tmp_path / "echo.json"
    schema.write_text(
        json.dumps({"type": "object", "description": "Say it back.", "properties": {}}),
        encoding="utf-8",
    )
    registry = ToolRegistry.from_config([config("echo", f"{__name__}:echo", schema)])
    (spec,) = registry.specs()
    assert spec["function"]["description"] == "Say it back."
    assert registry.sinks() == {"tool.echo": echo}


@pytest.mark.parametrize(
    ("sink", "message"),
    [
        ("no_such_module_for_tools:run", "cannot import no_such_module_for_tools"),
        (f"{__name__}:missing", f"{__name__} has no missing"),
        (f"{__name__}:NOT_CALLABLE", "NOT_CALLABLE is not callable"),
        ("nocolon", "must look like module:callable"),
    ],
)
def test_a_sink_that_cannot_be_imported_or_called_names_the_tool(sink: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_sink(sink, tool="lookup")
    assert "tool 'lookup'" in str(caught.value) and message in str(caught.value)


def test_a_schema_file_that_is_not_a_json_object_names_the_tool(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2", encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"tool 'echo': schema_file .* is not JSON"):
        ToolRegistry.from_config([config("echo", f"{__name__}:echo", bad)])
    bad.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"tool 'echo': schema_file .* is not an object"):
        ToolRegistry.from_config([config("echo", f"{__name__}:echo", bad)])


def test_tool_keys_in_gateway_toml(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        """
[model]
base_url = "http://127.0.0.1:9/v1"

[[platforms]]
name = "tg"
kind = "telegram"

[[tools]]
name = "lookup"
sink = "mytools:lookup"
side_effect = "read_only"
timeout_seconds = 7
max_attempts = 5
""",
        encoding="utf-8",
    )
    (tool,) = load_config(path).tools
    assert (tool.name, tool.sink, tool.side_effect) == ("lookup", "mytools:lookup", "read_only")
    assert (tool.timeout_seconds, tool.max_attempts) == (7.0, 5)


def test_gateway_run_refuses_a_tool_whose_sink_cannot_be_imported(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        """
[store]
db = "gateway.db"

[model]
base_url = "http://127.0.0.1:9/v1"
api_key_env = ""

[[platforms]]
name = "tg"
kind = "telegram"
api_base = "http://127.0.0.1:9"

[[tools]]
name = "lookup"
sink = "no_such_module_for_tools:lookup"
""",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "-m", "oncewire", "gateway", "run", "--config", str(path)],
        env=_child_env(TELEGRAM_BOT_TOKEN="123456:" + "A" * 35),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "tool 'lookup'" in done.stderr and "no_such_module_for_tools" in done.stderr
    assert done.stdout == ""  # never ready
    assert not (tmp_path / "gateway.db").exists()  # refused before the store was opened


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"a": 1}', ({"a": 1}, None)),
        ("", ({}, None)),
        ("  ", ({}, None)),
        ("[1]", ({}, "the arguments must be a JSON object, not list")),
        ('"text"', ({}, "the arguments must be a JSON object, not str")),
    ],
)
def test_call_arguments_are_an_object_or_a_reason(raw: str, expected: Any) -> None:
    assert parse_arguments(raw) == expected


def test_invalid_json_arguments_say_so() -> None:
    value, problem = parse_arguments('{"a": ')
    assert value == {} and problem is not None
    assert problem.startswith("the arguments are not valid JSON")


def test_recorded_calls_keep_the_model_text_and_make_ids_distinct() -> None:
    calls = (
        ToolCall(0, "call_a", "add", '{"a":1}'),
        ToolCall(1, "call_a", "add", "{}"),
        ToolCall(2, "", "", "not json"),
    )
    recorded = recorded_calls(calls, 3)
    assert recorded == [
        {"id": "call_a", "name": "add", "arguments": '{"a":1}'},
        {"id": "call_s3_1", "name": "add", "arguments": "{}"},
        {"id": "call_s3_2", "name": "(unnamed)", "arguments": "not json"},
    ]
    assert [call_from_record(r) for r in recorded] == recorded
    message = assistant_message("", recorded)
    assert message["content"] is None
    assert message["tool_calls"][0] == {
        "id": "call_a",
        "type": "function",
        "function": {"name": "add", "arguments": '{"a":1}'},
    }


def test_tool_content_shows_a_result_or_an_error() -> None:
    assert tool_content("succeeded", "plain text") == "plain text"
    assert tool_content("succeeded", {"sum": 3}) == '{"sum": 3}'
    assert tool_content("succeeded", None) == "null"
    assert tool_content("failed", {"error": "no such tool"}) == "error: no such tool"
    assert tool_content("not_run", [1]) == "error: [1]"
