"""platforms: chat platform adapters (the journaled fake, for tests and the lab)."""

from oncewire.platforms.base import (
    DISCORD_LIKE,
    NON_EDITABLE,
    TELEGRAM_LIKE,
    Delivered,
    MaybeDelivered,
    NotDelivered,
    Platform,
    PlatformProfile,
    RejectedForGood,
    WireOutcome,
)

__all__ = [
    "DISCORD_LIKE",
    "NON_EDITABLE",
    "TELEGRAM_LIKE",
    "Delivered",
    "MaybeDelivered",
    "NotDelivered",
    "Platform",
    "PlatformProfile",
    "RejectedForGood",
    "WireOutcome",
]
