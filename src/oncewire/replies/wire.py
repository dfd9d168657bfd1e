"""The platform contract: what a chat platform declares, and the typed outcomes it returns.

An adapter decides each outcome where its transport knows whether the request left:

* :class:`Delivered`: the platform acknowledged the operation and named the message;
* :class:`NotDelivered`: it never reached the platform (connection refused or reset before the
  request was written, or a 429 with ``retry_after``); safe to repeat, unmarked;
* :class:`MaybeDelivered`: it may have landed (a timeout after sending, a lost acknowledgement);
* :class:`RejectedForGood`: the platform refused for good (chat gone, bot blocked);
* :class:`Gone`: an edit or delete found its target message deleted by someone else (Telegram's
  "message to edit not found"); the engine sends that chunk again as a new message.

Nothing above the adapter ever classifies an outcome by reading an error message.

An adapter that answers anything else (a coroutine from an ``async def``, the class
``Delivered`` instead of an instance, an exception returned instead of raised, a ``Delivered``
without a message id) has a programming error: :func:`vet_outcome` turns its answer into
:class:`MaybeDelivered`, never an acknowledgement, and logs it at ERROR. :func:`check_platform`
refuses, when an engine is built, an adapter whose operations cannot return an outcome at all
(generators; ``async def`` ones unless the engine awaits them:
:class:`oncewire.aio.AsyncReplyEngine`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
from dataclasses import dataclass
from typing import Protocol

from oncewire.core.errors import ConfigurationError
from oncewire.core.limits import MAX_RETRY_SECONDS
from oncewire.replies.splitting import UNITS, measure
from oncewire.storage.replies import SendRequest

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
    "check_platform",
    "idempotency_key",
    "vet_outcome",
]

log = logging.getLogger("oncewire.replies")

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
    # How long the platform drops a repeated send with the same idempotency key (a Discord
    # nonce: minutes; a webhook honouring Idempotency-Key: math.inf). Inside it, a send that may
    # have landed is repeated unmarked with the same body and key; 0: the platform keeps none.
    idempotent_send_window_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ConfigurationError(f"unknown unit {self.unit!r} (one of: {', '.join(UNITS)})")
        window = self.idempotent_send_window_seconds
        if (
            type(window) is bool
            or not isinstance(window, int | float)
            or math.isnan(window)
            or window < 0
        ):
            raise ConfigurationError(
                f"idempotent_send_window_seconds must be a number of seconds >= 0 (or math.inf), "
                f"not {window!r}"
            )
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
class Delivered:
    """The platform acknowledged the operation; ``message_id`` is the message it made or hit."""

    message_id: str


@dataclass(frozen=True, slots=True)
class NotDelivered:
    """The request never reached the platform; repeat it (after ``retry_after`` seconds).

    ``retry_after`` (seconds, finite, not negative) is the platform's wish; more than
    :data:`~oncewire.core.limits.MAX_RETRY_SECONDS` (a day) is clamped to it, as an effect's
    ``NotSent`` is: longer is "later", not "never", and the reply is tried again after the
    limit. Any other value is the adapter's mistake, vetted where the engine reads the outcome.
    """

    reason: str = "refused"
    retry_after: float | None = None

    def __post_init__(self) -> None:
        wait = self.retry_after
        if type(wait) is float and not math.isfinite(wait):
            return  # not a number of seconds: refused by the vetting, not made one
        if type(wait) in (int, float) and wait > MAX_RETRY_SECONDS:  # type: ignore[operator]
            object.__setattr__(self, "retry_after", float(MAX_RETRY_SECONDS))


@dataclass(frozen=True, slots=True)
class MaybeDelivered:
    """The request may have landed; the platform's answer is unknown."""

    reason: str = "outcome unknown"


@dataclass(frozen=True, slots=True)
class RejectedForGood:
    """The platform refused the operation for good; repeating it cannot help."""

    reason: str = "rejected"


@dataclass(frozen=True, slots=True)
class Gone:
    """The edited or deleted message no longer exists: someone else deleted it.

    Only an edit or a delete can answer it (a send has no target). The slot it targeted shows
    nothing, so the engine sends that chunk again as a new message, unmarked unless an earlier
    send of the slot may have landed as well, and records the new message id on the slot.
    """

    reason: str = "message not found"


WireOutcome = Delivered | NotDelivered | MaybeDelivered | RejectedForGood | Gone


def idempotency_key(
    request: SendRequest, inbound_message_id: str, slot: int, generation: int = 0
) -> str:
    """The idempotency key of every send of one chunk slot of the reply to one inbound message,
    as an adapter sees it on ``request.idempotency_key``.

    A repeat of a send that may have landed carries the same key, so a platform that drops
    repeated keys shows the chunk once. The key names the chat and the platform's id of the
    message answered, not a store's row id, so two stores answering one platform never share a
    key. ``generation`` counts the slot's messages someone else deleted (:class:`Gone`): the
    chunk sent again after that is a new message, with a new key.
    """
    place = [
        request.platform,
        request.bot,
        request.chat,
        request.thread,
        inbound_message_id,
        slot,
        generation,
    ]
    return "ow-" + hashlib.sha256(json.dumps(place).encode()).hexdigest()[:40]


