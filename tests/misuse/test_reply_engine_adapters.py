"""A platform adapter that answers the reply engine with something other than a WireOutcome.

An ``async def`` operation, a generator, the class ``Delivered`` instead of an instance, an
exception returned instead of raised, an ``Delivered`` without a message id: none of these may be
recorded as acknowledged. Adapters that cannot answer at all are refused when the engine is
built; a malformed answer is recorded as ``ambiguous`` (a later send carries the duplicate
marker), logged at ERROR. Checked in the database on both backends and on the fake's journal.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import ConfigurationError, Ledger, ReplyEngine
from oncewire.replies import TELEGRAM_LIKE
from oncewire.replies.wire import Delivered, MaybeDelivered, NotDelivered, WireOutcome
from oncewire.storage.replies import SendRequest
from oncewire.testing.fake_platform import ChatView, FakePlatform
from tests.contract.conftest import RawDatabase

NAME = "fk"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakePlatform]:
    platform = FakePlatform(tmp_path / "chat.jsonl", TELEGRAM_LIKE, name=NAME)
    try:
        yield platform
    finally:
        platform.close()


class Misbehaving:
    """Wraps the fake; the first ``bad_calls`` calls of ``operation`` answer ``bad()``.

    With ``landed``, the misbehaving call still reaches the fake first (the message is on
    screen), as an adapter that sent and then returned the wrong thing would.
    """

    def __init__(
        self,
        inner: FakePlatform,
        operation: str,
        bad: Callable[[], object],
        *,
        bad_calls: int = 1,
        landed: bool = False,
    ) -> None:
        self.inner, self.operation, self.bad = inner, operation, bad
        self.bad_left, self.landed = bad_calls, landed

    @property
    def profile(self) -> Any:
        return self.inner.profile

    def _answer(self, operation: str, call: Callable[[], WireOutcome]) -> Any:
        if operation != self.operation or self.bad_left == 0:
            return call()
        self.bad_left -= 1
        if self.landed:
            call()
        return self.bad()

    def send(self, request: SendRequest, body: str, *, marked: bool) -> Any:
        return self._answer("send", lambda: self.inner.send(request, body, marked=marked))

    def edit(self, request: SendRequest, message_id: str, body: str, *, marked: bool) -> Any:
        return self._answer(
            "edit", lambda: self.inner.edit(request, message_id, body, marked=marked)
        )

    def delete(self, request: SendRequest, message_id: str) -> Any:
        return self._answer("delete", lambda: self.inner.delete(request, message_id))


async def _async_acked() -> WireOutcome:
    return Delivered("1")


def _generator() -> Iterator[WireOutcome]:
    yield Delivered("1")


BAD_ANSWERS = [
    pytest.param(lambda: Delivered, "the class Delivered itself", id="class-not-instance"),
    pytest.param(lambda: _async_acked(), "a coroutine", id="coroutine"),
    pytest.param(lambda: _generator(), "a generator", id="generator"),
    pytest.param(lambda: RuntimeError("boom"), "an exception instance RuntimeError", id="exc"),
    pytest.param(lambda: None, "a NoneType", id="none"),
    pytest.param(lambda: {"message_id": "7"}, "a dict", id="dict"),
    pytest.param(lambda: "7", "a str", id="str"),
    pytest.param(lambda: Delivered(None), "Delivered with message_id None", id="acked-none"),  # type: ignore[arg-type]
    pytest.param(lambda: Delivered(""), "Delivered with message_id ''", id="acked-empty"),
    pytest.param(lambda: Delivered(7), "Delivered with message_id 7", id="acked-int"),  # type: ignore[arg-type]
    pytest.param(lambda: NotDelivered(retry_after=math.nan), "retry_after nan", id="refused-nan"),
    pytest.param(lambda: NotDelivered(retry_after=True), "retry_after True", id="refused-bool"),
    pytest.param(lambda: MaybeDelivered(reason=3), "MaybeDelivered with reason 3", id="reason-int"),  # type: ignore[arg-type]
]


def _ops(raw: RawDatabase) -> list[tuple[Any, ...]]:
    return raw.query(
        "SELECT slot, kind, state, marked, message_id, error FROM oncewire_reply_ops ORDER BY seq"
    )


def _admit(ledger: Ledger) -> int:
    return ledger.inbound.admit(NAME, "bot", "chat-1", "m-1", {"text": "hi"}).inbound.id


@pytest.mark.parametrize(("bad", "named"), BAD_ANSWERS)
@pytest.mark.parametrize("landed", [False, True], ids=["not-landed", "landed"])
def test_a_malformed_send_answer_is_ambiguous_and_the_resend_is_marked(
    ledger: Ledger,
    raw: RawDatabase,
    fake: FakePlatform,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    bad: Callable[[], object],
    named: str,
    landed: bool,
) -> None:
    engine = ReplyEngine(ledger, {NAME: Misbehaving(fake, "send", bad, landed=landed)})
    with caplog.at_level(logging.ERROR, logger="oncewire.replies"):
        delivery = engine.answer(_admit(ledger), "hello there")
    assert delivery.status == "delivered"
    first, second = _ops(raw)
    assert first[:5] == (0, "send", "ambiguous", 0, None)  # never acked, no invented id
    assert "programming error" in first[5] and named in first[5]
    assert second[:4] == (0, "send", "acked", 1)  # it may have landed: the resend is marked
    assert [r.levelno for r in caplog.records if "WireOutcome" in r.getMessage()] == [logging.ERROR]
    shown = [m.text for m in ChatView([tmp_path / "chat.jsonl"]).visible(NAME, "chat-1")]
    marked = TELEGRAM_LIKE.render("hello there", True)
    assert shown == (["hello there", marked] if landed else [marked])


def test_an_adapter_that_always_misbehaves_ends_dead_and_nothing_is_acked(
    ledger: Ledger, raw: RawDatabase, fake: FakePlatform, tmp_path: Path
) -> None:
    adapter = Misbehaving(fake, "send", lambda: Delivered, bad_calls=99)
    # The manual clock makes every backoff an inline wait: the attempts run out in one call.
    engine = ReplyEngine(ledger, {NAME: adapter}, inline_wait_max_seconds=3600.0)
    delivery = engine.answer(_admit(ledger), "hello there")
    assert delivery.status == "dead"
    ops = _ops(raw)
    assert len(ops) == 9  # 8 attempts (the reply's default), then the "could not deliver" notice
    assert {op[2] for op in ops} == {"ambiguous"}
    assert ops[-1][0] == -1  # the notice went through the same check
    assert raw.query("SELECT state FROM oncewire_replies") == [("dead",)]
    assert ChatView([tmp_path / "chat.jsonl"]).visible(NAME) == []


def test_a_malformed_edit_answer_is_ambiguous_and_the_edit_is_replayed(
    ledger: Ledger, raw: RawDatabase, fake: FakePlatform, tmp_path: Path
) -> None:
    engine = ReplyEngine(ledger, {NAME: Misbehaving(fake, "edit", lambda: Delivered)})
    delivery = engine.stream(_admit(ledger), iter(["hello ", "world"]))
    assert delivery.status == "delivered"
    assert [op[1:4] for op in _ops(raw)] == [
        ("send", "acked", 0),  # the first preview
        ("edit", "ambiguous", 0),  # the malformed answer
        ("edit", "acked", 0),  # edits are idempotent: replayed, no marker needed
    ]
    assert "the class Delivered itself" in _ops(raw)[1][5]
    shown = [m.text for m in ChatView([tmp_path / "chat.jsonl"]).visible(NAME, "chat-1")]
    assert shown == ["hello world"]


# -- adapters refused when the engine is built ---------------------------------------------------


class _AsyncSend:
    profile = TELEGRAM_LIKE

    async def send(self, request: SendRequest, body: str, *, marked: bool) -> WireOutcome:
        return Delivered("1")

    def edit(self, request: SendRequest, message_id: str, body: str, *, marked: bool) -> Any:
        return Delivered(message_id)

    def delete(self, request: SendRequest, message_id: str) -> Any:
        return Delivered(message_id)


class _AsyncEdit(_AsyncSend):
    def send(self, request: SendRequest, body: str, *, marked: bool) -> Any:
        return Delivered("1")

    async def edit(self, request: SendRequest, message_id: str, body: str, *, marked: bool) -> Any:
        return Delivered(message_id)


class _AsyncCallable:
    async def __call__(self, *args: Any, **kwargs: Any) -> WireOutcome:
        return Delivered("1")


class _AsyncCallableDelete(_AsyncEdit):
    edit = _AsyncSend.edit
    delete = _AsyncCallable()


class _GeneratorSend(_AsyncEdit):
    edit = _AsyncSend.edit

    def send(self, request: SendRequest, body: str, *, marked: bool) -> Any:
        yield Delivered("1")


class _AsyncGeneratorSend(_AsyncEdit):
    edit = _AsyncSend.edit

    async def send(self, request: SendRequest, body: str, *, marked: bool) -> Any:
        yield Delivered("1")


class _NoDelete(_AsyncEdit):
    edit = _AsyncSend.edit
    delete = None  # type: ignore[assignment]


class _NoProfile(_AsyncEdit):
    edit = _AsyncSend.edit
    profile = "telegram"  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("adapter", "problem"),
    [
        (_AsyncSend(), "send is async"),
        (_AsyncEdit(), "edit is async"),
        (_AsyncCallableDelete(), "delete is async"),
        (_GeneratorSend(), "send is a generator function"),
        (_AsyncGeneratorSend(), "send is async"),
        (_NoDelete(), "delete must be a method"),
        (_NoProfile(), "profile must be a PlatformProfile, not str"),
    ],
)
def test_an_adapter_that_cannot_answer_is_refused_when_the_engine_is_built(
    ledger: Ledger, raw: RawDatabase, adapter: Any, problem: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"^platform 'fk': {problem}"):
        ReplyEngine(ledger, {NAME: adapter})
    assert raw.count("oncewire_reply_ops") == 0
