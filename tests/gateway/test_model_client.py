"""The model client against the fake OpenAI-compatible server on real loopback HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncewire.core.errors import ConfigurationError
from oncewire.gateway.config import parse_config
from oncewire.gateway.http import Timeouts
from oncewire.gateway.model import (
    Delta,
    Interrupt,
    ModelBroken,
    ModelInterrupted,
    ModelNotSent,
    ModelRateLimited,
    ModelRejected,
    ModelUnavailable,
    OpenAIChatClient,
)
from tests.gateway.conftest import FakeOpenAI

Start = Callable[[Any], FakeOpenAI]
HELLO = [{"role": "user", "content": "hello"}]
SHELL = {
    "type": "function",
    "function": {
        "name": "terminal",
        "description": "run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


def client_for(fake: FakeOpenAI, **kwargs: Any) -> OpenAIChatClient:
    kwargs.setdefault("timeouts", Timeouts(connect_seconds=5, read_seconds=10))
    return OpenAIChatClient(fake.base_url, "fake-model", **kwargs)


def test_a_text_stream_arrives_as_deltas_and_completes(fake_openai: Start) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    usage = {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}
    fake = fake_openai([{"kind": "text", "text": text, "chunk_chars": 5, "usage": usage}])
    deltas: list[Delta] = []

    response = client_for(fake).complete(HELLO, on_delta=deltas.append)

    assert response.text == text
    assert [d.text for d in deltas] == [text[i : i + 5] for i in range(0, len(text), 5)]
    assert response.finish_reason == "stop"
    assert response.tool_calls == ()
    assert (response.usage.prompt_tokens, response.usage.total_tokens) == (12, 21)  # type: ignore[union-attr]
    assert response.completion_id == "chatcmpl-fake-1"
    assert response.request_id == "req-1"


def test_reasoning_content_is_kept_apart_from_the_answer(fake_openai: Start) -> None:
    fake = fake_openai([{"kind": "text", "text": "42", "reasoning": "six times seven"}])
    deltas: list[Delta] = []

    response = client_for(fake).complete(HELLO, on_delta=deltas.append)

    assert (response.text, response.reasoning) == ("42", "six times seven")
    assert "".join(d.reasoning for d in deltas) == "six times seven"


def test_parallel_tool_calls_are_assembled_from_fragments(fake_openai: Start) -> None:
    calls = [
        {"name": "terminal", "args": {"command": "echo hi"}},
        {"name": "create_ticket", "args": {"title": "printer on fire", "priority": 1}},
    ]
    fake = fake_openai([{"kind": "tool_call", "calls": calls, "chunk_chars": 3}])

    response = client_for(fake).complete(HELLO, tools=[SHELL])

    assert response.finish_reason == "tool_calls"
    assert [(c.index, c.id, c.name) for c in response.tool_calls] == [
        (0, "call_0", "terminal"),
        (1, "call_1", "create_ticket"),
    ]
    assert [json.loads(c.arguments) for c in response.tool_calls] == [c["args"] for c in calls]


def test_tool_calls_tolerate_compatible_server_quirks(fake_openai: Start) -> None:
    # No index on the fragments, the arguments in one piece, "stop" said alongside tool calls,
    # and a final usage chunk whose choices are null.
    fake = fake_openai(
        [
            {
                "kind": "tool_call",
                "calls": [{"name": "a", "args": {"x": 1}}, {"name": "b", "args": {"y": [2]}}],
                "no_index": True,
                "chunk_chars": 0,
                "finish_reason": "stop",
                "usage_choices_null": True,
                "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
            }
        ]
    )

    response = client_for(fake).complete(HELLO)

    assert response.finish_reason == "stop"
    assert [(c.name, json.loads(c.arguments)) for c in response.tool_calls] == [
        ("a", {"x": 1}),
        ("b", {"y": [2]}),
    ]
    assert response.usage is not None and response.usage.total_tokens == 7


def test_a_json_completion_is_accepted_where_a_stream_was_asked_for(fake_openai: Start) -> None:
    completion = {
        "id": "cmpl-9",
        "choices": [{"index": 0, "message": {"content": "whole"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    fake = fake_openai(
        [
            {
                "kind": "raw",
                "headers": {"content-type": "application/json"},
                "body": json.dumps(completion),
            }
        ]
    )

    response = client_for(fake).complete(HELLO)

    assert (response.text, response.finish_reason, response.completion_id) == (
        "whole",
        "length",
        "cmpl-9",
    )


def test_the_request_is_what_the_server_journaled(fake_openai: Start) -> None:
    fake = fake_openai([{"kind": "text", "text": "ok"}])
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "run it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "a.txt"},
    ]
    client = client_for(fake, max_tokens=256, api_key_env="FAKE_KEY", environ={"FAKE_KEY": "k-1"})

    client.complete(messages, tools=[SHELL])

    (request,) = fake.requests()
    assert request["path"] == "/v1/chat/completions"
    assert request["body"] == {
        "model": "fake-model",
        "messages": messages,
        "tools": [SHELL],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 256,
    }
    assert request["authorization"] == "Bearer k-1"


def test_a_client_is_built_from_the_model_table_of_gateway_toml(fake_openai: Start) -> None:
    fake = fake_openai([{"kind": "text", "text": "configured"}])
    toml = (
        f'[model]\nbase_url = "{fake.base_url}"\napi_key_env = "FAKE_KEY"\nmodel = "m-1"\n'
        'read_timeout = 7\n[[platforms]]\nname = "tg"\nkind = "telegram"\n'
    )
    config = parse_config(toml, Path("gateway.toml"))

    with OpenAIChatClient.from_config(config.model, {"FAKE_KEY": "k-2"}) as client:
        assert client.complete(HELLO).text == "configured"

    (request,) = fake.requests()
    assert (request["body"]["model"], request["authorization"]) == ("m-1", "Bearer k-2")


def test_the_api_key_comes_from_the_environment_and_is_never_shown() -> None:
    client = OpenAIChatClient(
        "http://127.0.0.1:9/v1", "m", api_key_env="FAKE_KEY", environ={"FAKE_KEY": "sk-secret"}
    )
    assert "sk-secret" not in repr(client)
    with pytest.raises(ConfigurationError, match="FAKE_KEY"):
        OpenAIChatClient("http://127.0.0.1:9/v1", "m", api_key_env="FAKE_KEY", environ={})
    with pytest.raises(ConfigurationError, match="base_url"):
        OpenAIChatClient("127.0.0.1:9/v1", "m")


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry_after": 7}, 7.0),
        ({"retry_after_ms": 1500}, 1.5),
        ({"retry_after": 30, "retry_after_ms": 250}, 0.25),
        ({}, None),
    ],
)
def test_429_is_rate_limited_with_the_wait_the_server_asked_for(
    fake_openai: Start, headers: dict[str, int], seconds: float | None
) -> None:
    fake = fake_openai([{"kind": "error", "status": 429, **headers}])

    with pytest.raises(ModelRateLimited) as caught:
        client_for(fake).complete(HELLO)

    assert caught.value.retry_after_seconds == seconds
    assert caught.value.request_id == "req-1"


def test_4xx_is_rejected_and_5xx_408_409_unavailable(fake_openai: Start) -> None:
    too_long = {
        "error": {
            "message": "This model's maximum context length is 8192 tokens",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    expected = {400: ModelRejected, 401: ModelRejected, 404: ModelRejected, 422: ModelRejected}
    expected.update({500: ModelUnavailable, 503: ModelUnavailable})  # type: ignore[dict-item]
    expected.update({408: ModelUnavailable, 409: ModelUnavailable})  # type: ignore[dict-item]
    fake = fake_openai(
        [{"kind": "error", "status": status, "body": too_long} for status in expected]
    )
    client = client_for(fake)

    for status, failure in expected.items():
        with pytest.raises(failure) as caught:
            client.complete(HELLO)
        assert caught.value.fields["status"] == status
        assert "context_length_exceeded" in str(caught.value)


def test_a_redirect_is_rejected_not_followed(fake_openai: Start) -> None:
    fake = fake_openai([{"kind": "raw", "status": 301, "headers": {"location": "/elsewhere"}}])

    with pytest.raises(ModelRejected, match="HTTP 301"):
        client_for(fake).complete(HELLO)

    assert len(fake.requests()) == 1


def test_a_refused_connection_is_not_sent(closed_port: int) -> None:
    client = OpenAIChatClient(f"http://127.0.0.1:{closed_port}/v1", "m")

    with pytest.raises(ModelNotSent):
        client.complete(HELLO)


def test_a_stream_dropped_mid_answer_is_broken_not_an_answer(fake_openai: Start) -> None:
    fake = fake_openai([{"kind": "drop_mid_stream", "text": "The answer is 4", "after_chars": 12}])
    deltas: list[Delta] = []

    with pytest.raises(ModelBroken) as caught:
        client_for(fake).complete(HELLO, on_delta=deltas.append)

    # The preview saw the partial text; the call returned no answer built from it.
    assert "".join(d.text for d in deltas) == "The answer i"
    assert "12 characters" in str(caught.value)


def test_a_stream_that_stalls_is_broken_after_the_read_timeout(fake_openai: Start) -> None:
    fake = fake_openai([{"kind": "stall_mid_stream", "text": "Thinking about", "after_chars": 8}])
    client = client_for(fake, timeouts=Timeouts(read_seconds=0.3))

    with pytest.raises(ModelBroken, match="ReadTimeout"):
        client.complete(HELLO)


def test_an_error_mid_stream_is_broken(fake_openai: Start) -> None:
    fake = fake_openai([{"kind": "error_mid_stream", "text": "Partial", "after_chars": 4}])

    with pytest.raises(ModelBroken, match="mid-stream"):
        client_for(fake).complete(HELLO)


def test_a_body_that_is_not_an_event_stream_is_broken(fake_openai: Start) -> None:
    fake = fake_openai([{"kind": "raw", "body": "<html>gateway timeout</html>"}])

    with pytest.raises(ModelBroken):
        client_for(fake).complete(HELLO)


def test_interrupt_ends_a_server_that_never_answers(fake_openai: Start) -> None:
    fake = fake_openai([{"kind": "hang"}])
    # A read timeout far beyond the test's own timeout: only the interrupt can end this call.
    client = client_for(fake, timeouts=Timeouts(read_seconds=600))
    interrupt = Interrupt()
    timer = threading.Timer(0.2, interrupt.interrupt)
    timer.start()

    with pytest.raises(ModelInterrupted):
        client.complete(HELLO, interrupt=interrupt)
    timer.join()


def test_interrupt_ends_a_stalled_stream_from_another_thread(fake_openai: Start) -> None:
    fake = fake_openai([{"kind": "stall_mid_stream", "text": "Hello, wor", "after_chars": 5}])
    client = client_for(fake, timeouts=Timeouts(read_seconds=600))
    interrupt = Interrupt()
    threads: list[threading.Thread] = []

    def on_delta(delta: Delta) -> None:
        # Interrupt from elsewhere once the stream is flowing, as a new message would.
        if not threads:
            threads.append(threading.Thread(target=interrupt.interrupt))
            threads[0].start()

    with pytest.raises(ModelInterrupted):
        client.complete(HELLO, on_delta=on_delta, interrupt=interrupt)
    threads[0].join()


def test_an_interrupt_raised_before_the_call_sends_nothing(fake_openai: Start) -> None:
    fake = fake_openai([{"kind": "text", "text": "never"}])
    interrupt = Interrupt()
    interrupt.interrupt()

    with pytest.raises(ModelInterrupted):
        client_for(fake).complete(HELLO, interrupt=interrupt)

    assert fake.requests() == []
