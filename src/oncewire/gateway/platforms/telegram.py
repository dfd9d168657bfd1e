"""Telegram over plain HTTP against the Bot API: the reply adapter and the ``getMe`` check.

Every method is ``POST {api_base}/bot{token}/{method}`` with a JSON body, answered by
``{"ok": true, "result": ...}`` or ``{"ok": false, "error_code", "description", "parameters":
{"retry_after", "migrate_to_chat_id"}}``. :class:`TelegramBot` makes one call per operation,
never retries, and classifies each answer itself (:func:`classify`):

====================================================  ==========================================
what happened                                         outcome
====================================================  ==========================================
failed while connecting, or waiting for a connection  ``NotDelivered`` (never left)
failed after the request started going out            ``MaybeDelivered``
429 with ``parameters.retry_after``                   ``NotDelivered(retry_after)``
5xx, or a 2xx that cannot be read                     ``MaybeDelivered``
an edit: :data:`NOT_MODIFIED`                         ``Delivered`` (it shows that text already)
an edit: :data:`EDIT_TARGET_NOT_FOUND`                ``Gone`` (someone deleted it)
a delete: :data:`DELETE_TARGET_NOT_FOUND`             ``Delivered`` (already gone)
403 (:data:`BOT_BLOCKED`, kicked), any other 4xx      ``RejectedForGood``
(:data:`CHAT_NOT_FOUND`, :data:`MESSAGE_TOO_LONG`,
a group that moved to ``migrate_to_chat_id``)
401, or 404 for a method (a bad token)                ``RejectedForGood``; the bot is unusable
====================================================  ==========================================

Telegram answers 400 for many distinct cases and says descriptions may change, so only the
three descriptions that change an outcome are read, each by a prefix named here. A message
someone else deleted before an edit (:data:`EDIT_TARGET_NOT_FOUND`) is ``Gone``: the engine sends
that chunk again as a new message, unmarked.

With a :class:`~oncewire.gateway.ratelimit.RateLimiter`, every send, edit and delete first takes
a token of the bot's bucket and of the chat's; when there is none the operation answers
``NotDelivered(retry_after=<seconds until a token>)`` without a call, so it is repeated later
unmarked.

Once the Bot API refuses the token (401, or 404 for a method that exists),
:attr:`TelegramBot.unusable_reason` says so and every later operation answers ``NotDelivered``
without a call: the replies wait, unmarked, for an adapter with a working token instead of
being given up.

:meth:`TelegramBot.set_webhook` and :meth:`TelegramBot.delete_webhook` switch the bot between
webhook mode (Telegram POSTs each update to a URL with a secret token) and long polling; a
webhook the Bot API refuses (a bad URL or secret token) is :class:`WebhookRefused`.

The token is part of every URL. It never appears in a log line, an exception, a reason or a
repr: requests carry a placeholder and only the transport puts the token in its place.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from oncewire.core.errors import OncewireError
from oncewire.gateway.http import (
    Client,
    PathSecret,
    Reach,
    Timeouts,
    Transport,
    TransportError,
    make_client,
    reach,
)
from oncewire.gateway.ratelimit import RateLimiter
from oncewire.replies.wire import (
    TELEGRAM_LIKE,
    Delivered,
    Gone,
    MaybeDelivered,
    NotDelivered,
    PlatformProfile,
    RejectedForGood,
    WireOutcome,
)
from oncewire.storage.replies import SendRequest

__all__ = [
    "BOT_BLOCKED",
    "CHAT_NOT_FOUND",
    "DELETE_TARGET_NOT_FOUND",
    "EDIT_TARGET_NOT_FOUND",
    "GENERAL_TOPIC",
    "MESSAGE_TOO_LONG",
    "NOT_MODIFIED",
    "POLL_CONFLICT",
    "Answer",
    "BotApi",
    "BotIdentity",
    "BotUnauthorized",
    "PollConflict",
    "TelegramBot",
    "TelegramError",
    "TelegramUnavailable",
    "WebhookRefused",
    "classify",
    "raise_for",
]

log = logging.getLogger("oncewire.gateway.telegram")

DEFAULT_API_BASE = "https://api.telegram.org"
# Reply calls answer at once; a stalled one is ambiguous after this long.
REPLY_TIMEOUTS = Timeouts(read_seconds=10.0)

# Description prefixes, as the Bot API words them. Only the first three change an outcome.
NOT_MODIFIED = "Bad Request: message is not modified"
DELETE_TARGET_NOT_FOUND = "Bad Request: message to delete not found"
# A message deleted by someone else: the edit is Gone, and the engine sends the chunk again.
EDIT_TARGET_NOT_FOUND = "Bad Request: message to edit not found"
CHAT_NOT_FOUND = "Bad Request: chat not found"
BOT_BLOCKED = "Forbidden: bot was blocked by the user"
MESSAGE_TOO_LONG = "Bad Request: message is too long"
POLL_CONFLICT = "Conflict: terminated by other getUpdates request"

# The forum's General topic: sendMessage refuses message_thread_id=1, the message goes there
# when no thread is given.
GENERAL_TOPIC = "1"

# A webhook's secret token, as the Bot API allows it.
_SECRET_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,256}\Z")

# The placeholder requests carry where the URL needs the token.
_TOKEN_PLACEHOLDER = "TOKEN"


class TelegramError(OncewireError):
    """A Telegram Bot API call failed."""

    code = "telegram_error"


class BotUnauthorized(TelegramError):
    """The Bot API refused the bot token (401, or 404 for a method): fix the token."""

    code = "telegram_unauthorized"


class PollConflict(TelegramError):
    """Another getUpdates poller (or a webhook) serves this bot; only one may."""

    code = "telegram_poll_conflict"


class TelegramUnavailable(TelegramError):
    """The Bot API could not be reached or failed; try again (after ``retry_after``)."""

    code = "telegram_unavailable"

    def __init__(self, message: str | None = None, *, retry_after: float | None = None) -> None:
        super().__init__(message, retry_after=retry_after)
        self.retry_after = retry_after


class WebhookRefused(TelegramError):
    """The Bot API refused the webhook (its URL or secret token): fix it and set it again."""

    code = "telegram_webhook_refused"


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """Who the token belongs to (``getMe``); ``id`` is also the loop guard for inbound."""

    id: int
    username: str
    first_name: str
    is_bot: bool


@dataclass(frozen=True, slots=True)
class Answer:
    """One Bot API exchange as the transport saw it: an exception, or a status and a body."""

    failure: TransportError | None = None
    failure_detail: str = ""  # the failure's text, the token redacted
    status: int = 0
    body: Mapping[str, Any] | None = None  # None: the body was not a JSON object

    @property
    def ok(self) -> bool:
        return self.failure is None and self.body is not None and self.body.get("ok") is True

    @property
    def description(self) -> str:
        if self.body is None:
            return f"HTTP {self.status} without a Bot API body"
        return str(self.body.get("description", f"HTTP {self.status}"))

    @property
    def parameters(self) -> Mapping[str, Any]:
        params = None if self.body is None else self.body.get("parameters")
        return params if isinstance(params, Mapping) else {}

    @property
    def retry_after(self) -> float | None:
        after = self.parameters.get("retry_after")
        if not isinstance(after, int | float) or isinstance(after, bool):
            return None
        return float(after) if math.isfinite(after) and after >= 0 else None

    @property
    def result(self) -> Any:
        return None if self.body is None else self.body.get("result")


class BotApi:
    """The Bot API's HTTP door for one token: ``call(method, payload)`` → :class:`Answer`.

    Never raises for a transport failure (it is in the answer, for the caller to classify).
    """

    def __init__(
        self,
        token: str,
        *,
        api_base: str = DEFAULT_API_BASE,
        timeouts: Timeouts = REPLY_TIMEOUTS,
        keepalive: bool = True,
        transport: Transport | None = None,
    ) -> None:
        if not token or any(c.isspace() or c == "/" for c in token):
            raise ValueError("a Telegram bot token is a non-empty string without spaces or '/'")
        self._token = token
        self.api_base = api_base.rstrip("/")
        self._client: Client = make_client(
            timeouts,
            keepalive=keepalive,
            transport=transport,
            path_secret=PathSecret(_TOKEN_PLACEHOLDER, token),
        )

    def __repr__(self) -> str:
        return f"BotApi(api_base={self.api_base!r})"

    def redact(self, text: str) -> str:
        """``text`` with the token replaced (a last guard on any text leaving the adapter)."""
        return text.replace(self._token, "<token>")

    def call(
        self,
        method: str,
        payload: Mapping[str, Any],
        *,
        extensions: dict[str, Any] | None = None,
    ) -> Answer:
        url = f"{self.api_base}/bot{_TOKEN_PLACEHOLDER}/{method}"
        try:
            response = self._client.post(url, json=dict(payload), extensions=extensions or {})
        except TransportError as exc:
            detail = self.redact(str(exc)) or "no detail"
            return Answer(failure=exc, failure_detail=detail)
        try:
            body = json.loads(response.content)
        except ValueError:
            body = None
        return Answer(status=response.status_code, body=body if isinstance(body, dict) else None)

    def close(self) -> None:
        self._client.close()


def is_unauthorized(answer: Answer) -> bool:
    """401, or 404 for a method: the Bot API answers both to a token it does not know."""
    return answer.failure is None and answer.status in (401, 404)


def classify(method: str, answer: Answer, *, message_id: str | None = None) -> WireOutcome:
    """The outcome of one ``sendMessage``, ``editMessageText`` or ``deleteMessage`` exchange.

    ``message_id`` is the message an edit or a delete targets. Pure: the same answer always
    classifies the same way, and only this function reads statuses and descriptions.
    """
    if answer.failure is not None:
        reason = f"{method}: {type(answer.failure).__name__} ({answer.failure_detail})"
        if reach(answer.failure) is Reach.NEVER_LEFT:
            return NotDelivered(f"{reason}: the request never left")
        return MaybeDelivered(f"{reason}: the request may have arrived")
    status, description = answer.status, answer.description
    if answer.ok:
        if message_id is not None:
            return Delivered(message_id)
        result = answer.result
        sent = result.get("message_id") if isinstance(result, Mapping) else None
        if type(sent) is int:
            return Delivered(str(sent))
        return MaybeDelivered(f"{method}: ok without a message id")
    if status == 429:
        return NotDelivered(f"{method}: 429 {description}", retry_after=answer.retry_after or 1.0)
    if status >= 500 or answer.body is None:
        return MaybeDelivered(f"{method}: {status} {description}")
    if method == "editMessageText" and description.startswith(NOT_MODIFIED):
        assert message_id is not None
        return Delivered(message_id)
    if method == "deleteMessage" and description.startswith(DELETE_TARGET_NOT_FOUND):
        assert message_id is not None
        return Delivered(message_id)
    if method == "editMessageText" and description.startswith(EDIT_TARGET_NOT_FOUND):
        return Gone(f"{method}: {status} {description}")
    migrated = answer.parameters.get("migrate_to_chat_id")
    if migrated is not None:
        return RejectedForGood(f"{method}: {status} the chat moved to {migrated}")
    return RejectedForGood(f"{method}: {status} {description}")


class TelegramBot:
    """A :class:`~oncewire.replies.wire.Platform` for one bot token, over the Bot API.

    Sends plain text (no ``parse_mode``: the engine's text must show as written and can never
    be refused for its entities), in reply to ``request.reply_to`` when there is one (still sent
    if that message is gone), in forum topic ``request.thread``. With ``limiter`` (the runner
    gives each bot one, ``RateLimiter(RateLimits.of(platform))``) every operation first takes a
    token, or answers ``NotDelivered(retry_after)`` without a call; without one nothing is
    limited locally.
    """

    def __init__(
        self,
        token: str,
        *,
        api_base: str = DEFAULT_API_BASE,
        profile: PlatformProfile = TELEGRAM_LIKE,
        timeouts: Timeouts = REPLY_TIMEOUTS,
        transport: Transport | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        self._api = BotApi(token, api_base=api_base, timeouts=timeouts, transport=transport)
        self._profile = profile
        self._limiter = limiter
        self._unusable: str | None = None

    def __repr__(self) -> str:
        return (
            f"TelegramBot(api_base={self._api.api_base!r}, profile={self._profile.name!r}, "
            f"usable={self.usable})"
        )

    @property
    def profile(self) -> PlatformProfile:
        return self._profile

    @property
    def usable(self) -> bool:
        return self._unusable is None

    @property
    def unusable_reason(self) -> str | None:
        """Why the Bot API refused this bot's token, once it has; the runner stops the bot."""
        return self._unusable

    def close(self) -> None:
        self._api.close()

    def get_me(self) -> BotIdentity:
        """The bot the token belongs to; raises :class:`BotUnauthorized` for a bad token and
        :class:`TelegramUnavailable` when the Bot API cannot answer."""
        answer = self._api.call("getMe", {})
        self._note_unauthorized("getMe", answer)
        raise_for(self._api, "getMe", answer)
        me = answer.result
        if not isinstance(me, Mapping) or type(me.get("id")) is not int:
            raise TelegramUnavailable("getMe: the answer names no bot")
        return BotIdentity(
            id=me["id"],
            username=str(me.get("username", "")),
            first_name=str(me.get("first_name", "")),
            is_bot=me.get("is_bot") is True,
        )

    def set_webhook(
        self,
        url: str,
        secret: str,
        *,
        allowed_updates: Sequence[str] | None = None,
        drop_pending_updates: bool = False,
    ) -> None:
        """Have Telegram POST each update to ``url`` with ``secret`` in the
        ``X-Telegram-Bot-Api-Secret-Token`` header (long polling then answers 409).

        ``secret`` is 1-256 characters of ``A-Z a-z 0-9 _ -`` (else ValueError, before any
        call). Raises :class:`WebhookRefused` when the Bot API refuses the URL or the secret,
        :class:`BotUnauthorized` for a bad token, :class:`TelegramUnavailable` otherwise.
        """
        if not _SECRET_TOKEN.match(secret):
            raise ValueError(
                "a Telegram webhook secret token is 1-256 characters of A-Z, a-z, 0-9, _ and -"
            )
        payload: dict[str, Any] = {"url": url, "secret_token": secret}
        if allowed_updates is not None:
            payload["allowed_updates"] = list(allowed_updates)
        if drop_pending_updates:
            payload["drop_pending_updates"] = True
        self._webhook_call("setWebhook", payload)

    def delete_webhook(self, *, drop_pending_updates: bool = False) -> None:
        """Stop webhook delivery, so long polling works again (harmless without a webhook).
        Raises :class:`BotUnauthorized` for a bad token, :class:`TelegramUnavailable`
        otherwise."""
        payload = {"drop_pending_updates": True} if drop_pending_updates else {}
        self._webhook_call("deleteWebhook", payload)

    def _webhook_call(self, method: str, payload: Mapping[str, Any]) -> None:
        answer = self._api.call(method, payload)
        self._note_unauthorized(method, answer)
        if answer.failure is None and answer.status == 400 and answer.body is not None:
            raise WebhookRefused(f"{method}: 400 {self._api.redact(answer.description)}")
        raise_for(self._api, method, answer)

    # -- the platform contract ---------------------------------------------------------------
    def send(self, request: SendRequest, body: str, *, marked: bool) -> WireOutcome:
        payload, problem = _target(request)
        if problem is not None:
            return RejectedForGood(problem)
        payload["text"] = self._profile.render(body, marked)
        if request.thread and request.thread != GENERAL_TOPIC:
            payload["message_thread_id"] = int(request.thread)
        if request.reply_to:
            payload["reply_parameters"] = {
                "message_id": int(request.reply_to),
                "allow_sending_without_reply": True,
            }
        return self._call("sendMessage", payload, None)

    def edit(
        self, request: SendRequest, message_id: str, body: str, *, marked: bool
    ) -> WireOutcome:
        payload, problem = _target(request, message_id)
        if problem is not None:
            return RejectedForGood(problem)
        payload["text"] = self._profile.render(body, marked)
        return self._call("editMessageText", payload, message_id)

    def delete(self, request: SendRequest, message_id: str) -> WireOutcome:
        payload, problem = _target(request, message_id)
        if problem is not None:
            return RejectedForGood(problem)
        return self._call("deleteMessage", payload, message_id)

    def _note_unauthorized(self, method: str, answer: Answer) -> None:
        if is_unauthorized(answer):
            self._unusable = f"{method}: {answer.status} {self._api.redact(answer.description)}"
            log.error("telegram bot unusable", extra={"reason": self._unusable})

    def _call(self, method: str, payload: dict[str, Any], message_id: str | None) -> WireOutcome:
        if self._unusable is not None:
            return NotDelivered(f"{method}: not called, the bot is unusable: {self._unusable}")
        if self._limiter is not None:
            wait = self._limiter.take(str(payload["chat_id"]))
            if wait > 0:
                # Never sent: the engine repeats it unmarked once a token is there.
                return NotDelivered(
                    f"{method}: not called, the local rate limit has no token for {wait:.3f}s",
                    retry_after=wait,
                )
        answer = self._api.call(method, payload)
        self._note_unauthorized(method, answer)
        outcome = classify(method, answer, message_id=message_id)
        if isinstance(outcome, Delivered) or self._api.redact(outcome.reason) == outcome.reason:
            return outcome
        return replace(outcome, reason=self._api.redact(outcome.reason))  # an echoed token


