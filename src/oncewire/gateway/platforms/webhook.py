"""The generic webhook platform: oncewire's own small contract for a chat that cannot edit.

Outbound, each message is one ``POST {send_url}`` of ``{"chat", "thread", "text", "reply_to"}``
(JSON), answered ``2xx {"message_id"}``. There is no edit and no delete (``NON_EDITABLE``).
Inbound, the platform POSTs ``{"message_id", "chat", "thread", "text"}`` to the gateway and
retries until it gets a 2xx, so the gateway answers only after its admission committed.

Both directions are signed when a secret is configured: the header :data:`SIGNATURE_HEADER`
carries ``sha256=`` and the hex HMAC-SHA256 of the exact body bytes under the secret
(:func:`sign`, checked in constant time by :func:`verify`).

Every send that answers another message carries :data:`IDEMPOTENCY_KEY_HEADER`, a digest of
where it goes and the text it shows: a platform that honours it turns a repeat of the same
message (a send retried after an unknown outcome, unmarked) into the message it already made. A
send that answers no message carries no key: two identical notes to one chat may both be meant.
A marked resend shows a different text, so it has a key of its own and is a message of its own.

The adapter's outcomes: a failure while connecting is ``NotDelivered``, any later transport
failure ``MaybeDelivered``; 2xx with a ``message_id`` is ``Delivered``; 429 is ``NotDelivered``
with the ``Retry-After`` header's (or the body's ``retry_after``) seconds; 5xx, 408 and a 2xx
without a ``message_id`` are ``MaybeDelivered``; 401 makes the platform unusable (later sends
answer ``NotDelivered`` without a call); every other 4xx is ``RejectedForGood``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oncewire.gateway.http import Client, Reach, Timeouts, Transport, TransportError, make_client
from oncewire.gateway.http import reach as reach_of
from oncewire.replies.wire import (
    NON_EDITABLE,
    Delivered,
    MaybeDelivered,
    NotDelivered,
    PlatformProfile,
    RejectedForGood,
    WireOutcome,
)
from oncewire.storage.replies import SendRequest

__all__ = [
    "IDEMPOTENCY_KEY_HEADER",
    "SIGNATURE_HEADER",
    "WebhookInbound",
    "WebhookPlatform",
    "classify",
    "idempotency_key",
    "parse_inbound",
    "sign",
    "verify",
]

SIGNATURE_HEADER = "Oncewire-Signature"
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
REPLY_TIMEOUTS = Timeouts(read_seconds=10.0)


def sign(secret: str, body: bytes) -> str:
    """The signature header's value for ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` is the signature of ``body`` under ``secret`` (constant time)."""
    return header is not None and hmac.compare_digest(sign(secret, body), header)


def idempotency_key(request: SendRequest, text: str) -> str | None:
    """The key of a send: the same text to the same message in the same place is one message.
    None for a send that answers no message (nothing then tells a repeat from a second note)."""
    if not request.reply_to:
        return None
    place = [request.platform, request.bot, request.chat, request.thread, request.reply_to, text]
    return hashlib.sha256(json.dumps(place).encode()).hexdigest()[:40]


@dataclass(frozen=True, slots=True)
class WebhookInbound:
    """One message the platform delivered; ``(chat, message_id)`` is its key."""

    message_id: str
    chat: str
    thread: str
    text: str


def parse_inbound(body: bytes) -> WebhookInbound:
    """The message of an inbound POST body; ValueError naming what is wrong."""
    try:
        payload = json.loads(body)
    except ValueError:
        raise ValueError("the body is not JSON") from None
    if not isinstance(payload, dict):
        raise ValueError("the body is not a JSON object")
    fields = {}
    for name in ("message_id", "chat", "thread", "text"):
        value = payload.get(name, "" if name == "thread" else None)
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError(f"{name} must be a string or an integer")
        fields[name] = str(value)
    if not fields["message_id"] or not fields["chat"]:
        raise ValueError("message_id and chat must not be empty")
    return WebhookInbound(**fields)


