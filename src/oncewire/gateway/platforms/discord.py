"""Discord over its REST API: the reply adapter, with a nonce on every create, and the calls the
Gateway client and ``gateway check`` need.

Every call goes to ``{api_base}/...`` (``api_base`` is the REST root, e.g.
``https://discord.com/api/v10``) with ``Authorization: Bot <token>``. :class:`DiscordBot` makes one
call per operation, never retries, and classifies each answer itself (:func:`classify`):

=======================================================  ======================================
what happened                                            outcome
=======================================================  ======================================
failed while connecting, or waiting for a connection     ``NotDelivered`` (never left)
failed after the request started going out               ``MaybeDelivered``
the route's bucket is empty (``X-RateLimit-Remaining``    ``NotDelivered(retry_after)``, no call
0 until ``Reset-After``), or a global 429 is running
429 ``{"retry_after", "global"}``                        ``NotDelivered(retry_after)``
429 without Discord's body (a Cloudflare block)          ``NotDelivered`` after ``Retry-After``
                                                         (at least :data:`BLOCKED_WAIT_SECONDS`)
5xx, or a 2xx create without a message id                ``MaybeDelivered``
an edit: 404 :data:`UNKNOWN_MESSAGE`                     ``Gone`` (someone deleted it)
a delete: 404 :data:`UNKNOWN_MESSAGE`                    ``Delivered`` (already gone)
401 (the token)                                          ``NotDelivered``; the bot is unusable
403 (50001, 50007, 50013), 404 (10003), 400 (50035),     ``RejectedForGood``
any other 4xx
=======================================================  ======================================

Only the error ``code`` of Discord's JSON body is read, never its message text.

Every create carries ``nonce`` (:func:`nonce_for`, 25 characters derived from the request's
idempotency key, which the reply engine makes from the reply and the chunk slot) and
``enforce_nonce: true``: Discord then answers a create whose nonce it saw within the last few
minutes with the message that first create made, instead of making a second one. The profile
(:data:`DISCORD`) tells the reply engine so (``idempotent_send_window_seconds``, shorter than
Discord's window): inside it, a create that may have landed is sent again unmarked, with the same
body and nonce, and the chat shows it once.

Rate limits are Discord's per route: each answer's ``X-RateLimit-Remaining`` and
``X-RateLimit-Reset-After`` are kept per route and channel (its major parameter), and a call on
an empty bucket is not made. The token never appears in a log line, an exception, a reason or a
repr: it is only in the Authorization header, and any text leaving the adapter is redacted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote

from oncewire.core.errors import OncewireError
from oncewire.gateway.http import (
    Client,
    Reach,
    Timeouts,
    Transport,
    TransportError,
    make_client,
    reach,
)
from oncewire.replies.wire import (
    DISCORD_LIKE,
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
    "BLOCKED_WAIT_SECONDS",
    "DISCORD",
    "NONCE_WINDOW_SECONDS",
    "UNKNOWN_CHANNEL",
    "UNKNOWN_MESSAGE",
    "Answer",
    "BotIdentity",
    "DiscordApi",
    "DiscordBot",
    "DiscordError",
    "DiscordUnauthorized",
    "DiscordUnavailable",
    "classify",
    "nonce_for",
]

log = logging.getLogger("oncewire.gateway.discord")

DEFAULT_API_BASE = "https://discord.com/api/v10"
REPLY_TIMEOUTS = Timeouts(read_seconds=10.0)

# Discord's JSON error codes that change an outcome.
UNKNOWN_MESSAGE = 10008
UNKNOWN_CHANNEL = 10003
INVALID_FORM_BODY = 50035

# Discord keeps a nonce "for the past few minutes"; the engine relies on a shorter window.
NONCE_WINDOW_SECONDS = 60.0
NONCE_CHARS = 25
# A 429 that is not Discord's (Cloudflare's ban after too many invalid requests) lasts long.
BLOCKED_WAIT_SECONDS = 60.0

DISCORD = replace(DISCORD_LIKE, idempotent_send_window_seconds=NONCE_WINDOW_SECONDS)

# Channel and message ids go into the URL path as they are: only what an id can hold.
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")


class DiscordError(OncewireError):
    """A Discord REST call failed."""

    code = "discord_error"


class DiscordUnauthorized(DiscordError):
    """Discord refused the bot token (401): fix the token."""

    code = "discord_unauthorized"


class DiscordUnavailable(DiscordError):
    """Discord could not be reached or failed; try again (after ``retry_after``)."""

    code = "discord_unavailable"

    def __init__(self, message: str | None = None, *, retry_after: float | None = None) -> None:
        super().__init__(message, retry_after=retry_after)
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class BotIdentity:
    """Who the token belongs to (``GET /users/@me``)."""

    id: str
    username: str
    is_bot: bool


@dataclass(frozen=True, slots=True)
class Answer:
    """One REST exchange as the transport saw it: an exception, or a status, body and headers."""

    failure: TransportError | None = None
    failure_detail: str = ""  # the failure's text, the token redacted
    status: int = 0
    body: Any = None  # the decoded JSON (None: no body, or not JSON)
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names

    @property
    def ok(self) -> bool:
        return self.failure is None and 200 <= self.status < 300

    @property
    def error_code(self) -> int | None:
        code = self.body.get("code") if isinstance(self.body, Mapping) else None
        return code if type(code) is int else None

    @property
    def retry_after(self) -> float | None:
        """Seconds from a 429: Discord's body (a float), else the ``Retry-After`` header."""
        after = self.body.get("retry_after") if isinstance(self.body, Mapping) else None
        if isinstance(after, int | float) and not isinstance(after, bool):
            return float(after) if math.isfinite(after) and after >= 0 else None
        return _seconds(self.headers.get("retry-after"))

    @property
    def is_global(self) -> bool:
        return isinstance(self.body, Mapping) and self.body.get("global") is True

    @property
    def discord_body(self) -> bool:
        """The body is Discord's JSON error object (not a proxy's page)."""
        return isinstance(self.body, Mapping) and "message" in self.body

    def describe(self) -> str:
        if self.failure is not None:
            return f"{type(self.failure).__name__} ({self.failure_detail})"
        code = self.error_code
        return f"{self.status}" + ("" if code is None else f" code {code}")


