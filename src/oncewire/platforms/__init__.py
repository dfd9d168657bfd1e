"""platforms: chat platform adapters (the journaled fake, for tests and the lab)."""

from oncewire.platforms.base import (
    DISCORD_LIKE,
    NON_EDITABLE,
    TELEGRAM_LIKE,
    Acked,
    Ambiguous,
    Platform,
    PlatformProfile,
    Refused,
    RejectedPermanently,
    WireOutcome,
)

__all__ = [
    "DISCORD_LIKE",
    "NON_EDITABLE",
    "TELEGRAM_LIKE",
    "Acked",
    "Ambiguous",
    "Platform",
    "PlatformProfile",
    "Refused",
    "RejectedPermanently",
    "WireOutcome",
]