class WebhookPlatform:
    """A :class:`~oncewire.replies.wire.Platform` that POSTs each message to ``send_url``."""

    def __init__(
        self,
        send_url: str,
        *,
        secret: str | None = None,
        profile: PlatformProfile = NON_EDITABLE,
        timeouts: Timeouts = REPLY_TIMEOUTS,
        transport: Transport | None = None,
    ) -> None:
        if profile.can_edit or profile.can_delete:
            raise ValueError("a webhook platform can neither edit nor delete messages")
        self.send_url = send_url
        self._secret = secret
        self._profile = profile
        self._client: Client = make_client(timeouts, transport=transport)
        self._unusable: str | None = None

    def __repr__(self) -> str:
        return f"WebhookPlatform(send_url={self.send_url!r}, signed={self._secret is not None})"

    @property
    def profile(self) -> PlatformProfile:
        return self._profile

    @property
    def usable(self) -> bool:
        return self._unusable is None

    @property
    def unusable_reason(self) -> str | None:
        """Why the platform refused this gateway's credentials (401), once it has."""
        return self._unusable

    def close(self) -> None:
        self._client.close()

    def send(self, request: SendRequest, body: str, *, marked: bool) -> WireOutcome:
        if self._unusable is not None:
            return NotDelivered(f"not called, the platform is unusable: {self._unusable}")
        text = self._profile.render(body, marked)
        message = {
            "chat": request.chat,
            "thread": request.thread,
            "text": text,
            "reply_to": request.reply_to,
        }
        data = json.dumps(message, ensure_ascii=False).encode()
        headers = {"content-type": "application/json"}
        key = idempotency_key(request, text)
        if key is not None:
            headers[IDEMPOTENCY_KEY_HEADER] = key
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = sign(self._secret, data)
        try:
            response = self._client.post(self.send_url, content=data, headers=headers)
        except TransportError as exc:
            reason = f"POST: {type(exc).__name__} ({exc})"
            if reach_of(exc) is Reach.NEVER_LEFT:
                return NotDelivered(f"{reason}: the request never left")
            return MaybeDelivered(f"{reason}: the request may have arrived")
        outcome = classify(response.status_code, response.headers, response.content)
        if response.status_code == 401:
            self._unusable = f"401 {_error_text(response.content)}"
        return outcome

    def edit(
        self, request: SendRequest, message_id: str, body: str, *, marked: bool
    ) -> WireOutcome:
        return RejectedForGood("a webhook platform cannot edit messages")

    def delete(self, request: SendRequest, message_id: str) -> WireOutcome:
        return RejectedForGood("a webhook platform cannot delete messages")


def classify(status: int, headers: Mapping[str, str], content: bytes) -> WireOutcome:
    """The outcome of one send, from the platform's answer."""
    payload = _json(content)
    if 200 <= status < 300:
        message_id = payload.get("message_id") if payload is not None else None
        if isinstance(message_id, str | int) and not isinstance(message_id, bool) and message_id:
            return Delivered(str(message_id))
        return MaybeDelivered(f"{status} without a message_id")
    error = _error_text(content)
    if status == 429:
        return NotDelivered(f"429 {error}", retry_after=_retry_after(headers, payload))
    if status >= 500 or status == 408:
        return MaybeDelivered(f"{status} {error}")
    return RejectedForGood(f"{status} {error}")


def _json(content: bytes) -> dict[str, Any] | None:
    try:
        payload = json.loads(content)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def _error_text(content: bytes) -> str:
    payload = _json(content)
    if payload is not None and isinstance(payload.get("error"), str):
        return str(payload["error"])
    return content[:200].decode("utf-8", "replace") or "no body"


def _retry_after(headers: Mapping[str, str], payload: dict[str, Any] | None) -> float:
    """Seconds to wait: the ``Retry-After`` header, else the body's ``retry_after``, else 1."""
    for value in (headers.get("retry-after"), (payload or {}).get("retry_after")):
        try:
            seconds = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return 1.0