def _seconds(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and value >= 0 else None


class _Buckets:
    """What Discord said of each route's bucket: when it is empty, and until when."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._empty_until: dict[str, float] = {}
        self._global_until = 0.0

    def wait(self, route: str) -> float:
        now = self._clock()
        with self._lock:
            until = max(self._global_until, self._empty_until.get(route, 0.0))
        return max(0.0, until - now)

    def learn(self, route: str, answer: Answer) -> None:
        if answer.failure is not None:
            return
        now = self._clock()
        with self._lock:
            if answer.status == 429:
                after = answer.retry_after
                if after is None or not answer.discord_body:
                    after = max(after or 0.0, BLOCKED_WAIT_SECONDS)
                if answer.is_global:
                    self._global_until = max(self._global_until, now + after)
                else:
                    self._empty_until[route] = now + after
                return
            remaining = answer.headers.get("x-ratelimit-remaining")
            reset_after = _seconds(answer.headers.get("x-ratelimit-reset-after"))
            if remaining == "0" and reset_after is not None:
                self._empty_until[route] = now + reset_after
            else:
                self._empty_until.pop(route, None)


class DiscordApi:
    """Discord's REST door for one token: ``call(method, path, body)`` → :class:`Answer`.

    Never raises for a transport failure (it is in the answer, for the caller to classify).
    """

    def __init__(
        self,
        token: str,
        *,
        api_base: str = DEFAULT_API_BASE,
        timeouts: Timeouts = REPLY_TIMEOUTS,
        transport: Transport | None = None,
    ) -> None:
        if not token or any(c.isspace() for c in token):
            raise ValueError("a Discord bot token is a non-empty string without spaces")
        self._token = token
        self.api_base = api_base.rstrip("/")
        self._client: Client = make_client(
            timeouts,
            transport=transport,
            headers={"authorization": f"Bot {token}", "user-agent": "DiscordBot (oncewire, 0.1)"},
        )

    def __repr__(self) -> str:
        return f"DiscordApi(api_base={self.api_base!r})"

    def redact(self, text: str) -> str:
        """``text`` with the token replaced (a last guard on any text leaving the adapter)."""
        return text.replace(self._token, "<token>")

    def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        params: Mapping[str, str] | None = None,
    ) -> Answer:
        url = f"{self.api_base}{path}"
        try:
            response = self._client.request(
                method, url, json=None if body is None else dict(body), params=params
            )
        except TransportError as exc:
            return Answer(failure=exc, failure_detail=self.redact(str(exc)) or "no detail")
        try:
            decoded = json.loads(response.content) if response.content else None
        except ValueError:
            decoded = None
        headers = {name.lower(): value for name, value in response.headers.items()}
        return Answer(status=response.status_code, body=decoded, headers=headers)

    def close(self) -> None:
        self._client.close()


def classify(op: str, answer: Answer, *, message_id: str | None = None) -> WireOutcome:
    """The outcome of one create (``send``), ``edit`` or ``delete`` exchange.

    ``message_id`` is the message an edit or a delete targets. Pure: the same answer always
    classifies the same way, and only this function reads statuses and error codes.
    """
    if answer.failure is not None:
        reason = f"{op}: {answer.describe()}"
        if reach(answer.failure) is Reach.NEVER_LEFT:
            return NotDelivered(f"{reason}: the request never left")
        return MaybeDelivered(f"{reason}: the request may have arrived")
    status, code = answer.status, answer.error_code
    if answer.ok:
        if message_id is not None:
            return Delivered(message_id)
        made = answer.body.get("id") if isinstance(answer.body, Mapping) else None
        if isinstance(made, str) and made:
            return Delivered(made)
        return MaybeDelivered(f"{op}: {status} without a message id")
    if status == 429:
        after = answer.retry_after
        if not answer.discord_body:
            # Not Discord's rate limit but a block in front of it: wait long, and say so.
            log.error("discord answered 429 without its body (a block in front of the API)")
            return NotDelivered(
                f"{op}: 429 from a proxy in front of Discord",
                retry_after=max(after or 0.0, BLOCKED_WAIT_SECONDS),
            )
        scope = "global " if answer.is_global else ""
        return NotDelivered(f"{op}: {scope}429", retry_after=1.0 if after is None else after)
    if status >= 500:
        return MaybeDelivered(f"{op}: {answer.describe()}")
    if status == 401:
        return NotDelivered(f"{op}: 401, the token was refused")
    if status == 404 and code == UNKNOWN_MESSAGE and op == "edit":
        return Gone(f"{op}: 404 code {UNKNOWN_MESSAGE} Unknown Message")
    if status == 404 and code == UNKNOWN_MESSAGE and op == "delete":
        assert message_id is not None
        return Delivered(message_id)
    return RejectedForGood(f"{op}: {answer.describe()}")


def nonce_for(request: SendRequest, text: str) -> str:
    """The nonce of a create: 25 characters derived from the request's idempotency key (the
    same for every send of one chunk slot). A request without a key (not from the reply engine)
    gets one derived from where it goes and its text, so a repeat of it is dropped too."""
    key = request.idempotency_key
    if key is None:
        place = [request.platform, request.bot, request.chat, request.thread, request.reply_to]
        key = json.dumps([*place, text])
    return "ow" + hashlib.sha256(key.encode()).hexdigest()[: NONCE_CHARS - 2]


class DiscordBot:
    """A :class:`~oncewire.replies.wire.Platform` for one bot token, over Discord's REST API.

    A reply goes to the thread's channel when the message came in a thread (``request.thread``),
    else to the chat's channel, as a reply to ``request.reply_to`` (still sent if that message
    is gone), mentioning nobody. ``clock`` (monotonic seconds) is for the route buckets.
    """

    def __init__(
        self,
        token: str,
        *,
        api_base: str = DEFAULT_API_BASE,
        profile: PlatformProfile = DISCORD,
        timeouts: Timeouts = REPLY_TIMEOUTS,
        transport: Transport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = DiscordApi(token, api_base=api_base, timeouts=timeouts, transport=transport)
        self._profile = profile
        self._buckets = _Buckets(clock)
        self._unusable: str | None = None

    def __repr__(self) -> str:
        return (
            f"DiscordBot(api_base={self.api.api_base!r}, profile={self._profile.name!r}, "
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
        """Why Discord refused this bot's token, once it has."""
        return self._unusable

    def close(self) -> None:
        self.api.close()

    def get_me(self) -> BotIdentity:
        """The bot the token belongs to; raises :class:`DiscordUnauthorized` for a bad token
        and :class:`DiscordUnavailable` when Discord cannot answer."""
        answer = self.api.call("GET", "/users/@me")
        raise_for(self.api, "GET /users/@me", answer)
        me = answer.body
        if not isinstance(me, Mapping) or not isinstance(me.get("id"), str):
            raise DiscordUnavailable("GET /users/@me: the answer names no user")
        return BotIdentity(me["id"], str(me.get("username", "")), me.get("bot") is True)

    # -- the platform contract ---------------------------------------------------------------
    def send(self, request: SendRequest, body: str, *, marked: bool) -> WireOutcome:
        channel, problem = _channel(request)
        if problem is not None:
            return RejectedForGood(problem)
        text = self._profile.render(body, marked)
        payload: dict[str, Any] = {
            "content": text,
            "nonce": nonce_for(request, text),
            "enforce_nonce": True,
            "allowed_mentions": {"parse": []},
        }
        if request.reply_to:
            if not _ID.match(request.reply_to):
                return RejectedForGood(f"reply_to {request.reply_to!r} is not a Discord id")
            payload["message_reference"] = {
                "message_id": request.reply_to,
                "fail_if_not_exists": False,
            }
        return self._call("send", "POST", f"/channels/{channel}/messages", payload, None)

    def edit(
        self, request: SendRequest, message_id: str, body: str, *, marked: bool
    ) -> WireOutcome:
        channel, problem = _channel(request, message_id)
        if problem is not None:
            return RejectedForGood(problem)
        payload = {"content": self._profile.render(body, marked), "allowed_mentions": {"parse": []}}
        path = f"/channels/{channel}/messages/{message_id}"
        return self._call("edit", "PATCH", path, payload, message_id)

    def delete(self, request: SendRequest, message_id: str) -> WireOutcome:
        channel, problem = _channel(request, message_id)
        if problem is not None:
            return RejectedForGood(problem)
        path = f"/channels/{channel}/messages/{message_id}"
        return self._call("delete", "DELETE", path, None, message_id)

    def _call(
        self,
        op: str,
        method: str,
        path: str,
        payload: Mapping[str, Any] | None,
        message_id: str | None,
    ) -> WireOutcome:
        if self._unusable is not None:
            return NotDelivered(f"{op}: not called, the bot is unusable: {self._unusable}")
        route = _route(method, path)
        wait = self._buckets.wait(route)
        if wait > 0:
            # Never sent: the engine repeats it unmarked once the bucket has refilled.
            return NotDelivered(
                f"{op}: not called, the route's rate limit is empty for {wait:.3f}s",
                retry_after=wait,
            )
        answer = self.api.call(method, path, payload)
        self._buckets.learn(route, answer)
        if answer.failure is None and answer.status == 401:
            self._unusable = f"{method} {route}: 401"
            log.error("discord bot unusable: the token was refused")
        outcome = classify(op, answer, message_id=message_id)
        if isinstance(outcome, Delivered) or self.api.redact(outcome.reason) == outcome.reason:
            return outcome
        return replace(outcome, reason=self.api.redact(outcome.reason))  # an echoed token


