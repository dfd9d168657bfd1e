"""Telegram inbound by long polling (``getUpdates``), confirmed only after admission commits.

``getUpdates`` with ``offset = N`` tells Telegram that every update below ``N`` was handled: it
never serves them again. :class:`UpdatePoller` therefore sends, as its offset, one past the
highest update the caller has confirmed *and* every update before it: an update the caller
received but never confirmed (its admission failed, or the process died before it committed)
is served again by the next poll, by a restarted poller too. Admission dedups by the inbound
key, so an update served twice is admitted once.

The caller's loop::

    for message in poller.poll():
        admit(message)                     # the durable admission commit
        poller.confirm(message.update_id)  # only now may Telegram forget it

Updates that carry nothing to admit (another update type, a message without a chat) are
confirmed by the poller itself once every update before them is.

Only one poller may serve a bot: when a second one polls, Telegram ends the first one's call
with 409, raised here as :class:`~oncewire.gateway.platforms.telegram.PollConflict`.
:meth:`UpdatePoller.stop` ends a blocked long poll at once from another thread (it shuts the
poll's socket), and :meth:`poll` then returns nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oncewire.gateway.http import SocketShutter, Timeouts, Transport
from oncewire.gateway.platforms.telegram import (
    DEFAULT_API_BASE,
    BotApi,
    TelegramUnavailable,
    raise_for,
)

__all__ = ["ALLOWED_UPDATES", "TelegramInbound", "UpdatePoller", "parse_update"]

log = logging.getLogger("oncewire.gateway.telegram")

ALLOWED_UPDATES = ("message", "edited_message")
# Seconds a poll's read may outlast the long-poll timeout the Bot API was given.
READ_MARGIN_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class TelegramInbound:
    """One user message from an update; ``(chat_id, message_id)`` is its key (message ids are
    unique per chat only). ``edited`` marks an edit of a message already received (same key)."""

    update_id: int
    chat_id: str
    chat_type: str  # private, group, supergroup, channel
    message_id: str
    thread_id: str  # the forum topic, "" outside topics
    sender_id: str | None
    sender_is_bot: bool
    sender_username: str | None
    text: str  # "" for a message without text (a photo without a caption)
    edited: bool
    date: int  # unix seconds, as Telegram stamped it


def parse_update(update: Mapping[str, Any]) -> TelegramInbound | None:
    """The message an update carries, or None when it carries nothing to admit."""
    update_id = update.get("update_id")
    edited = "edited_message" in update
    message = update.get("edited_message" if edited else "message")
    if type(update_id) is not int or not isinstance(message, Mapping):
        return None
    chat = message.get("chat")
    message_id = message.get("message_id")
    if not isinstance(chat, Mapping) or "id" not in chat or type(message_id) is not int:
        return None
    sender = message.get("from")
    sender = sender if isinstance(sender, Mapping) else {}
    # message_thread_id also names reply threads in plain groups; only a topic is a thread one
    # can send into.
    thread = message.get("message_thread_id") if message.get("is_topic_message") else None
    text = message.get("text", message.get("caption", ""))
    return TelegramInbound(
        update_id=update_id,
        chat_id=str(chat["id"]),
        chat_type=str(chat.get("type", "private")),
        message_id=str(message_id),
        thread_id="" if thread is None else str(thread),
        sender_id=None if "id" not in sender else str(sender["id"]),
        sender_is_bot=sender.get("is_bot") is True,
        sender_username=None if sender.get("username") is None else str(sender["username"]),
        text=text if isinstance(text, str) else "",
        edited=edited,
        date=date if type(date := message.get("date")) is int else 0,
    )


class UpdatePoller:
    """Long-polls one bot's updates; the offset moves only over confirmed updates.

    ``offset`` starts a poller where a previous one stopped (None: wherever Telegram's own
    confirmed offset is). ``poll_timeout_seconds`` is the long poll's wait for a first update;
    keep it short where a prompt :meth:`stop` matters less than fewer requests.
    """

    def __init__(
        self,
        token: str,
        *,
        api_base: str = DEFAULT_API_BASE,
        poll_timeout_seconds: int = 25,
        allowed_updates: Sequence[str] = ALLOWED_UPDATES,
        limit: int = 100,
        offset: int | None = None,
        connect_seconds: float = 5.0,
        transport: Transport | None = None,
    ) -> None:
        if type(poll_timeout_seconds) is not int or poll_timeout_seconds < 0:
            raise ValueError("poll_timeout_seconds must be a whole number of seconds >= 0")
        if type(limit) is not int or not 1 <= limit <= 100:
            raise ValueError("limit must be between 1 and 100")
        timeouts = Timeouts(
            connect_seconds=connect_seconds,
            read_seconds=poll_timeout_seconds + READ_MARGIN_SECONDS,
            pool_seconds=connect_seconds,
        )
        # One connection per poll: stop() needs each poll's own socket.
        self._api = BotApi(
            token, api_base=api_base, timeouts=timeouts, keepalive=False, transport=transport
        )
        self.poll_timeout_seconds = poll_timeout_seconds
        self.allowed_updates = tuple(allowed_updates)
        self.limit = limit
        self._lock = threading.Lock()
        self._offset = offset
        self._served: dict[int, bool] = {}  # update id -> confirmed (or nothing to admit)
        self._shutter: SocketShutter | None = None
        self._stopped = False

    def __repr__(self) -> str:
        return f"UpdatePoller(api_base={self._api.api_base!r}, offset={self.offset})"

    @property
    def offset(self) -> int | None:
        """The offset the next poll sends: one past the last update confirmed in order."""
        with self._lock:
            return self._offset

    @property
    def stopped(self) -> bool:
        with self._lock:
            return self._stopped

    def poll(self) -> list[TelegramInbound]:
        """One ``getUpdates`` call: the messages of the updates it returned, in order.

        Raises :class:`PollConflict` (another poller), :class:`BotUnauthorized` (bad token) or
        :class:`TelegramUnavailable` (unreachable, 429 with ``retry_after``, 5xx). Returns
        ``[]`` once stopped, a poll interrupted by :meth:`stop` included.
        """
        shutter = SocketShutter()
        with self._lock:
            if self._stopped:
                return []
            self._shutter = shutter
            payload: dict[str, Any] = {
                "timeout": self.poll_timeout_seconds,
                "limit": self.limit,
                "allowed_updates": list(self.allowed_updates),
            }
            if self._offset is not None:
                payload["offset"] = self._offset
        answer = self._api.call("getUpdates", payload, extensions=shutter.extensions)
        with self._lock:
            self._shutter = None
            if self._stopped:
                return []
        raise_for(self._api, "getUpdates", answer)
        updates = answer.result
        if not isinstance(updates, list):
            raise TelegramUnavailable("getUpdates: the answer holds no list of updates")
        messages = []
        with self._lock:
            for update in updates:
                update_id = update.get("update_id") if isinstance(update, Mapping) else None
                if type(update_id) is not int:
                    log.warning("telegram update without an update_id skipped")
                    continue
                if self._offset is not None and update_id < self._offset:
                    continue  # confirmed before; Telegram should not have sent it
                message = parse_update(update)
                self._served[update_id] = self._served.get(update_id, False) or message is None
                if message is not None:
                    messages.append(message)
            self._advance()
        return messages

    def confirm(self, update_id: int) -> None:
        """The caller's admission of ``update_id`` committed: Telegram may forget it once every
        update before it is confirmed too. Confirming twice is harmless."""
        with self._lock:
            if self._offset is not None and update_id < self._offset:
                return
            if update_id not in self._served:
                raise ValueError(f"update {update_id} was not served by this poller")
            self._served[update_id] = True
            self._advance()

    def _advance(self) -> None:
        for update_id in sorted(self._served):
            if not self._served[update_id]:
                return
            del self._served[update_id]
            self._offset = update_id + 1

    def stop(self) -> None:
        """End the poller: a poll blocked now returns ``[]`` promptly, later polls at once."""
        with self._lock:
            self._stopped = True
            shutter = self._shutter
        if shutter is not None:
            shutter.shut()

    def close(self) -> None:
        self.stop()
        self._api.close()
