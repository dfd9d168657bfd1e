"""The per-bot rate limiter: token buckets under a manual clock, its config keys, and the Telegram
adapter refusing on the real wire without a request reaching the fake Bot API."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncewire.core.clock import ManualClock
from oncewire.core.errors import ConfigurationError
from oncewire.gateway.config import parse_config
from oncewire.gateway.http import Timeouts
from oncewire.gateway.platforms.telegram import TelegramBot
from oncewire.gateway.ratelimit import TELEGRAM_DEFAULTS, RateLimiter, RateLimits
from oncewire.replies.wire import Delivered, NotDelivered
from tests.gateway.test_telegram_wire import TOKEN, FakeTelegram


def limits(
    rate: float = 10.0, burst: int = 5, chat_rate: float = 1.0, chat_burst: int = 2
) -> RateLimits:
    return RateLimits(
        rate_per_second=rate, burst=burst, chat_rate_per_second=chat_rate, chat_burst=chat_burst
    )


# -- buckets ----------------------------------------------------------------------------------
def test_a_chat_gets_its_burst_then_waits_one_token_interval() -> None:
    clock = ManualClock()
    limiter = RateLimiter(limits(chat_rate=2.0, chat_burst=3), clock=clock)

    assert [limiter.take("c") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("c") == pytest.approx(0.5)
    clock.advance(0.25)
    assert limiter.take("c") == pytest.approx(0.25)
    clock.advance(0.25)
    assert limiter.take("c") == 0.0


def test_the_bot_bucket_bounds_every_chat_together() -> None:
    clock = ManualClock()
    limiter = RateLimiter(limits(rate=4.0, burst=2, chat_burst=5), clock=clock)

    assert limiter.take("a") == 0.0
    assert limiter.take("b") == 0.0
    assert limiter.take("c") == pytest.approx(0.25)  # a fresh chat, but the bot has no token


def test_a_refused_take_spends_nothing() -> None:
    clock = ManualClock()
    limiter = RateLimiter(limits(rate=10.0, burst=3, chat_burst=1), clock=clock)

    assert limiter.take("busy") == 0.0
    for _ in range(5):
        assert limiter.take("busy") == pytest.approx(1.0)  # the chat waits...
    # ...without spending the bot's tokens: two are left for other chats.
    assert (limiter.take("x"), limiter.take("y")) == (0.0, 0.0)
    assert limiter.take("z") > 0


def test_a_clock_stepping_back_adds_no_tokens() -> None:
    clock = ManualClock()
    limiter = RateLimiter(limits(chat_burst=1), clock=clock)
    assert limiter.take("c") == 0.0

    clock.advance(-30.0)
    assert limiter.take("c") == pytest.approx(1.0)
    clock.advance(30.0)  # back where it was: still nothing earned
    assert limiter.take("c") == pytest.approx(1.0)
    clock.advance(1.0)
    assert limiter.take("c") == 0.0


def test_threads_taking_at_once_get_exactly_the_burst() -> None:
    limiter = RateLimiter(limits(burst=50, chat_burst=1000), clock=ManualClock())
    taken: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def worker() -> None:
        start.wait()
        for _ in range(25):
            wait = limiter.take("shared")
            with lock:
                taken.append(wait)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(taken) == 200
    assert taken.count(0.0) == 50


def test_many_idle_chats_are_forgotten_and_behave_as_new() -> None:
    clock = ManualClock()
    limiter = RateLimiter(limits(rate=1e6, burst=100_000, chat_burst=1), clock=clock)
    for chat in range(2000):
        assert limiter.take(str(chat)) == 0.0
    clock.advance(5.0)  # every chat's bucket refilled
    assert limiter.take("new") == 0.0
    assert len(limiter._chats) < 1024  # the full ones were dropped
    assert limiter.take("0") == 0.0  # a forgotten chat starts full, as it would have been


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rate_per_second", 0),
        ("rate_per_second", float("inf")),
        ("chat_rate_per_second", -1.0),
        ("burst", 0),
        ("chat_burst", 1.5),
        ("burst", True),
    ],
)
def test_bad_limits_are_refused_naming_the_field(field: str, value: object) -> None:
    values: dict[str, object] = {
        "rate_per_second": 1.0,
        "burst": 1,
        "chat_rate_per_second": 1.0,
        "chat_burst": 1,
    }
    values[field] = value
    with pytest.raises(ValueError, match=field):
        RateLimits(**values)  # type: ignore[arg-type]


# -- configuration ----------------------------------------------------------------------------
TELEGRAM = '[[platforms]]\nname = "tg"\nkind = "telegram"\n'


def test_telegram_platforms_default_to_telegrams_documented_limits() -> None:
    [platform] = parse_config(TELEGRAM, Path("gateway.toml")).platforms

    assert RateLimits.of(platform) == TELEGRAM_DEFAULTS
    assert (TELEGRAM_DEFAULTS.rate_per_second, TELEGRAM_DEFAULTS.chat_rate_per_second) == (30, 1)


def test_the_rate_keys_set_the_limits() -> None:
    text = TELEGRAM + "rate_per_second = 5\nburst = 7\nchat_rate_per_second = 0.5\nchat_burst = 2\n"
    [platform] = parse_config(text, Path("gateway.toml")).platforms

    assert RateLimits.of(platform) == RateLimits(5.0, 7, 0.5, 2)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("rate_per_second = 0", "rate_per_second: must be a number per second > 0, got 0"),
        ('chat_rate_per_second = "1"', "chat_rate_per_second: must be a number per second > 0"),
        ("burst = 0", "burst: must be an integer >= 1, got 0"),
        ("chat_burst = 2.5", "chat_burst: must be an integer >= 1, got 2.5"),
    ],
)
def test_bad_rate_keys_name_the_entry_and_key(line: str, expected: str) -> None:
    with pytest.raises(ConfigurationError, match=f"\\[\\[platforms\\]\\] #1 {expected}"):
        parse_config(TELEGRAM + line + "\n", Path("gateway.toml"))


def test_a_webhook_platform_has_no_rate_keys() -> None:
    text = '[[platforms]]\nname = "h"\nkind = "webhook"\nsend_url = "http://x/m"\nburst = 3\n'
    with pytest.raises(ConfigurationError, match="burst: unknown key"):
        parse_config(text, Path("gateway.toml"))


# -- on the real wire -------------------------------------------------------------------------
@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeTelegram]:
    started = FakeTelegram(tmp_path / "tg")
    started.chat = "5151"
    started.inject()  # the chat exists once its user wrote to the bot
    yield started
    started.stop()


def test_without_a_token_telegram_is_not_called_and_the_wait_is_the_retry_after(
    fake: FakeTelegram,
) -> None:
    clock = ManualClock()
    limiter = RateLimiter(limits(chat_rate=0.5, chat_burst=1), clock=clock)
    bot = fake.adopt(
        TelegramBot(
            TOKEN,
            api_base=fake.base,
            timeouts=Timeouts(connect_seconds=2.0, read_seconds=5.0),
            limiter=limiter,
        )
    )
    sent = bot.send(fake.to(), "first", marked=False)
    assert isinstance(sent, Delivered)

    refused = [
        bot.send(fake.to(), "second", marked=False),
        bot.edit(fake.to(), sent.message_id, "first, edited", marked=False),
        bot.delete(fake.to(), sent.message_id),
    ]

    for outcome in refused:
        assert isinstance(outcome, NotDelivered)
        assert outcome.retry_after == pytest.approx(2.0)
        assert "local rate limit" in outcome.reason
    assert [c["method"] for c in fake.calls()] == ["sendMessage"]  # nothing else reached it
    assert fake.texts() == ["first"]

    clock.advance(2.0)
    edited = bot.edit(fake.to(), sent.message_id, "first, edited", marked=False)

    assert edited == Delivered(sent.message_id)
    assert [c["method"] for c in fake.calls()] == ["sendMessage", "editMessageText"]
    assert fake.texts() == ["first, edited"]
