"""The generic webhook platform: the adapter against the fake platform as a real child process
(outcomes, signatures, the idempotency key), inbound deliveries retried until answered 2xx, and
the classification without sockets."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx2
import pytest

from oncewire.gateway.http import Timeouts
from oncewire.gateway.platforms.webhook import (
    SIGNATURE_HEADER,
    WebhookInbound,
    WebhookPlatform,
    classify,
    idempotency_key,
    parse_inbound,
    sign,
    verify,
)
from oncewire.replies.wire import (
    NON_EDITABLE,
    Delivered,
    MaybeDelivered,
    NotDelivered,
    RejectedForGood,
)
from oncewire.storage.replies import SendRequest
from oncewire.testing.fake_platform import ChatView
from tests.conftest import _child_env, wait_for
from tests.gateway.conftest import LoopbackServer, PlatformFakeProcess

SECRET = "hook-secret-for-tests"


class Receiver:
    """The gateway's side of inbound: records each delivery, answers the scripted statuses."""

    def __init__(self) -> None:
        self.statuses: list[int] = []  # consumed per delivery; 200 once empty
        self.received: list[tuple[str | None, bytes]] = []
        self.server = LoopbackServer(self._answer)
        self.url = f"{self.server.url}/hook"

    def _answer(
        self, request: BaseHTTPRequestHandler, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        self.received.append((request.headers.get(SIGNATURE_HEADER), body))
        return self.statuses.pop(0) if self.statuses else 200, {}, b""

    def messages(self) -> list[WebhookInbound]:
        return [parse_inbound(body) for _, body in self.received]

    def stop(self) -> None:
        self.server.stop()


class FakeWebhook(PlatformFakeProcess):
    """A running ``python -m oncewire.testing.webhook_platform``."""

    def __init__(self, directory: Path, deliver_to: str, *flags: str) -> None:
        self.directory = directory
        args = ["--port", "0", "--journal", str(directory), "--name", "fk_ne"]
        args += ["--secret-env", "HOOK_SECRET", "--deliver-to", deliver_to, *flags]
        env = _child_env(HOOK_SECRET=SECRET)
        super().__init__("oncewire.testing.webhook_platform", args, env=env)
        self.chat = "c0"

    def platform(
        self, *, secret: str | None = SECRET, read_seconds: float = 5.0
    ) -> WebhookPlatform:
        timeouts = Timeouts(connect_seconds=2.0, read_seconds=read_seconds)
        platform = WebhookPlatform(f"{self.base}/messages", secret=secret, timeouts=timeouts)
        self.adopt(platform)
        return platform

    def to(self, reply_to: str | None = "u1") -> SendRequest:
        return SendRequest("fk_ne", "bot", self.chat, "", reply_to)

    def texts(self) -> list[str]:
        view = ChatView([self.directory / "chat.jsonl"])
        return [m.text for m in view.visible("fk_ne", self.chat)]

    def keys_sent(self) -> list[str | None]:
        path = self.directory / "calls.jsonl"
        return [json.loads(line)["key"] for line in path.read_text().splitlines()]


_chats = itertools.count(1)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[FakeWebhook]:
    fake = FakeWebhook(tmp_path_factory.mktemp("webhook"), receiver.url)
    yield fake
    fake.stop()


@pytest.fixture
def fake(shared: FakeWebhook) -> Iterator[FakeWebhook]:
    """The shared fake, its helpers pointed at a chat of this test's own."""
    shared.chat = f"chat-{next(_chats)}"
    yield shared
    shared.close_adopted()


@pytest.fixture
def start_fake(tmp_path: Path, receiver: Receiver) -> Iterator[Callable[..., FakeWebhook]]:
    started: list[FakeWebhook] = []

    def start(*flags: str) -> FakeWebhook:
        fake = FakeWebhook(tmp_path / f"hook{len(started)}", receiver.url, *flags)
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.stop()


# -- outbound ---------------------------------------------------------------------------------
def test_a_signed_send_is_delivered_and_the_chat_shows_it(fake: FakeWebhook) -> None:
    outcome = fake.platform().send(fake.to(), "the answer", marked=False)

    assert isinstance(outcome, Delivered)
    assert fake.texts() == ["the answer"]


def test_a_wrong_secret_is_refused_and_makes_the_platform_unusable(fake: FakeWebhook) -> None:
    platform = fake.platform(secret="not-the-secret")

    first = platform.send(fake.to(), "hello", marked=False)
    later = platform.send(fake.to(), "hello", marked=False)

    assert isinstance(first, RejectedForGood) and "401" in first.reason
    assert not platform.usable and platform.unusable_reason is not None
    assert isinstance(later, NotDelivered)
    assert fake.texts() == []


def test_edits_and_deletes_are_refused_without_a_call(fake: FakeWebhook) -> None:
    platform = fake.platform()
    calls_before = len(fake.keys_sent())

    assert isinstance(platform.edit(fake.to(), "1", "x", marked=False), RejectedForGood)
    assert isinstance(platform.delete(fake.to(), "1"), RejectedForGood)
    assert len(fake.keys_sent()) == calls_before
    assert platform.profile == NON_EDITABLE


def test_a_rate_limit_is_not_delivered_with_the_retry_after_header(fake: FakeWebhook) -> None:
    fake.call("fault", kind="rate_limit", chat=fake.chat, retry_after=4)

    outcome = fake.platform().send(fake.to(), "soon", marked=False)

    assert outcome == NotDelivered("429 rate limited", retry_after=4.0)


def test_a_refusing_chat_is_refused_for_good(fake: FakeWebhook) -> None:
    fake.call("fault", kind="rejected", chat=fake.chat)

    outcome = fake.platform().send(fake.to(), "hello", marked=False)

    assert isinstance(outcome, RejectedForGood) and "403" in outcome.reason


def test_a_message_over_the_cap_is_refused_for_good(fake: FakeWebhook) -> None:
    outcome = fake.platform().send(fake.to(), "x" * (NON_EDITABLE.cap + 1), marked=False)

    assert outcome == RejectedForGood("400 message is too long")


@pytest.mark.parametrize(("kind", "lands"), [("timeout", False), ("ack_lost", True)])
def test_a_send_without_an_answer_may_have_landed(
    fake: FakeWebhook, kind: str, lands: bool
) -> None:
    fake.call("fault", kind=kind, chat=fake.chat)

    outcome = fake.platform(read_seconds=0.5).send(fake.to(), "maybe", marked=False)

    assert isinstance(outcome, MaybeDelivered) and "ReadTimeout" in outcome.reason
    assert fake.texts() == (["maybe"] if lands else [])


def test_a_send_answering_a_message_carries_a_key_and_a_note_does_not(fake: FakeWebhook) -> None:
    platform = fake.platform()
    before = len(fake.keys_sent())

    platform.send(fake.to("u1"), "an answer", marked=False)
    platform.send(fake.to(None), "a note", marked=False)

    assert fake.keys_sent()[before:] == [idempotency_key(fake.to("u1"), "an answer"), None]


def test_without_the_key_honoured_a_repeat_after_a_lost_answer_is_a_second_copy(
    fake: FakeWebhook,
) -> None:
    fake.call("fault", kind="ack_lost", chat=fake.chat)
    platform = fake.platform(read_seconds=0.5)

    lost = platform.send(fake.to(), "answer", marked=False)
    repeat = platform.send(fake.to(), "answer", marked=False)

    assert isinstance(lost, MaybeDelivered) and isinstance(repeat, Delivered)
    assert fake.texts() == ["answer", "answer"]


def test_with_the_key_honoured_a_repeat_is_the_message_already_made(
    start_fake: Callable[..., FakeWebhook],
) -> None:
    fake = start_fake("--honour-idempotency-key")
    fake.call("fault", kind="ack_lost", chat=fake.chat)
    platform = fake.platform(read_seconds=0.5)

    lost = platform.send(fake.to(), "answer", marked=False)
    repeat = platform.send(fake.to(), "answer", marked=False)
    marked = platform.send(fake.to(), "answer", marked=True)

    assert isinstance(lost, MaybeDelivered)
    assert isinstance(repeat, Delivered) and isinstance(marked, Delivered)
    assert marked.message_id != repeat.message_id
    assert fake.texts() == ["answer", NON_EDITABLE.render("answer", True)]


def test_a_blackout_is_not_delivered(fake: FakeWebhook) -> None:
    platform = fake.platform()
    fake.call("fault", kind="conn_error", blackout_seconds=1.5)
    wait_for(lambda: _refused(fake.base), what="the listener to black out")

    try:
        during = platform.send(fake.to(), "during", marked=False)
    finally:
        wait_for(lambda: _answers(fake.base), what="the listener to come back")

    assert isinstance(during, NotDelivered) and "never left" in during.reason
    assert fake.texts() == []


def _refused(base: str) -> bool:
    try:
        httpx2.post(f"{base}/control/state", timeout=1.0)
    except httpx2.ConnectError:
        return True
    except httpx2.TransportError:
        return False
    return False


def _answers(base: str) -> bool:
    try:
        return httpx2.post(f"{base}/control/state", timeout=1.0).status_code == 200
    except httpx2.TransportError:
        return False


# -- inbound ----------------------------------------------------------------------------------
def test_an_inbound_message_is_signed_and_retried_until_answered(
    fake: FakeWebhook, receiver: Receiver
) -> None:
    receiver.statuses[:] = [500, 503]
    before = len(receiver.received)

    injected = fake.call("inject", chat=fake.chat, text="hi bot", thread="t1")
    wait_for(lambda: len(receiver.received) >= before + 3, what="three delivery attempts")

    deliveries = receiver.received[before:]
    assert all(verify(SECRET, body, signature) for signature, body in deliveries)
    message = WebhookInbound(injected["message_id"], fake.chat, "t1", "hi bot")
    assert [parse_inbound(body) for _, body in deliveries] == [message] * 3

    def inbound() -> dict[str, Any]:
        state = {m["message_id"]: m for m in fake.call("state")["inbound"]}
        return dict(state[injected["message_id"]])

    # The receiver has the third delivery before the fake has read its answer and recorded it.
    wait_for(lambda: inbound()["delivered"], what="the fake to record the answered delivery")
    assert inbound() == {
        "message_id": injected["message_id"],
        "attempts": 3,
        "delivered": True,
    }


def test_a_redelivery_sends_the_same_message_again(fake: FakeWebhook, receiver: Receiver) -> None:
    injected = fake.call("inject", chat=fake.chat, text="again")
    wait_for(lambda: any(m.text == "again" for m in receiver.messages()), what="the delivery")

    fake.call("redeliver", message_id=injected["message_id"])
    wait_for(
        lambda: [m.message_id for m in receiver.messages()].count(injected["message_id"]) == 2,
        what="the redelivery",
    )


def test_bad_control_input_is_refused(fake: FakeWebhook) -> None:
    for action, params in [
        ("inject", {"chat": fake.chat}),
        ("redeliver", {"message_id": "nope"}),
        ("fault", {"kind": "timeout", "target": "footer"}),
    ]:
        answer = fake.control.post(f"/control/{action}", json=params)
        assert answer.status_code == 400, (action, answer.text)


# -- without sockets --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "headers", "body", "expected"),
    [
        (200, {}, b'{"message_id": "m7"}', Delivered("m7")),
        (201, {}, b'{"message_id": 8}', Delivered("8")),
        (200, {}, b"{}", MaybeDelivered),
        (200, {}, b"<html>ok</html>", MaybeDelivered),
        (429, {"retry-after": "12"}, b'{"error": "slow down"}', NotDelivered),
        (500, {}, b'{"error": "boom"}', MaybeDelivered),
        (502, {}, b"Bad Gateway", MaybeDelivered),
        (408, {}, b"", MaybeDelivered),
        (400, {}, b'{"error": "message is too long"}', RejectedForGood),
        (404, {}, b'{"error": "no such chat"}', RejectedForGood),
        (409, {}, b'{"error": "key reused"}', RejectedForGood),
    ],
)
def test_each_answer_classifies_as_the_contract_says(
    status: int, headers: dict[str, str], body: bytes, expected: Any
) -> None:
    outcome = classify(status, headers, body)

    if isinstance(expected, type):
        assert type(outcome) is expected
    else:
        assert outcome == expected
    if status == 429:
        assert outcome == NotDelivered("429 slow down", retry_after=12.0)