class Platform(Protocol):
    """A chat platform adapter. ``marked`` asks the adapter to render the duplicate marker.

    Edits and deletes must be idempotent as the engine sees them: an edit to the text a message
    already shows (Telegram's "message is not modified") and a delete of a message already gone
    are :class:`Delivered`, because the engine replays them after any uncertainty.
    """

    @property
    def profile(self) -> PlatformProfile: ...

    def send(self, request: SendRequest, body: str, *, marked: bool) -> WireOutcome: ...

    def edit(
        self, request: SendRequest, message_id: str, body: str, *, marked: bool
    ) -> WireOutcome: ...

    def delete(self, request: SendRequest, message_id: str) -> WireOutcome: ...


_OPERATIONS = ("send", "edit", "delete")


def check_platform(name: str, platform: object, *, awaited: bool = False) -> None:
    """ConfigurationError unless ``platform`` has a profile and synchronous operations.

    The reply engine calls an adapter and records what it returns: an ``async def`` operation
    returns a coroutine that nobody awaits (the message is never sent), a generator function a
    generator. Both are refused here rather than found out one reply at a time. ``awaited``:
    the caller awaits what an operation returns (:class:`oncewire.aio.AsyncReplyEngine`), so
    ``async def`` operations are accepted; generators never are.
    """
    try:
        profile = getattr(platform, "profile", None)
    except Exception as exc:  # a property that raises
        raise ConfigurationError(f"platform {name!r}: reading its profile failed: {exc!r}") from exc
    if not isinstance(profile, PlatformProfile):
        raise ConfigurationError(
            f"platform {name!r}: profile must be a PlatformProfile, not {type(profile).__name__}"
        )
    for operation in _OPERATIONS:
        method = getattr(platform, operation, None)
        if not callable(method):
            raise ConfigurationError(f"platform {name!r}: {operation} must be a method")
        for fn in (method, type(method).__call__):  # a callable object: its __call__
            if not awaited and (inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)):
                raise ConfigurationError(
                    f"platform {name!r}: {operation} is async; ReplyEngine calls adapters "
                    "synchronously and records what they return: use "
                    "oncewire.aio.AsyncReplyEngine, which awaits them"
                )
            if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
                raise ConfigurationError(
                    f"platform {name!r}: {operation} is a generator function; it must return "
                    "a WireOutcome"
                )


def _described(answer: object) -> str:
    if isinstance(answer, type):
        return f"the class {answer.__name__} itself (not an instance)"
    if inspect.iscoroutine(answer):
        answer.close()  # never awaited, and never will be: no "never awaited" warning later
        return "a coroutine (an async adapter: nothing awaited it, so nothing was sent)"
    if isinstance(answer, BaseException):
        return f"an exception instance {type(answer).__name__} (returned, not raised)"
    return f"a {type(answer).__name__}"


def _malformed(answer: object, operation: str) -> str | None:
    """What is wrong with ``answer`` as a WireOutcome of ``operation``, or None."""
    if isinstance(answer, Gone) and operation == "send":
        return "Gone from a send (only an edit or a delete has a target that can be gone)"
    if isinstance(answer, Delivered):
        if type(answer.message_id) is str and answer.message_id:
            return None
        return f"Delivered with message_id {answer.message_id!r}, not a message id string"
    if isinstance(answer, NotDelivered):
        after = answer.retry_after
        if after is not None and (
            type(after) is bool
            or not isinstance(after, int | float)
            or not math.isfinite(after)
            or after < 0
        ):
            return f"NotDelivered with retry_after {after!r}, not a finite number of seconds >= 0"
    elif not isinstance(answer, MaybeDelivered | RejectedForGood | Gone):
        return _described(answer)
    if not isinstance(answer.reason, str):
        return f"{type(answer).__name__} with reason {answer.reason!r}, not a string"
    return None


def vet_outcome(answer: object, operation: str, reply_id: int) -> WireOutcome:
    """``answer`` if it is a well-formed :data:`WireOutcome`; else :class:`MaybeDelivered`.

    A malformed answer is a programming error in the adapter, and it proves nothing about the
    chat: the operation may have landed (a send is then repeated with the duplicate marker), so
    it is recorded as ambiguous, never acknowledged, and logged at ERROR.
    """
    problem = _malformed(answer, operation)
    if problem is None:
        return answer  # type: ignore[return-value]  # _malformed checked its type
    log.error(
        "platform adapter returned no WireOutcome",
        extra={"reply_id": reply_id, "operation": operation, "problem": problem},
    )
    return MaybeDelivered(
        f"programming error: the platform adapter's {operation} returned {problem}, "
        "not a WireOutcome; it may have landed"
    )
