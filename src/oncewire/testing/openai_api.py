"""A fake OpenAI-compatible chat completions server, run as its own process.

``python -m oncewire.testing.openai_api --port 0 --journal DIR --script FILE [--host H]`` serves
``POST /v1/chat/completions`` (an SSE stream when the request says ``"stream": true``, one JSON
completion otherwise) and ``GET /v1/models``, then prints one line, ``ready port=N``, once it
listens. Each request is appended to ``DIR/requests.jsonl`` and fsynced before any byte of the
answer is written, so a test can read exactly what a client sent even if it was killed
mid-answer: ``{"seq", "method", "path", "body", "response", "authorization"}``, with ``body``
the parsed JSON, ``response`` the scripted kind and ``authorization`` the header as received
(the fake is given fake keys).

The script (a JSON file) says how to answer each chat completion::

    {
      "responses": [RESPONSE, ...],             # consumed in order
      "by_token": {"TOKEN": [RESPONSE, ...]},   # consumed in order when TOKEN is in the last
                                                # user message (checked before "responses")
      "resume": {"TOKEN": [RESPONSE, ...]},     # consumed in order when no by_token TOKEN is
                                                # in the last user message but one is in an
                                                # earlier user message (a resumed turn's note)
      "default": RESPONSE                       # when nothing is left (else a 500 saying so)
    }

A bare list is the same as ``{"responses": [...]}``. ``POST /control/script`` with an object of
the same shape adds to the script while the fake runs (``by_token`` and ``resume`` queues are
extended, ``responses`` appended, ``default`` replaced), so one fake can serve many scripted
conversations. A RESPONSE is an object with ``kind``:

=================  ==============================================================================
``text``           ``text``, ``chunk_chars`` (8), ``delay_per_chunk`` (seconds, 0), ``usage``
                   (object; computed from lengths if absent), ``finish_reason`` ("stop"),
                   ``reasoning`` (sent first as ``reasoning_content`` deltas)
``tool_call``      ``name`` + ``args``, or ``calls: [{"name", "args"}, ...]`` for parallel calls;
                   ``args`` an object or a JSON string, streamed in ``chunk_chars`` fragments
                   (``0``: whole arguments in one fragment); ``text`` before the calls;
                   ``finish_reason`` ("tool_calls"); ``no_index: true`` omits ``index``
``error``          ``status`` (500), ``retry_after`` (seconds, header ``retry-after``),
                   ``retry_after_ms`` (header ``retry-after-ms``), ``body`` (an object; default an
                   OpenAI error body)
``hang``           read the request and send nothing for ``seconds`` (3600) or until the client
                   goes away
``drop_mid_stream``  stream ``text`` up to ``after_chars``, then close the connection without
                   ending the chunked body (no ``finish_reason``, no ``[DONE]``)
``stall_mid_stream`` stream ``text`` up to ``after_chars``, then send nothing for ``seconds``
                   (3600) or until the client goes away
``error_mid_stream`` stream ``text`` up to ``after_chars``, then ``data: {"error": ...}``
``raw``            ``status`` (200), ``headers`` (object), ``body`` (a string sent as is)
=================  ==============================================================================

The responses that stop mid-stream stream their text like ``text`` does, in ``chunk_chars``
pieces ``delay_per_chunk`` apart. Every streamed response may also set
``usage_choices_null: true`` (the usage chunk carries ``"choices": null`` instead of ``[]``)
and ``request_id`` (the ``x-request-id`` header; default ``req-SEQ``). The script is read
once at start: a restarted fake starts it from the top.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from oncewire.testing.control import JsonHandler, announce_and_serve, print_error

__all__ = ["Script", "main", "serve"]

Response = dict[str, Any]
KINDS = frozenset(
    {
        "text",
        "tool_call",
        "error",
        "hang",
        "drop_mid_stream",
        "stall_mid_stream",
        "error_mid_stream",
        "raw",
    }
)
MODELS = ("fake-model",)


class Script:
    """The scripted responses, consumed in order (thread-safe)."""

    def __init__(self, raw: Any) -> None:
        self._queue: list[Response] = []
        self._by_token: dict[str, list[Response]] = {}
        self._resume: dict[str, list[Response]] = {}
        self._default: Response | None = None
        self._lock = threading.Lock()
        self.add(raw)

    def add(self, raw: Any) -> None:
        """Add a script's responses to this one (``default`` replaces the current one)."""
        if isinstance(raw, list):
            raw = {"responses": raw}
        if not isinstance(raw, dict) or set(raw) - {"responses", "by_token", "resume", "default"}:
            raise ValueError(
                "a script is a list of responses or an object with responses, by_token, resume, "
                "default"
            )
        queue = [_checked(r) for r in raw.get("responses", [])]
        by_token = {str(t): [_checked(r) for r in rs] for t, rs in raw.get("by_token", {}).items()}
        resume = {str(t): [_checked(r) for r in rs] for t, rs in raw.get("resume", {}).items()}
        with self._lock:
            self._queue.extend(queue)
            for token, responses in by_token.items():
                self._by_token.setdefault(token, []).extend(responses)
            for token, responses in resume.items():
                self._resume.setdefault(token, []).extend(responses)
            if raw.get("default") is not None:
                self._default = _checked(raw["default"])

    def next_for(self, user_texts: Sequence[str]) -> Response | None:
        """The answer to a request whose user messages are ``user_texts`` (oldest first)."""
        last = user_texts[-1] if user_texts else ""
        with self._lock:
            named = [token for token in self._by_token if token in last]
            for token in named:
                if self._by_token[token]:
                    return self._by_token[token].pop(0)
            if not named:  # a resumed turn: its token is in an earlier user message
                for text in reversed(user_texts[:-1]):
                    earlier = [t for t in self._resume if t in text and self._resume[t]]
                    if earlier:
                        return self._resume[earlier[0]].pop(0)
            if self._queue:
                return self._queue.pop(0)
            return self._default