def test_a_429_without_a_header_waits_as_its_body_says_or_a_second() -> None:
    assert classify(429, {}, b'{"retry_after": 3}') == NotDelivered('429 {"retry_after": 3}', 3.0)
    assert classify(429, {}, b"") == NotDelivered("429 no body", 1.0)


@pytest.mark.parametrize(
    ("exc_type", "expected"),
    [
        (httpx2.ConnectError, NotDelivered),
        (httpx2.ConnectTimeout, NotDelivered),
        (httpx2.PoolTimeout, NotDelivered),
        (httpx2.ReadTimeout, MaybeDelivered),
        (httpx2.ReadError, MaybeDelivered),
        (httpx2.WriteTimeout, MaybeDelivered),
        (httpx2.RemoteProtocolError, MaybeDelivered),
    ],
)
def test_each_transport_failure_classifies_by_whether_the_request_left(
    exc_type: type[Exception], expected: type
) -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        raise exc_type("simulated", request=request)  # type: ignore[call-arg]

    platform = WebhookPlatform(
        "http://hooks.invalid/messages", transport=httpx2.MockTransport(handler)
    )
    try:
        outcome = platform.send(SendRequest("ne", "bot", "c"), "hi", marked=False)
    finally:
        platform.close()

    assert type(outcome) is expected


def test_signatures_are_over_the_exact_body() -> None:
    body = b'{"chat": "c", "text": "hi"}'

    assert verify(SECRET, body, sign(SECRET, body))
    assert not verify(SECRET, body + b" ", sign(SECRET, body))
    assert not verify("other", body, sign(SECRET, body))
    assert not verify(SECRET, body, None)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"chat": "c", "text": "t"}', "message_id"),
        (b'{"message_id": "", "chat": "c", "text": "t"}', "must not be empty"),
        (b'{"message_id": "m", "chat": true, "text": "t"}', "chat"),
    ],
)
def test_a_bad_inbound_body_is_refused_naming_the_problem(body: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_inbound(body)
