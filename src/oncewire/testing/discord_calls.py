"""The fake Discord's side of a REST call: errors shaped as Discord shapes them, its per-route
rate-limit buckets and 429s, snowflakes and timestamps.

Shared by the fake's REST routes (:mod:`oncewire.testing.discord_api`); it imports nothing of them.
"""

from __future__ import annotations

import datetime
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DISCORD_EPOCH_MS",
    "Buckets",
    "DiscordError",
    "Reply",
    "form_error",
    "iso",
    "rate_limited",
    "snowflake",
    "unknown_message",
]

DISCORD_EPOCH_MS = 1_420_070_400_000

Reply = tuple[int, Any, dict[str, str]]  # (status, body or None for no answer, headers)


class DiscordError(Exception):
    """A Discord error answer: ``{"message", "code"}`` (and ``errors`` for a form error)."""

    def __init__(self, status: int, code: int, message: str, errors: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body: dict[str, Any] = {"message": message, "code": code}
        if errors is not None:
            self.body["errors"] = errors


def unknown_message() -> DiscordError:
    return DiscordError(404, 10008, "Unknown Message")


def form_error(field: str, code: str, message: str) -> DiscordError:
    errors = {field: {"_errors": [{"code": code, "message": message}]}}
    return DiscordError(400, 50035, "Invalid Form Body", errors)


def snowflake(ms: float) -> int:
    """The snowflake of a moment (milliseconds since the Unix epoch), its low bits zero."""
    return (int(ms) - DISCORD_EPOCH_MS) << 22


def iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat()


class Buckets:
    """Per-route rate limits as Discord reports them: a fixed window per bucket."""

    def __init__(self, limit: int, seconds: float) -> None:
        self.limit = limit
        self.seconds = seconds
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[float, int]] = {}  # bucket -> (window start, calls)

    def take(self, bucket: str) -> tuple[bool, dict[str, str]]:
        """(allowed, the X-RateLimit headers of the answer)."""
        now = time.time()
        with self._lock:
            start, calls = self._windows.get(bucket, (now, 0))
            if now - start >= self.seconds:
                start, calls = now, 0
            allowed = calls < self.limit
            if allowed:
                calls += 1
            self._windows[bucket] = (start, calls)
        reset_after = max(0.001, start + self.seconds - now)
        return allowed, {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.limit - calls),
            "X-RateLimit-Reset": f"{start + self.seconds:.3f}",
            "X-RateLimit-Reset-After": f"{reset_after:.3f}",
            "X-RateLimit-Bucket": bucket,
        }


def rate_limited(retry_after: float, headers: Mapping[str, str]) -> Reply:
    """Discord's 429 for a route: its JSON body and headers."""
    body = {"message": "You are being rate limited.", "retry_after": retry_after, "global": False}
    return (
        429,
        body,
        {
            **headers,
            "Retry-After": str(max(1, math.ceil(retry_after))),
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset-After": f"{retry_after:.3f}",
            "X-RateLimit-Scope": "user",
            "Via": "1.1 google",
        },
    )
