"""The platform contract, as adapters see it.

The contract itself (profiles, typed outcomes, the :class:`Platform` protocol) lives with the
replies ledger, which the reply engine depends on; adapters import it from here.
"""

from oncewire.replies.wire import (
    DEFAULT_MARKER,
    DISCORD_LIKE,
    NON_EDITABLE,
    TELEGRAM_LIKE,
    Delivered,
    Gone,
    MaybeDelivered,
    NotDelivered,
    Platform,
    PlatformProfile,
    RejectedForGood,
    WireOutcome,
)

__all__ = [
    "DEFAULT_MARKER",
    "DISCORD_LIKE",
    "NON_EDITABLE",
    "TELEGRAM_LIKE",
    "Delivered",
    "Gone",
    "MaybeDelivered",
    "NotDelivered",
    "Platform",
    "PlatformProfile",
    "RejectedForGood",
    "WireOutcome",
]
