"""The model client: one OpenAI-compatible chat completion per call, streamed, typed.

``OpenAIChatClient.complete`` posts ``{base_url}/chat/completions`` with ``stream: true`` and
``stream_options.include_usage``, hands each text delta to a callback (for previews), assembles
tool calls from their fragments, and returns a :class:`ModelResponse` only when the server said
how the answer finished (``finish_reason``). Everything else is a :class:`ModelFailure`, raised
once and never retried here (retrying re-bills tokens; the caller's policy decides):

=========================  ====================================================================
:class:`ModelRateLimited`  429; ``retry_after_seconds`` from ``retry-after-ms`` or ``retry-after``
:class:`ModelNotSent`      the request never left (connection refused, no pooled connection)
:class:`ModelBroken`       the request may have arrived but no complete answer came back: the
                           stream ended, stalled past the read timeout or reported an error
                           before a ``finish_reason``. Text that arrived is not an answer.
:class:`ModelRejected`     4xx other than 408/409/429 (bad request, context too long, bad key),
                           or a redirect (``base_url`` does not point at the API itself)
:class:`ModelUnavailable`  5xx, 408, 409
:class:`ModelInterrupted`  :meth:`Interrupt.interrupt` was called from another thread
=========================  ====================================================================

Compatible servers differ; tolerated: a usage chunk with ``"choices": null``, tool-call
fragments without ``index``, whole arguments in one fragment, ``reasoning_content``,
``finish_reason: "stop"`` alongside tool calls (the tool calls count), and a plain JSON
completion where a stream was asked for.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oncewire.core.errors import ConfigurationError
from oncewire.gateway import http
from oncewire.gateway.config import ModelConfig
from oncewire.gateway.model_results import (
    Delta,
    DeltaCallback,
    Interrupt,
    ModelBroken,
    ModelClient,
    ModelFailure,
    ModelInterrupted,
    ModelNotSent,
    ModelRateLimited,
    ModelRejected,
    ModelResponse,
    ModelUnavailable,
    ToolCall,
    Usage,
)

__all__ = [
    "Delta",
    "Interrupt",
    "ModelBroken",
    "ModelClient",
    "ModelFailure",
    "ModelInterrupted",
    "ModelNotSent",
    "ModelRateLimited",
    "ModelRejected",
    "ModelResponse",
    "ModelUnavailable",
    "OpenAIChatClient",
    "StreamAssembly",
    "ToolCall",
    "Usage",
]


@dataclass
class _CallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class StreamAssembly:
    """Folds the chunks of one streamed completion into a :class:`ModelResponse`."""

    def __init__(self, request_id: str | None = None) -> None:
        self.request_id = request_id
        self.completion_id: str | None = None
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.received_chars = 0
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, _CallParts] = {}
        self._last_index: int | None = None

    def feed(self, chunk: Mapping[str, Any]) -> Delta | None:
        """Take one chunk; return what a preview should show of it, if anything."""
        if chunk.get("error") is not None:
            raise ModelBroken(
                f"the model service reported an error mid-stream: {_error_text(chunk)}",
                request_id=self.request_id,
            )
        if self.completion_id is None and isinstance(chunk.get("id"), str) and chunk["id"]:
            self.completion_id = chunk["id"]
        if isinstance(chunk.get("usage"), Mapping):
            self.usage = _usage(chunk["usage"])
        text, reasoning = "", ""
        for choice in chunk.get("choices") or ():  # vLLM-style usage chunks carry null
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta") or choice.get("message") or {}
            text += _str(delta.get("content"))
            reasoning += _str(delta.get("reasoning_content")) + _str(delta.get("reasoning"))
            for fragment in delta.get("tool_calls") or ():
                self._tool_fragment(fragment)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        self._text.append(text)
        self._reasoning.append(reasoning)
        self.received_chars += len(text)
        return Delta(text, reasoning) if text or reasoning else None

    def _tool_fragment(self, fragment: Mapping[str, Any]) -> None:
        index = fragment.get("index")
        if not isinstance(index, int):
            # No index: a fragment with a new id starts a call; otherwise it continues the last.
            new_id = fragment.get("id")
            known = any(parts.id == new_id for parts in self._calls.values())
            starts = self._last_index is None or (bool(new_id) and not known)
            index = len(self._calls) if starts else self._last_index
        assert index is not None
        parts = self._calls.setdefault(index, _CallParts())
        self._last_index = index
        function = fragment.get("function") or {}
        parts.id = parts.id or _str(fragment.get("id"))
        parts.name = parts.name or _str(function.get("name"))
        parts.arguments.append(_str(function.get("arguments")))

    def response(self) -> ModelResponse:
        """The answer, or :class:`ModelBroken` if the server never said it finished."""
        if self.finish_reason is None:
            raise ModelBroken(
                f"the stream ended without a finish_reason after {self.received_chars} "
                "characters of text; that text is not an answer",
                request_id=self.request_id,
            )
        calls = tuple(
            ToolCall(i, parts.id or f"call_{i}", parts.name, "".join(parts.arguments))
            for i, parts in sorted(self._calls.items())
        )
        return ModelResponse(
            text="".join(self._text),
            tool_calls=calls,
            finish_reason=self.finish_reason,
            usage=self.usage,
            completion_id=self.completion_id,
            request_id=self.request_id,
            reasoning="".join(self._reasoning),
        )


class OpenAIChatClient:
    """:class:`ModelClient` for any server that speaks OpenAI's chat completions API.

    The API key is read once, from the environment variable named by ``api_key_env`` (``None``:
    no key, for local servers); it is sent as a bearer token and appears in no repr, log or
    error. Thread-safe: each call has a connection of its own, so it can be interrupted.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        timeouts: http.Timeouts | None = None,
        max_tokens: int | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigurationError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not model:
            raise ConfigurationError("model must name a model")
        headers = {"accept": "text/event-stream"}
        if api_key_env is not None:
            key = (os.environ if environ is None else environ).get(api_key_env)
            if not key:
                raise ConfigurationError(
                    f"the environment variable {api_key_env} (api_key_env) is not set"
                )
            headers["authorization"] = f"Bearer {key}"
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.models_url = base_url.rstrip("/") + "/models"
        self.model = model
        self.max_tokens = max_tokens
        self._client = http.make_client(
            timeouts or http.Timeouts(), keepalive=False, headers=headers
        )

    @classmethod
    def from_config(
        cls, config: ModelConfig, environ: Mapping[str, str] | None = None
    ) -> OpenAIChatClient:
        """The client a gateway.toml ``[model]`` table describes (``max_retries`` is the
        caller's: this client never retries)."""
        timeouts = http.Timeouts(
            connect_seconds=config.connect_timeout_seconds,
            read_seconds=config.read_timeout_seconds,
        )
        return cls(
            config.base_url,
            config.model,
            api_key_env=config.api_key_env,
            timeouts=timeouts,
            environ=environ,
        )

    def __repr__(self) -> str:
        return f"OpenAIChatClient(url={self.url!r}, model={self.model!r})"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIChatClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def list_models(self) -> tuple[str, ...]:
        """The ids ``GET {base_url}/models`` lists (a start-up check: the server answers, the
        key is accepted, the configured model is there). Fails with the same typed
        :class:`ModelFailure` as :meth:`complete`; never retried."""
        try:
            response = self._client.get(self.models_url, headers={"accept": "application/json"})
        except http.TransportError as exc:
            if http.reach(exc) is http.Reach.NEVER_LEFT:
                raise ModelNotSent(f"the request never left: {_describe(exc)}") from exc
            raise ModelBroken(f"no answer to GET /models: {_describe(exc)}") from exc
        request_id = response.headers.get("x-request-id")
        if response.status_code >= 300:
            raise _status_failure(response, request_id)
        try:
            payload = response.json()
        except ValueError:
            payload = None
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            raise ModelBroken(
                f"GET /models answered without a list of models: {response.text[:80]!r}",
                request_id=request_id,
            )
        return tuple(str(item["id"]) for item in data if isinstance(item, dict) and item.get("id"))

    def request_body(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(message) for message in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = [dict(tool) for tool in tools]
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_delta: DeltaCallback | None = None,
        interrupt: Interrupt | None = None,
    ) -> ModelResponse:
        interrupt = interrupt or Interrupt()
        if interrupt.is_set():
            raise ModelInterrupted("interrupted before the request was sent")
        shutter = http.SocketShutter()
        interrupt.on_interrupt(shutter.shut)
        body = self.request_body(messages, tools)
        assembly = StreamAssembly()
        try:
            with self._client.stream(
                "POST", self.url, json=body, extensions=shutter.extensions
            ) as response:
                shutter.attach(response)
                assembly.request_id = response.headers.get("x-request-id")
                if response.status_code >= 300:  # a redirect too: base_url is not the API
                    response.read()
                    raise _status_failure(response, assembly.request_id)
                content_type = response.headers.get("content-type", "")
                if content_type.startswith("application/json"):
                    _read_whole(assembly, response.read())
                else:
                    _read_stream(assembly, http.iter_sse(response), on_delta, interrupt)
        except http.TransportError as exc:
            if interrupt.is_set():
                raise ModelInterrupted(request_id=assembly.request_id) from exc
            if http.reach(exc) is http.Reach.NEVER_LEFT:
                raise ModelNotSent(f"the request never left: {_describe(exc)}") from exc
            if assembly.finish_reason is None:
                raise ModelBroken(
                    f"no complete answer: {_describe(exc)} after "
                    f"{assembly.received_chars} characters of text",
                    request_id=assembly.request_id,
                ) from exc
            # The answer finished; only the trailing usage chunk or [DONE] was lost.
        if interrupt.is_set():
            raise ModelInterrupted(request_id=assembly.request_id)
        return assembly.response()