def _checked(response: Any) -> Response:
    if not isinstance(response, dict) or response.get("kind") not in KINDS:
        raise ValueError(f"a response needs a kind among {sorted(KINDS)}, got {response!r}")
    return response


class _Journal:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._file = open(directory / "requests.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()
        self._seq = 0

    def record(
        self, method: str, path: str, body: Any, response: str, authorization: str | None
    ) -> int:
        with self._lock:
            self._seq += 1
            line = {"seq": self._seq, "method": method, "path": path, "body": body}
            line.update(response=response, authorization=authorization)
            self._file.write(json.dumps(line, sort_keys=True) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
            return self._seq


class _Handler(JsonHandler):
    server: _Server

    def do_GET(self) -> None:
        self._record("GET", None, "models")
        if self.path.rstrip("/") != "/v1/models":
            return self.send_json(
                404, {"error": {"message": f"no route {self.path}", "type": "not_found"}}
            )
        models = [{"id": m, "object": "model", "owned_by": "oncewire"} for m in MODELS]
        self.send_json(200, {"object": "list", "data": models})

    def do_POST(self) -> None:
        raw = self.read_body()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        if self.path.rstrip("/") == "/control/script":
            try:
                self.server.script.add(body)
            except ValueError as exc:
                return self.send_json(400, {"ok": False, "error": str(exc)})
            return self.send_json(200, {"ok": True})
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._record("POST", body, "not_found")
            return self.send_json(
                404, {"error": {"message": f"no route {self.path}", "type": "not_found"}}
            )
        response = self.server.script.next_for(_user_texts(body))
        if response is None:
            response = {
                "kind": "error",
                "status": 500,
                "body": _error_body("the fake's script has no response left"),
            }
        seq = self._record("POST", body, response["kind"])
        streaming = isinstance(body, dict) and body.get("stream") is True
        _Answer(self, response, seq, streaming).send()

    def _record(self, method: str, body: Any, response: str) -> int:
        authorization = self.headers.get("authorization")
        return self.server.journal.record(method, self.path, body, response, authorization)


class _Answer:
    """One scripted answer written to the wire."""

    def __init__(self, handler: _Handler, response: Response, seq: int, streaming: bool) -> None:
        self.h = handler
        self.r = response
        self.streaming = streaming
        self.id = f"chatcmpl-fake-{seq}"
        self.request_id = str(response.get("request_id", f"req-{seq}"))

    def send(self) -> None:
        kind = self.r["kind"]
        if kind == "error":
            return self._error()
        if kind == "raw":
            return self._raw()
        if kind == "hang":
            return self._wait(float(self.r.get("seconds", 3600)))
        if kind in ("text", "tool_call"):
            if not self.streaming:
                return self._whole()
            self._start_stream()
            for chunk in self._chunks():
                self._event(chunk)
                if self.r.get("delay_per_chunk"):
                    time.sleep(float(self.r["delay_per_chunk"]))
            self._event("[DONE]")
            return self._end_chunked()
        # A fault mid-stream: some text, never a finish_reason.
        if self.streaming:
            self._start_stream()
            text = str(self.r.get("text", ""))[: int(self.r.get("after_chars", 1 << 30))]
            self._event(self._chunk({"role": "assistant", "content": ""}))
            for piece in _pieces(text, int(self.r.get("chunk_chars", 8))):
                self._event(self._chunk({"content": piece}))
                if self.r.get("delay_per_chunk"):
                    time.sleep(float(self.r["delay_per_chunk"]))
        if kind == "drop_mid_stream":
            return self._drop()
        if kind == "stall_mid_stream":
            return self._wait(float(self.r.get("seconds", 3600)))
        if not self.streaming:
            return self._error()
        self._event({"error": _error_body("the fake failed mid-stream")["error"]})
        self._end_chunked()

    # Wire pieces.

    def _headers(
        self, status: int, content_type: str, extra: Mapping[str, str] | None = None
    ) -> None:
        self.h.send_response(status)
        self.h.send_header("content-type", content_type)
        self.h.send_header("x-request-id", self.request_id)
        for name, value in (extra or {}).items():
            self.h.send_header(name, value)

    def _start_stream(self) -> None:
        self._headers(200, "text/event-stream")
        self.h.send_header("transfer-encoding", "chunked")
        self.h.send_header("cache-control", "no-cache")
        self.h.end_headers()
        self.h.wfile.flush()

    def _event(self, payload: Any) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        frame = f"data: {data}\n\n".encode()
        self.h.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
        self.h.wfile.flush()

    def _end_chunked(self) -> None:
        self.h.wfile.write(b"0\r\n\r\n")
        self.h.wfile.flush()

    def _drop(self) -> None:
        self.h.wfile.flush()
        self.h.close_connection = True
        try:
            self.h.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _wait(self, seconds: float) -> None:
        """Send nothing until ``seconds`` pass or the client closes its end."""
        self.h.stay_silent(seconds)

    def _error(self) -> None:
        status = int(self.r.get("status", 500))
        extra = {}
        if self.r.get("retry_after") is not None:
            extra["retry-after"] = str(self.r["retry_after"])
        if self.r.get("retry_after_ms") is not None:
            extra["retry-after-ms"] = str(self.r["retry_after_ms"])
        body = self.r.get("body") or _error_body(f"scripted error {status}")
        data = json.dumps(body).encode()
        self._headers(status, "application/json", extra)
        self.h.send_header("content-length", str(len(data)))
        self.h.end_headers()
        self.h.wfile.write(data)

    def _raw(self) -> None:
        data = str(self.r.get("body", "")).encode()
        headers = {str(k): str(v) for k, v in (self.r.get("headers") or {}).items()}
        self._headers(
            int(self.r.get("status", 200)), headers.pop("content-type", "text/plain"), headers
        )
        self.h.send_header("content-length", str(len(data)))
        self.h.end_headers()
        self.h.wfile.write(data)

    def _whole(self) -> None:
        calls = _calls(self.r) if self.r["kind"] == "tool_call" else []
        message: dict[str, Any] = {"role": "assistant", "content": self.r.get("text") or None}
        if calls:
            message["tool_calls"] = [
                {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                for i, (n, a) in enumerate(calls)
            ]
        choice = {"index": 0, "message": message, "finish_reason": self._finish_reason()}
        payload: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "model": MODELS[0],
            "choices": [choice],
        }
        payload["usage"] = self._usage()
        data = json.dumps(payload).encode()
        self._headers(200, "application/json")
        self.h.send_header("content-length", str(len(data)))
        self.h.end_headers()
        self.h.wfile.write(data)

    # Chunk content.

    def _finish_reason(self) -> str:
        default = "tool_calls" if self.r["kind"] == "tool_call" else "stop"
        return str(self.r.get("finish_reason", default))

    def _usage(self) -> dict[str, int]:
        if isinstance(self.r.get("usage"), dict):
            return dict(self.r["usage"])
        completion = max(1, len(str(self.r.get("text", ""))) // 4)
        return {
            "prompt_tokens": 10,
            "completion_tokens": completion,
            "total_tokens": 10 + completion,
        }

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "model": MODELS[0],
            "choices": [choice],
        }

    def _chunks(self) -> Iterator[dict[str, Any]]:
        """The chunks of the whole answer, finish_reason and usage included."""
        size = int(self.r.get("chunk_chars", 8))
        yield self._chunk({"role": "assistant", "content": ""})
        for piece in _pieces(str(self.r.get("reasoning", "")), size):
            yield self._chunk({"reasoning_content": piece})
        for piece in _pieces(str(self.r.get("text", "")), size):
            yield self._chunk({"content": piece})
        calls = _calls(self.r) if self.r["kind"] == "tool_call" else []
        for i, (name, args) in enumerate(calls):
            for j, piece in enumerate(_pieces(args, size) or [""]):
                call: dict[str, Any] = {"function": {"arguments": piece}}
                if j == 0:
                    call.update(id=f"call_{i}", type="function")
                    call["function"]["name"] = name
                if not self.r.get("no_index"):
                    call["index"] = i
                yield self._chunk({"tool_calls": [call]})
        yield self._chunk({}, self._finish_reason())
        usage: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk"}
        usage["choices"] = None if self.r.get("usage_choices_null") else []
        usage["usage"] = self._usage()
        yield usage


def _pieces(text: str, size: int) -> list[str]:
    if size <= 0 or len(text) <= size:
        return [text] if text else []
    return [text[i : i + size] for i in range(0, len(text), size)]


def _calls(response: Response) -> list[tuple[str, str]]:
    raw = response.get("calls") or [{"name": response.get("name"), "args": response.get("args")}]
    calls = []
    for call in raw:
        args = call.get("args", {})
        calls.append((str(call["name"]), args if isinstance(args, str) else json.dumps(args)))
    return calls


def _error_body(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "server_error", "code": None}}


def _user_texts(body: Any) -> list[str]:
    """The text of every user message of a request, oldest first."""
    messages = body.get("messages") if isinstance(body, dict) else None
    texts = []
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            texts.append(content if isinstance(content, str) else json.dumps(content))
    return texts


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], script: Script, journal: _Journal) -> None:
        self.script = script
        self.journal = journal
        super().__init__(address, _Handler)


def serve(host: str, port: int, journal: Path, script: Script) -> _Server:
    """Bind the server (not serving yet: call ``serve_forever``)."""
    return _Server((host, port), script, _Journal(journal))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oncewire.testing.openai_api")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--script", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        script = Script(json.loads(args.script.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        return print_error(f"{args.script}: {exc}")
    server = serve(args.host, args.port, args.journal, script)
    return announce_and_serve(server.server_address[1], server.serve_forever)


if __name__ == "__main__":
    sys.exit(main())