def raise_for(api: BotApi, method: str, answer: Answer) -> None:
    """Raise the typed error for a failed non-reply call (``getMe``, ``getUpdates``)."""
    if answer.failure is not None:
        failure = type(answer.failure).__name__
        raise TelegramUnavailable(f"{method}: {failure} ({answer.failure_detail})")
    if answer.ok:
        return
    description = api.redact(answer.description)
    if is_unauthorized(answer):
        raise BotUnauthorized(f"{method}: {answer.status} {description}")
    if answer.status == 409:
        raise PollConflict(f"{method}: {description}")
    retry_after = answer.retry_after if answer.status == 429 else None
    raise TelegramUnavailable(f"{method}: {answer.status} {description}", retry_after=retry_after)


def _target(
    request: SendRequest, message_id: str | None = None
) -> tuple[dict[str, Any], str | None]:
    """(the chat and message fields of a call, or why the request cannot name them)."""
    if request.format != "plain":
        return {}, f"format {request.format!r} is not supported: Telegram replies are plain text"
    for name, value in (
        ("chat", request.chat),
        ("thread", request.thread or None),
        ("reply_to", request.reply_to),
        ("message_id", message_id),
    ):
        if value is not None and name != "chat" and not _is_int(value):
            return {}, f"{name} {value!r} is not a Telegram id"
    if not request.chat:
        return {}, "no chat to send to"
    chat: int | str = int(request.chat) if _is_int(request.chat) else request.chat
    payload: dict[str, Any] = {"chat_id": chat}
    if message_id is not None:
        payload["message_id"] = int(message_id)
    return payload, None


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()
