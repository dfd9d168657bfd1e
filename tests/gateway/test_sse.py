"""Reading a streamed chat completion: SSE framing and folding chunks into an answer (no I/O)."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from oncewire.gateway.http import iter_sse
from oncewire.gateway.model import Delta, ModelBroken, StreamAssembly


def sse_response(*pieces: bytes, content_type: str = "text/event-stream") -> httpx2.Response:
    request = httpx2.Request("POST", "http://model.test/v1/chat/completions")
    headers = {"content-type": content_type}
    return httpx2.Response(200, headers=headers, content=iter(pieces), request=request)


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> Any:
    choices = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    return {"id": "c-1", "choices": choices, **extra}


def fold(*chunks: Any) -> tuple[StreamAssembly, list[Delta]]:
    assembly = StreamAssembly(request_id="r-1")
    deltas = [d for c in chunks if (d := assembly.feed(c)) is not None]
    return assembly, deltas


def test_events_are_framed_across_arbitrary_byte_boundaries() -> None:
    response = sse_response(
        b'data: {"a"',
        b": 1}\r\n\r",
        b"\n: a comment line is ignored\n\nevent: error\ndata: x\n",
        b"data: y\n\ndata: [DONE]\n\n",
    )

    assert list(iter_sse(response)) == [
        ("message", '{"a": 1}'),
        ("error", "x\ny"),
        ("message", "[DONE]"),
    ]


def test_a_body_that_is_not_an_event_stream_is_a_transport_error() -> None:
    with pytest.raises(httpx2.TransportError):
        list(iter_sse(sse_response(b"<html></html>", content_type="text/html")))


def test_text_deltas_fold_into_the_answer() -> None:
    assembly, deltas = fold(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({}, "stop"),
        {"id": "c-1", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
    )

    response = assembly.response()
    assert deltas == [Delta("Hel"), Delta("lo")]
    assert (response.text, response.finish_reason, response.completion_id) == (
        "Hello",
        "stop",
        "c-1",
    )
    assert response.usage is not None
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (5, 2)
    assert response.usage.total_tokens == 0  # absent, not invented
    assert response.request_id == "r-1"


def test_interleaved_fragments_are_assembled_by_index() -> None:
    def fragment(index: int, arguments: str, **first: Any) -> Any:
        call = {"index": index, "function": {"arguments": arguments}}
        if first:
            call["id"] = first["id"]
            call["function"]["name"] = first["name"]
        return chunk({"tool_calls": [call]})

    assembly, deltas = fold(
        fragment(0, '{"comm', id="call_a", name="terminal"),
        fragment(1, "", id="call_b", name="lookup"),
        fragment(1, '{"q": '),
        fragment(0, 'and": "echo hi"}'),
        fragment(1, '"x"}'),
        chunk({}, "tool_calls"),
    )

    calls = assembly.response().tool_calls
    assert deltas == []
    assert [(c.index, c.id, c.name, json.loads(c.arguments)) for c in calls] == [
        (0, "call_a", "terminal", {"command": "echo hi"}),
        (1, "call_b", "lookup", {"q": "x"}),
    ]


def test_fragments_without_index_start_a_call_on_a_new_id_and_continue_otherwise() -> None:
    def call(arguments: str, **first: Any) -> Any:
        body: dict[str, Any] = {"function": {"arguments": arguments}}
        if first:
            body.update(id=first["id"])
            body["function"]["name"] = first["name"]
        return chunk({"tool_calls": [body]})

    assembly, _ = fold(
        call('{"a":', id="x", name="one"),
        call(" 1}"),
        call('{"b": 2}', id="y", name="two"),
        chunk({}, "stop"),
    )

    calls = assembly.response().tool_calls
    assert [(c.name, c.arguments) for c in calls] == [("one", '{"a": 1}'), ("two", '{"b": 2}')]


def test_a_call_without_an_id_gets_one_from_its_index() -> None:
    assembly, _ = fold(
        chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
    )

    assert assembly.response().tool_calls[0].id == "call_0"


def test_a_usage_chunk_with_null_choices_is_read() -> None:
    assembly, _ = fold(
        chunk({"content": "hi"}, "stop"),
        {"id": "c-1", "choices": None, "usage": {"total_tokens": 9}},
    )

    response = assembly.response()
    assert response.usage is not None and response.usage.total_tokens == 9


def test_reasoning_is_a_delta_of_its_own() -> None:
    assembly, deltas = fold(
        chunk({"reasoning_content": "let me think"}), chunk({"content": "no"}, "stop")
    )

    assert deltas == [Delta(reasoning="let me think"), Delta(text="no")]
    assert assembly.response().reasoning == "let me think"


def test_text_without_a_finish_reason_is_not_an_answer() -> None:
    assembly, _ = fold(chunk({"content": "The answer is"}))

    with pytest.raises(ModelBroken, match="13 characters"):
        assembly.response()


def test_an_error_chunk_mid_stream_breaks_the_answer() -> None:
    assembly, _ = fold(chunk({"content": "par"}))

    with pytest.raises(ModelBroken, match="overloaded"):
        assembly.feed({"error": {"message": "overloaded", "type": "server_error"}})
