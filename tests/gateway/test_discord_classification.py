"""The Discord adapter's classification table for the shapes the fake cannot produce, through
httpx2's MockTransport (each transport exception, 5xx, a 429 from a proxy, a global 429, 401,
a 2xx without an id), and the Gateway client refusing for good on close codes 4004 and 4014
against the fake Discord."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest

from oncewire.gateway.platforms.discord import (
    BLOCKED_WAIT_SECONDS,
    DiscordApi,
    DiscordBot,
    nonce_for,
)
from oncewire.gateway.platforms.discord_gateway import GatewayClient, GatewayRefused
from oncewire.replies.wire import Delivered, MaybeDelivered, NotDelivered, RejectedForGood
from oncewire.storage.replies import SendRequest
from tests.gateway.test_discord_wire import TOKEN, FakeDiscord

REQUEST = SendRequest("dc", "bot", "123", idempotency_key="ow-key")


def adapter(handler: Callable[[httpx2.Request], httpx2.Response]) -> DiscordBot:
    return DiscordBot(
        TOKEN, api_base="http://discord.test/api/v10", transport=httpx2.MockTransport(handler)
    )


def raising(exc: type[Exception]) -> Callable[[httpx2.Request], httpx2.Response]:
    def handler(request: httpx2.Request) -> httpx2.Response:
        raise exc("boom", request=request)  # type: ignore[call-arg]

    return handler


def answering(status: int, body: Any = None, **headers: str) -> Callable[..., httpx2.Response]:
    def handler(request: httpx2.Request) -> httpx2.Response:
        if body is None:
            return httpx2.Response(status, headers=headers)
        if isinstance(body, bytes):
            return httpx2.Response(status, content=body, headers=headers)
        return httpx2.Response(status, json=body, headers=headers)

    return handler


@pytest.mark.parametrize(
    ("failure", "outcome"),
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
def test_transport_failures(failure: type[Exception], outcome: type) -> None:
    bot = adapter(raising(failure))
    assert isinstance(bot.send(REQUEST, "x", marked=False), outcome)
    assert isinstance(bot.edit(REQUEST, "9", "x", marked=False), outcome)
    bot.close()


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_a_5xx_may_have_landed(status: int) -> None:
    bot = adapter(answering(status, {"message": "oops", "code": 0}))
    assert isinstance(bot.send(REQUEST, "x", marked=False), MaybeDelivered)
    bot.close()


def test_a_2xx_create_without_an_id_may_have_landed() -> None:
    bot = adapter(answering(200, b"not json"))
    assert isinstance(bot.send(REQUEST, "x", marked=False), MaybeDelivered)
    bot.close()


def test_a_429_without_discords_body_is_a_long_wait() -> None:
    bot = adapter(answering(429, b"<html>banned</html>", **{"Retry-After": "5"}))
    result = bot.send(REQUEST, "x", marked=False)
    assert isinstance(result, NotDelivered) and result.retry_after == BLOCKED_WAIT_SECONDS
    bot.close()


def test_a_global_429_stops_every_route() -> None:
    calls: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        calls.append(request.url.path)
        body = {"message": "You are being rate limited.", "retry_after": 12.5, "global": True}
        return httpx2.Response(429, json=body)

    bot = adapter(handler)
    first = bot.send(REQUEST, "x", marked=False)
    other = bot.edit(SendRequest("dc", "bot", "456"), "9", "y", marked=False)

    assert isinstance(first, NotDelivered) and first.retry_after == 12.5
    assert isinstance(other, NotDelivered) and "not called" in other.reason
    assert calls == ["/api/v10/channels/123/messages"]
    bot.close()


def test_a_refused_token_makes_the_bot_unusable_and_nothing_is_called_again() -> None:
    calls: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        calls.append(request.headers["authorization"])
        return httpx2.Response(401, json={"message": "401: Unauthorized", "code": 0})

    bot = adapter(handler)
    assert isinstance(bot.send(REQUEST, "x", marked=False), NotDelivered)
    assert isinstance(bot.send(REQUEST, "x", marked=False), NotDelivered)
    assert calls == [f"Bot {TOKEN}"] and not bot.usable
    bot.close()


@pytest.mark.parametrize(
    ("status", "code"), [(403, 50013), (403, 50001), (403, 50007), (400, 50035)]
)
def test_refusals_for_good(status: int, code: int) -> None:
    bot = adapter(answering(status, {"message": "no", "code": code}))
    result = bot.send(REQUEST, "x", marked=False)
    assert isinstance(result, RejectedForGood) and str(code) in result.reason
    bot.close()


def test_an_echoed_token_is_redacted_from_a_reason() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ReadError(f"token {TOKEN} in an error", request=request)

    bot = adapter(handler)
    result = bot.send(REQUEST, "x", marked=False)
    assert isinstance(result, MaybeDelivered) and TOKEN not in result.reason
    bot.close()


def test_a_delete_of_an_unknown_message_is_done() -> None:
    bot = adapter(answering(404, {"message": "Unknown Message", "code": 10008}))
    assert bot.delete(REQUEST, "9") == Delivered("9")
    bot.close()


def test_the_nonce_is_25_characters_and_the_same_for_one_slot() -> None:
    assert len(nonce_for(REQUEST, "a")) == 25
    assert nonce_for(REQUEST, "a") == nonce_for(REQUEST, "b")  # the key decides, not the text
    other = SendRequest("dc", "bot", "123", idempotency_key="ow-other")
    assert nonce_for(other, "a") != nonce_for(REQUEST, "a")


@pytest.mark.parametrize(
    ("args", "token", "code"),
    [((), "wrong-token", 4004), (("--allowed-intents", str(1 << 9)), TOKEN, 4014)],
)
def test_the_gateway_refuses_a_bad_token_or_intents_for_good(
    tmp_path: Path, args: tuple[str, ...], token: str, code: int
) -> None:
    fake = FakeDiscord(tmp_path / "discord", *args)
    api = DiscordApi(TOKEN, api_base=fake.api_base)  # REST works; the Gateway refuses
    try:
        client = GatewayClient(token, api, lambda message: None)
        with pytest.raises(GatewayRefused, match=str(code)):
            client.run()
        assert fake.call("state")["sessions"] == []
    finally:
        api.close()
        fake.stop()
