"""The chat history the model sees, through the real ``gateway run`` process.

A turn's request carries its session's earlier messages and the answers committed for them,
read from the ledger (``ledger.replies.history``): what the chat shows, not a separate
transcript that could disagree with it. A message another one interrupted is there without an
answer; ``/stop`` and its confirmation are not; another chat's messages are not; past
``[turns] history_messages`` or ``history_chars`` the oldest are left out. A turn resumed after
a SIGKILL asks with the same history.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire.core.errors import ConfigurationError
from oncewire.gateway.config import parse_config
from oncewire.inbound import InboundState
from tests.conftest import wait_for
from tests.gateway.test_runner import RESUME_PHRASE, Rig

ANSWERS = [f"Answer number {n}." for n in range(1, 6)]


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(script: Any, turns: str = "") -> Rig:
        made.append(Rig(tmp_path, script, str(tmp_path / "gateway.db")))
        text = made[-1].config.read_text(encoding="utf-8")
        made[-1].config.write_text(text.replace("[turns]\n", f"[turns]\n{turns}"), "utf-8")
        return made[-1]

    yield make
    for one in made:
        one.stop()


def _ask(r: Rig, inbound_id: int, text: str, chat: str | None = None) -> None:
    r.telegram.inject(chat=chat, text=text)
    r.wait_status(inbound_id, InboundState.DELIVERED)


def test_each_turn_sees_the_sessions_earlier_messages_and_answers(
    rig: Callable[..., Rig],
) -> None:
    r = rig([{"kind": "text", "text": answer} for answer in ANSWERS])
    gateway = r.start()
    _ask(r, 1, "first question")
    _ask(r, 2, "a question in another chat", chat=str(int(r.telegram.chat) + 1))
    _ask(r, 3, "/stop")  # a command: neither it nor its confirmation is history
    _ask(r, 4, "second question")
    _ask(r, 5, "third question")
    bodies = [request["body"]["messages"] for request in r.model.requests()]
    assert bodies == [
        [_user("first question")],
        [_user("a question in another chat")],
        [_user("first question"), _assistant(ANSWERS[0]), _user("second question")],
        [
            _user("first question"),
            _assistant(ANSWERS[0]),
            _user("second question"),
            _assistant(ANSWERS[2]),
            _user("third question"),
        ],
    ]
    assert gateway.terminate() == 0


QUESTIONS = ["first question", "second question", "third question", "fourth question"]


@pytest.mark.parametrize(
    ("turns", "kept"),
    [
        # history_messages: the three latest messages are read, the first is not.
        ("history_messages = 3\n", [1, 2, 3]),
        # history_chars: an exchange here is 30 or 31 characters; the two latest fit in 70, and
        # once one does not fit, nothing older is taken instead.
        ("history_chars = 70\n", [2, 3]),
    ],
)
def test_past_its_limits_the_oldest_history_is_left_out(
    rig: Callable[..., Rig], turns: str, kept: list[int]
) -> None:
    r = rig([{"kind": "text", "text": answer} for answer in ANSWERS], turns)
    gateway = r.start()
    for n, text in enumerate(QUESTIONS, 1):
        _ask(r, n, text)
    _ask(r, 5, "fifth question")
    expected = [m for n in kept for m in (_user(QUESTIONS[n]), _assistant(ANSWERS[n]))]
    assert r.model.requests()[-1]["body"]["messages"] == [*expected, _user("fifth question")]
    assert gateway.terminate() == 0


def test_history_messages_0_sends_the_message_alone(rig: Callable[..., Rig]) -> None:
    r = rig([{"kind": "text", "text": answer} for answer in ANSWERS], "history_messages = 0\n")
    gateway = r.start()
    _ask(r, 1, "first question")
    _ask(r, 2, "second question")
    assert r.model.requests()[-1]["body"]["messages"] == [_user("second question")]
    assert gateway.terminate() == 0


@pytest.mark.crash
def test_a_turn_resumed_after_sigkill_asks_with_the_same_history(
    rig: Callable[..., Rig],
) -> None:
    r = rig(
        [
            {"kind": "text", "text": ANSWERS[0]},
            {"kind": "hang", "seconds": 600},
            {"kind": "text", "text": ANSWERS[1]},
        ]
    )
    first = r.start()
    _ask(r, 1, "first question")
    r.telegram.inject(text="second question")
    wait_for(lambda: len(r.model.requests()) == 2, what="the second turn's model request")
    first.kill()
    second = r.start()
    r.wait_status(2, InboundState.DELIVERED)
    asked, resumed = (request["body"]["messages"] for request in r.model.requests()[1:])
    history = [_user("first question"), _assistant(ANSWERS[0]), _user("second question")]
    assert asked == history
    assert resumed[:-1] == history and RESUME_PHRASE in resumed[-1]["content"].lower()
    assert second.terminate() == 0


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("history_messages = -1", "an integer >= 0"),
        ("history_messages = 1001", "more than 1000"),
        ("history_chars = -5", "an integer >= 0"),
        ('history_chars = "lots"', "an integer >= 0"),
    ],
)
def test_history_limits_out_of_range_are_refused(tmp_path: Path, line: str, problem: str) -> None:
    text = f"""
[store]
db = "x.db"

[turns]
{line}

[[platforms]]
name = "web"
kind = "webhook"
send_url = "http://127.0.0.1:9/send"
"""
    with pytest.raises(ConfigurationError, match=problem):
        parse_config(text, tmp_path / "gateway.toml")