def raise_for(api: DiscordApi, what: str, answer: Answer) -> None:
    """Raise the typed error for a failed call that is no reply operation."""
    if answer.ok:
        return
    if answer.failure is None and answer.status == 401:
        raise DiscordUnauthorized(f"{what}: 401, the token was refused")
    retry_after = answer.retry_after if answer.status == 429 else None
    raise DiscordUnavailable(f"{what}: {api.redact(answer.describe())}", retry_after=retry_after)


def _route(method: str, path: str) -> str:
    """The route's bucket: the method, the path with message ids as ``:id``, and the channel
    (Discord's major parameter) kept."""
    parts = path.strip("/").split("/")
    if len(parts) == 4 and parts[0] == "channels" and parts[2] == "messages":
        parts[3] = ":id"
    return f"{method} /{'/'.join(parts)}"


def _channel(request: SendRequest, message_id: str | None = None) -> tuple[str, str | None]:
    """(the channel a request goes to, or why it cannot name one): its thread, else its chat."""
    if request.format != "plain":
        return "", f"format {request.format!r} is not supported: Discord replies are plain text"
    channel = request.thread or request.chat
    if not channel or not _ID.match(channel):
        return "", f"channel {channel!r} is not a Discord id"
    if message_id is not None and not _ID.match(message_id):
        return "", f"message id {message_id!r} is not a Discord id"
    return quote(channel, safe=""), None
