"""A local rate limiter per bot: token buckets an adapter consults before each wire call.

A platform answers a burst beyond its limits with 429s (Telegram) or a temporary ban (Discord),
so the adapter keeps under them itself: before every send, edit or delete it asks
:meth:`RateLimiter.take` for a token of the bot's bucket and of the chat's. With none to give,
the adapter makes no call and answers ``NotDelivered(retry_after=<seconds until a token>)``:
the operation never left, so the reply engine repeats it later, unmarked, like a 429.

Telegram's guidance (https://core.telegram.org/bots/faq#my-bot-is-hitting-limits-how-do-i-avoid-this)
is about 30 messages a second per bot, and about one a second in one chat with short bursts
tolerated; :data:`TELEGRAM_DEFAULTS` follows it. The limit of about 20 messages a minute in a
group is not modelled.

Both buckets are taken together or not at all, under one lock: a refused call leaves every
bucket as it was, so a chat that waits does not spend the bot's tokens.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oncewire.core.clock import Clock, SystemClock

if TYPE_CHECKING:
    from oncewire.gateway.config import PlatformConfig

__all__ = ["TELEGRAM_DEFAULTS", "RateLimiter", "RateLimits", "TokenBucket"]

# Chat buckets kept before idle (full) ones are forgotten: a full bucket is the same as none.
_MAX_IDLE_CHATS = 1024


@dataclass(frozen=True)
class RateLimits:
    """Sustained rates (tokens per second) and bursts (tokens a bucket holds) for one bot."""

    rate_per_second: float
    burst: int
    chat_rate_per_second: float
    chat_burst: int

    def __post_init__(self) -> None:
        for name in ("rate_per_second", "chat_rate_per_second"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("burst", "chat_burst"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    @classmethod
    def of(cls, platform: PlatformConfig) -> RateLimits:
        """The limits a ``[[platforms]]`` table sets (its keys of the same names)."""
        return cls(
            rate_per_second=platform.rate_per_second,
            burst=platform.burst,
            chat_rate_per_second=platform.chat_rate_per_second,
            chat_burst=platform.chat_burst,
        )


# ~30 messages a second per bot; ~1 a second per chat, with a burst of 3 so that a streamed
# reply's first send and an early edit are not held back.
TELEGRAM_DEFAULTS = RateLimits(
    rate_per_second=30.0, burst=30, chat_rate_per_second=1.0, chat_burst=3
)


class TokenBucket:
    """``rate_per_second`` tokens a second, holding at most ``burst``; it starts full.

    Not thread-safe on its own: :class:`RateLimiter` holds the lock.
    """

    __slots__ = ("_at", "_tokens", "burst", "rate_per_second")

    def __init__(self, rate_per_second: float, burst: int, now: float) -> None:
        self.rate_per_second = rate_per_second
        self.burst = burst
        self._tokens = float(burst)
        self._at = now

    def refill(self, now: float) -> None:
        # A wall clock that steps back adds nothing (and takes nothing away).
        elapsed = max(0.0, now - self._at)
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.rate_per_second)
        self._at = max(self._at, now)

    def wait_seconds(self) -> float:
        """Seconds until a whole token is there (0 when one is); call :meth:`refill` first."""
        missing = 1.0 - self._tokens
        return 0.0 if missing <= 0 else missing / self.rate_per_second

    def spend(self) -> None:
        self._tokens -= 1.0

    @property
    def full(self) -> bool:
        return self._tokens >= self.burst


class RateLimiter:
    """One bot's bucket and a bucket per chat; thread-safe, reading time from ``clock``."""

    def __init__(self, limits: RateLimits = TELEGRAM_DEFAULTS, *, clock: Clock | None = None):
        self.limits = limits
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._bot = TokenBucket(limits.rate_per_second, limits.burst, self._clock.now())
        self._chats: dict[str, TokenBucket] = {}

    def __repr__(self) -> str:
        return f"RateLimiter({self.limits!r})"

    def take(self, chat: str) -> float:
        """Take a token for one call to ``chat``: 0.0 when taken, else the seconds until both
        the bot and the chat have one (nothing is taken then)."""
        with self._lock:
            now = self._clock.now()
            bucket = self._chats.get(chat)
            if bucket is None:
                self._forget_idle_chats(now)
                bucket = TokenBucket(self.limits.chat_rate_per_second, self.limits.chat_burst, now)
                self._chats[chat] = bucket
            self._bot.refill(now)
            bucket.refill(now)
            wait = max(self._bot.wait_seconds(), bucket.wait_seconds())
            if wait > 0:
                return wait
            self._bot.spend()
            bucket.spend()
            return 0.0

    def _forget_idle_chats(self, now: float) -> None:
        if len(self._chats) < _MAX_IDLE_CHATS:
            return
        for chat, bucket in list(self._chats.items()):
            bucket.refill(now)
            if bucket.full:
                del self._chats[chat]