def _read_stream(
    assembly: StreamAssembly,
    events: Iterable[tuple[str, str]],
    on_delta: DeltaCallback | None,
    interrupt: Interrupt,
) -> None:
    for event, data in events:
        if interrupt.is_set():
            return
        if data.strip() == "[DONE]":
            return
        chunk = _json_object(data, assembly.request_id)
        if event == "error" and "error" not in chunk:
            chunk = {"error": chunk}
        delta = assembly.feed(chunk)
        if delta is not None and on_delta is not None:
            on_delta(delta)


def _read_whole(assembly: StreamAssembly, content: bytes) -> None:
    assembly.feed(_json_object(content.decode("utf-8", "replace"), assembly.request_id))


def _json_object(text: str, request_id: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ModelBroken(
            f"the model service sent a malformed chunk: {text[:80]!r}", request_id=request_id
        )
    return value


def _status_failure(response: http.Response, request_id: str | None) -> ModelFailure:
    status = response.status_code
    try:
        payload = response.json()
    except ValueError:
        payload = None
    detail = _error_text(payload) if isinstance(payload, dict) else response.text[:200]
    message = f"HTTP {status} from the model service: {detail}"
    fields: dict[str, Any] = {"status": status, "request_id": request_id}
    if status == 429:
        return ModelRateLimited(
            message, retry_after_seconds=_retry_after(response.headers), **fields
        )
    if status >= 500 or status in (408, 409):
        return ModelUnavailable(message, **fields)
    return ModelRejected(message, **fields)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait: ``retry-after-ms`` (OpenAI's, finer) wins over ``retry-after``."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            seconds = float(headers.get(name, "")) * scale
        except ValueError:
            continue  # absent, or an HTTP date: model services send numbers
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None


def _error_text(payload: Mapping[str, Any]) -> str:
    error = payload.get("error")
    if isinstance(error, Mapping):
        parts = [str(error.get(k)) for k in ("message", "type", "code") if error.get(k)]
        return "; ".join(parts) or "no details"
    return str(error) if error is not None else str(payload)[:200]


def _usage(raw: Mapping[str, Any]) -> Usage:
    def count(key: str) -> int:
        value = raw.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    return Usage(count("prompt_tokens"), count("completion_tokens"), count("total_tokens"))


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
