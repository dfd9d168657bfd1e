"""The fake OpenAI-compatible server's own contract: script order, tokens, default, journal."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest

from oncewire.gateway.http import Timeouts, make_client
from oncewire.gateway.model import OpenAIChatClient
from tests.conftest import _child_env, wait_for
from tests.gateway.conftest import FakeOpenAI

Start = Callable[[Any], FakeOpenAI]


def ask(fake: FakeOpenAI, text: str) -> str:
    client = OpenAIChatClient(fake.base_url, "fake-model")
    return client.complete([{"role": "user", "content": text}]).text


def test_responses_keyed_by_a_token_in_the_last_user_message_come_first(
    fake_openai: Start,
) -> None:
    fake = fake_openai(
        {
            "responses": [{"kind": "text", "text": "first"}, {"kind": "text", "text": "second"}],
            "by_token": {"T7": [{"kind": "text", "text": "for T7"}]},
            "default": {"kind": "text", "text": "default"},
        }
    )

    answers = [ask(fake, text) for text in ("hi", "about T7", "about T7", "hi", "hi")]

    assert answers == ["first", "for T7", "second", "default", "default"]


def test_a_script_added_while_running_answers_its_token_and_its_resumed_turn(
    fake_openai: Start,
) -> None:
    fake = fake_openai([])
    with make_client(Timeouts()) as client:
        added = client.post(
            f"http://127.0.0.1:{fake.port}/control/script",
            json={
                "by_token": {"[in:a]": [{"kind": "text", "text": "answer a"}]},
                "resume": {"[in:a]": [{"kind": "text", "text": "resumed a"}]},
            },
        )
        refused = client.post(
            f"http://127.0.0.1:{fake.port}/control/script", json={"by_tokens": {}}
        )
    assert added.status_code == 200 and refused.status_code == 400
    client = OpenAIChatClient(fake.base_url, "fake-model")
    first = client.complete([{"role": "user", "content": "[in:a] hi"}]).text
    resumed = [
        {"role": "user", "content": "[in:a] hi"},
        {"role": "user", "content": "your previous turn was interrupted"},
    ]
    assert (first, client.complete(resumed).text) == ("answer a", "resumed a")
    assert len(fake.requests()) == 2  # the control calls are not model requests


def test_an_exhausted_script_answers_500_saying_so(fake_openai: Start) -> None:
    fake = fake_openai([])
    with make_client(Timeouts()) as client:
        response = client.post(f"{fake.base_url}/chat/completions", json={"messages": []})

    assert response.status_code == 500
    assert "no response left" in response.json()["error"]["message"]


def test_a_request_without_stream_gets_one_json_completion(fake_openai: Start) -> None:
    fake = fake_openai([{"kind": "tool_call", "name": "f", "args": {"a": 1}, "text": "calling"}])
    with make_client(Timeouts()) as client:
        response = client.post(f"{fake.base_url}/chat/completions", json={"messages": []})

    choice = response.json()["choices"][0]
    assert response.headers["x-request-id"] == "req-1"
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "calling"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}


def test_models_are_listed_and_journaled(fake_openai: Start) -> None:
    fake = fake_openai([])

    with make_client(Timeouts()) as client:
        response = client.get(f"{fake.base_url}/models")

    assert [m["id"] for m in response.json()["data"]] == ["fake-model"]
    assert [(r["method"], r["path"]) for r in fake.requests()] == [("GET", "/v1/models")]


def test_a_request_is_journaled_before_the_answer_starts(fake_openai: Start) -> None:
    fake = fake_openai([{"kind": "hang", "seconds": 30}])
    client = make_client(Timeouts(read_seconds=30), keepalive=False)
    failures: list[BaseException] = []

    def call() -> None:
        try:
            client.post(f"{fake.base_url}/chat/completions", json={"messages": [], "n": 1})
        except httpx2.TransportError as exc:
            failures.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    # The server has not answered (it hangs), yet the request is already in the journal.
    wait_for(lambda: len(fake.requests()) == 1, what="the journaled request")
    assert fake.requests()[0]["body"] == {"messages": [], "n": 1}
    fake.stop()
    caller.join(timeout=30)
    assert len(failures) == 1


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ('[{"kind": "poem"}]', "needs a kind"),
        ('{"responses": [], "extra": 1}', "a script is a list"),
        ("not json", "Expecting value"),
    ],
)
def test_a_bad_script_stops_the_fake_with_a_clear_error(
    tmp_path: Path, script: str, message: str
) -> None:
    path = tmp_path / "script.json"
    path.write_text(script, encoding="utf-8")
    command = [sys.executable, "-m", "oncewire.testing.openai_api", "--journal", str(tmp_path)]

    result = subprocess.run(
        [*command, "--script", str(path)],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 2
    assert message in result.stderr and str(path) in result.stderr


def test_the_journal_is_one_json_object_per_line(fake_openai: Start) -> None:
    fake = fake_openai([{"kind": "text", "text": "a"}, {"kind": "error", "status": 400}])
    client = OpenAIChatClient(fake.base_url, "fake-model")
    client.complete([{"role": "user", "content": "one"}])
    with pytest.raises(Exception, match="HTTP 400"):
        client.complete([{"role": "user", "content": "two"}])

    lines = (fake.journal_dir / "requests.jsonl").read_text(encoding="utf-8").splitlines()

    records = [json.loads(line) for line in lines]
    assert [(r["seq"], r["response"]) for r in records] == [(1, "text"), (2, "error")]
    assert [r["body"]["messages"][0]["content"] for r in records] == ["one", "two"]


def test_a_stall_mid_stream_paces_its_text_like_a_text_answer(fake_openai: Start) -> None:
    """``delay_per_chunk`` spaces the pieces before a stall, so a client can preview a prefix
    before the whole text arrives (the seed's stream_accepted_unpersisted cell needs that)."""
    fake = fake_openai(
        [
            {
                "kind": "stall_mid_stream",
                "text": "abcdefghijkl",
                "after_chars": 12,
                "chunk_chars": 4,
                "delay_per_chunk": 0.25,
                "seconds": 30,
            }
        ]
    )
    client = make_client(Timeouts(read_seconds=30), keepalive=False)
    arrived: list[tuple[float, str]] = []
    body = {"messages": [{"role": "user", "content": "q"}], "stream": True}
    with client.stream("POST", f"{fake.base_url}/chat/completions", json=body) as answer:
        for line in answer.iter_lines():
            if not line.startswith("data: "):
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            if delta.get("content"):
                arrived.append((time.monotonic(), delta["content"]))
            if len(arrived) == 3:
                break
    assert [piece for _, piece in arrived] == ["abcd", "efgh", "ijkl"]
    # Each piece waits its delay after the one before (a lower bound: sleeps never run short).
    assert arrived[2][0] - arrived[0][0] >= 0.45
    fake.stop()
