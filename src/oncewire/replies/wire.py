"""The platform contract: what a chat platform declares, and the typed outcomes it returns.

An adapter decides each outcome where its transport knows whether the request left:

* :class:`Acked`: the platform acknowledged the operation and named the message;
* :class:`Refused`: it never reached the platform (connection refused or reset before the
  request was written, or a 429 with ``retry_after``); safe to repeat, unmarked;
* :class:`Ambiguous`: it may have landed (a timeout after sending, a lost acknowledgement);
* :class:`RejectedPermanently`: the platform refused for good (chat gone, bot blocked).

Nothing above the adapter ever classifies an outcome by reading an error message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from oncewire.core.errors import ConfigurationError
from oncewire.replies.splitting import UNITS, measure
from oncewire.storage.replies import SendRequest

__all__ = [
    "DEFAULT_MARKER",
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

DEFAULT_MARKER = "[possible duplicate: an earlier delivery of this reply may also have arrived]\n"


@dataclass(frozen=True, slots=True)
class PlatformProfile:
    """What a platform can do, and how it counts."""

    name: str
    cap: int  # the longest message, in ``unit``
    unit: str  # "utf16" (Telegram) or "codepoints"
    can_edit: bool
    can_delete: bool
    threads: bool
    marker: str = DEFAULT_MARKER  # rendered before a message that may duplicate a landed one

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ConfigurationError(f"unknown unit {self.unit!r} (one of: {', '.join(UNITS)})")
        if self.cap < 4 * self.marker_cost:
            raise ConfigurationError(f"a cap of {self.cap} leaves no room beside the marker")

    @property
    def marker_cost(self) -> int:
        return measure(self.marker, self.unit)

    def render(self, body: str, marked: bool) -> str:
        """What the platform shows: the marker (counted within the cap) and the body."""
        return self.marker + body if marked else body

    def strip_marker(self, text: str) -> tuple[str, bool]:
        """(body, marked) of a shown text."""
        if text.startswith(self.marker):
            return text[len(self.marker) :], True
        return text, False


TELEGRAM_LIKE = PlatformProfile(
    "telegram", cap=4096, unit="utf16", can_edit=True, can_delete=True, threads=False
)
DISCORD_LIKE = PlatformProfile(
    "discord", cap=2000, unit="codepoints", can_edit=True, can_delete=True, threads=True
)
NON_EDITABLE = PlatformProfile(
    "noedit", cap=4096, unit="codepoints", can_edit=False, can_delete=False, threads=False
)


@dataclass(frozen=True, slots=True)
class Acked:
    """The platform acknowledged the operation; ``message_id`` is the message it made or hit."""

    message_id: str


@dataclass(frozen=True, slots=True)
class Refused:
    """The request never reached the platform; repeat it (after ``retry_after`` seconds)."""

    reason: str = "refused"
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class Ambiguous:
    """The request may have landed; the platform's answer is unknown."""

    reason: str = "outcome unknown"


@dataclass(frozen=True, slots=True)
class RejectedPermanently:
    """The platform refused the operation for good; repeating it cannot help."""

    reason: str = "rejected"


WireOutcome = Acked | Refused | Ambiguous | RejectedPermanently


class Platform(Protocol):
    """A chat platform adapter. ``marked`` asks the adapter to render the duplicate marker.

    Edits and deletes must be idempotent as the engine sees them: an edit to the text a message
    already shows (Telegram's "message is not modified") and a delete of a message already gone
    are :class:`Acked`, because the engine replays them after any uncertainty.
    """

    @property
    def profile(self) -> PlatformProfile: ...

    def send(self, request: SendRequest, body: str, *, marked: bool) -> WireOutcome: ...

    def edit(
        self, request: SendRequest, message_id: str, body: str, *, marked: bool
    ) -> WireOutcome: ...

    def delete(self, request: SendRequest, message_id: str) -> WireOutcome: ...
