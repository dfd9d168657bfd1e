"""Admission (T1): a platform's message becomes the gateway's in one commit, before it is
confirmed to the platform.

:meth:`Admitter.admit_telegram` is the whole of T1 for a Telegram message: one insert-on-conflict
on the inbox (``ledger.inbound.admit``), keyed by the platform, the bot, the chat, the forum
topic and the message id. Only after it returns may the caller confirm the update to Telegram
(the poller's offset, a webhook's 2xx): a crash in between serves the update again, and its
second admission is a re-delivery (``new=False``), never a second turn.
:meth:`Admitter.admit_discord` is the same for a Discord message (keyed by the platform, the
bot's user id, the channel, the thread and the message's snowflake); only once it returns may
the Gateway client trust the dispatch's ``seq``. :meth:`Admitter.admit_webhook` is the same for
a generic webhook platform's message (keyed by the platform, :data:`WEBHOOK_BOT`, the chat, the
thread and the platform's message id), and
:meth:`Admitter.admit_pushed` is the webhook server's callback for both kinds: it returns what
it did (:class:`Admitted`; the server's answer says whether the message was admitted, and why
not) and raises when the message was not committed: ``InvalidPayload`` or
``ConfigurationError`` when the inbox refuses the message itself (an id with a control
character or over 512 characters), which the server answers 400, anything else 500, and the
platform delivers it again.

What is not admitted, and why (each is still confirmed: serving it again changes nothing):

* a message from a bot (the gateway's own echoes in a group, other bots; on Discord the bot's
  own messages come back as dispatches);
* a sender outside the platform's ``allowed_users`` (when that list is not empty);
* an edit of a message (``edited_message``): the message was admitted when it was sent and its
  turn answers what it said then.

After a new message's commit comes the busy decision (:mod:`oncewire.gateway.sessions`): in
``busy_mode = "interrupt"``, or for ``/stop``, the session's running turn gets its interrupt
recorded (its own transaction: the inbox has no admission in a caller's transaction; a crash
between the two leaves the new message queued behind the turn, which is then answered).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oncewire.core import crash
from oncewire.gateway.config import PlatformConfig
from oncewire.gateway.platforms.telegram_updates import TelegramInbound
from oncewire.gateway.platforms.webhook import WebhookInbound
from oncewire.gateway.sessions import interrupt_running_turn
from oncewire.inbound import Admission
from oncewire.ledger import Ledger

if TYPE_CHECKING:  # that module needs websockets, which a gateway without Discord lacks
    from oncewire.gateway.platforms.discord_gateway import DiscordInbound

__all__ = [
    "WEBHOOK_BOT",
    "Admitted",
    "Admitter",
    "last_admitted",
    "telegram_bot_id",
]

log = logging.getLogger("oncewire.gateway.admission")

ADMITTED = crash.register(
    "gateway.admitted_before_cursor",
    "a message's admission (T1) committed; the platform not yet told (no getUpdates offset "
    "past it, no 2xx to its POST), so it delivers the message again",
)

# The inbox keys every message by a bot; a generic webhook platform has one sender identity,
# named by the platform itself, so its messages all carry this bot.
WEBHOOK_BOT = "webhook"


def telegram_bot_id(token: str) -> str:
    """The bot's id: the part of a Bot API token before its colon (not secret; Telegram shows
    it as the bot's user id). The inbox keys every message by it, so a second bot on the same
    chat has a session of its own."""
    bot, sep, rest = token.partition(":")
    if not sep or not bot.isdigit() or not rest:
        raise ValueError("a Telegram bot token looks like 123456:ABC... (the bot id, a colon)")
    return bot


@dataclass(frozen=True, slots=True)
class Admitted:
    """What one admission did: the admission (None: the message was not admitted) and why."""

    admission: Admission | None
    reason: str  # "new", "redelivered", "from_bot", "not_allowed", "edit"


class Admitter:
    """T1 for every platform the runner serves; ``on_new`` is called after each commit that
    admitted a new message (the runner wakes its scheduler, which also signals a turn whose
    interrupt was recorded)."""

    def __init__(
        self,
        ledger: Ledger,
        on_new: Callable[[int], None] | None = None,
        *,
        busy_mode: str = "interrupt",
        bots: Mapping[str, str] | None = None,
    ) -> None:
        self.ledger = ledger
        self.on_new = on_new
        self.busy_mode = busy_mode
        self.bots = dict(bots or {})  # Telegram platform name -> its bot id (pushed messages)

    def admit_pushed(
        self, platform: PlatformConfig, message: TelegramInbound | WebhookInbound
    ) -> Admitted:
        """The webhook server's callback: admit a message a platform POSTed (one transaction).
        It returns only once the admission committed (or the message is not to be admitted),
        so the 2xx the server then answers never confirms a message the store does not hold."""
        if isinstance(message, WebhookInbound):
            return self.admit_webhook(platform, message)
        return self.admit_telegram(platform, self.bots[platform.name], message)

    def admit_webhook(self, platform: PlatformConfig, message: WebhookInbound) -> Admitted:
        """Admit one generic webhook message (one transaction); answer the POST afterwards."""
        payload = {"text": message.text}
        admission = self.ledger.inbound.admit(
            platform.name,
            WEBHOOK_BOT,
            message.chat,
            message.message_id,
            payload,
            thread=message.thread,
        )
        return self._admitted(platform, message.chat, message.message_id, admission)

    def admit_telegram(
        self, platform: PlatformConfig, bot: str, message: TelegramInbound
    ) -> Admitted:
        """Admit one Telegram message (one transaction); the caller confirms it afterwards."""
        if message.sender_is_bot:
            return Admitted(None, "from_bot")
        if platform.allowed_users and (
            message.sender_id not in {str(user) for user in platform.allowed_users}
        ):
            log.info(
                "message %s in chat %s on %s not admitted: sender %s is not in allowed_users",
                message.message_id,
                message.chat_id,
                platform.name,
                message.sender_id,
            )
            return Admitted(None, "not_allowed")
        if message.edited:
            return Admitted(None, "edit")
        payload = {
            "text": message.text,
            "sender_id": message.sender_id,
            "sender_username": message.sender_username,
            "chat_type": message.chat_type,
            "update_id": message.update_id,
            "date": message.date,
        }
        admission = self.ledger.inbound.admit(
            platform.name,
            bot,
            message.chat_id,
            message.message_id,
            payload,
            thread=message.thread_id,
        )
        return self._admitted(platform, message.chat_id, message.message_id, admission)

    def admit_discord(self, platform: PlatformConfig, message: DiscordInbound) -> Admitted:
        """Admit one Discord message (one transaction); the Gateway client trusts the
        dispatch's seq afterwards."""
        if message.author_is_bot:
            return Admitted(None, "from_bot")
        if platform.allowed_users and (
            message.author_id not in {str(user) for user in platform.allowed_users}
        ):
            log.info(
                "message %s in channel %s on %s not admitted: author %s is not in allowed_users",
                message.message_id,
                message.thread or message.chat,
                platform.name,
                message.author_id,
            )
            return Admitted(None, "not_allowed")
        payload = {
            "text": message.text,
            "sender_id": message.author_id,
            "sender_username": message.author_username,
            "guild_id": message.guild_id,
            "timestamp": message.timestamp,
        }
        admission = self.ledger.inbound.admit(
            platform.name,
            message.bot_id,
            message.chat,
            message.message_id,
            payload,
            thread=message.thread,
        )
        return self._admitted(platform, message.chat, message.message_id, admission)

    def _admitted(
        self, platform: PlatformConfig, chat: str, message_id: str, admission: Admission
    ) -> Admitted:
        """After the commit: the busy decision and the scheduler's wake-up, for a new message."""
        ADMITTED.hit()
        if admission.new:
            log.info(
                "admitted inbound %s (%s chat %s message %s)",
                admission.inbound.id,
                platform.name,
                chat,
                message_id,
            )
            interrupt_running_turn(self.ledger, admission.inbound, self.busy_mode)
            if self.on_new is not None:
                self.on_new(admission.inbound.id)
        return Admitted(admission, "new" if admission.new else "redelivered")


def last_admitted(ledger: Ledger, platform: str, *, max_age_seconds: float) -> dict[str, str]:
    """Per channel (a thread's own, else the chat's), the newest message id of ``platform``
    admitted within ``max_age_seconds``: where a Discord backfill starts. Ids are snowflakes,
    compared as numbers. One grouped read of the messages admitted in that window (an index on
    the platform and the admission time), whatever the inbox's history."""
    return ledger.inbound.newest_ids(platform, since=ledger.clock.now() - max_age_seconds)
