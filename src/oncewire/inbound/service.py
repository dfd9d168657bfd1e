"""Admitting inbound messages once, durably, and asking what is still unanswered.

A platform re-delivers: a webhook retries, a websocket resumes, a reconnect replays, a restart
re-reads. :meth:`InboundView.admit` is an insert-on-conflict on (platform, bot, chat, thread,
platform message id), so whichever copy arrives first is the message and every later copy is
reported as a re-delivery (and counted), never processed again.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oncewire.core.canonical import canonical_json, digest_json
from oncewire.core.errors import InboundNotFound
from oncewire.core.limits import MAX_KEY_CHARS, check_name
from oncewire.storage.replies import Inbound, InboundStatus

if TYPE_CHECKING:
    from oncewire.effects.ledger import Ledger

__all__ = ["DEFAULT_MAX_STARTS", "Admission", "InboundView"]

DEFAULT_MAX_STARTS = 3  # starts of answering before an inbound is quarantined


@dataclass(frozen=True, slots=True)
class Admission:
    inbound: Inbound
    new: bool  # False: a re-delivery of a message admitted before; do not process it again
    # A re-delivery whose payload differs from the admitted one (an edited message, say): it is
    # still not processed again, but the caller is told rather than left to guess.
    payload_changed: bool = False


def _text_field(name: str, value: object, *, empty: bool = False) -> str:
    # The rules of an effect key: no control characters or lone surrogates, no edge
    # whitespace, refused alike on both backends before any SQL.
    return check_name(name, value, MAX_KEY_CHARS, empty=empty)


class InboundView:
    """``ledger.inbound``."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def admit(
        self,
        platform: str,
        bot: str,
        chat: str,
        platform_message_id: str,
        payload: Any,
        *,
        thread: str = "",
    ) -> Admission:
        """Record the message once; say whether it is new or a re-delivery."""
        payload_json = canonical_json(payload)
        payload_digest = digest_json(payload_json)
        inbound, new = self._ledger.store.admit_inbound(
            platform=_text_field("platform", platform),
            bot=_text_field("bot", bot),
            chat=_text_field("chat", chat),
            thread=_text_field("thread", thread, empty=True),
            platform_message_id=_text_field("platform_message_id", platform_message_id),
            payload_json=payload_json,
            digest=payload_digest,
            now=self._ledger.clock.now(),
        )
        return Admission(inbound, new, payload_changed=inbound.digest != payload_digest)

    def get(self, inbound_id: int) -> Inbound:
        inbound = self._ledger.store.get_inbound(inbound_id)
        if inbound is None:
            raise InboundNotFound(f"no inbound message {inbound_id}", inbound_id=inbound_id)
        return inbound

    def list(
        self,
        status: InboundStatus | str | Sequence[InboundStatus | str] | None = None,
        *,
        limit: int = 100,
        after_id: int = 0,
    ) -> list[Inbound]:
        if status is None:
            statuses: builtins.list[InboundStatus] = []
        elif isinstance(status, str):
            statuses = [InboundStatus(status)]
        else:
            statuses = [InboundStatus(s) for s in status]
        return self._ledger.store.list_inbound(statuses=statuses, limit=limit, after_id=after_id)

    def unanswered(self, limit: int = 100) -> builtins.list[Inbound]:
        """Admitted but not answered yet (received, or answering when a process died)."""
        return self.list([InboundStatus.RECEIVED, InboundStatus.ANSWERING], limit=limit)

    def start(self, inbound_id: int, *, max_starts: int = DEFAULT_MAX_STARTS) -> Inbound | None:
        """Count one start of answering; quarantine (and return None) past ``max_starts``.

        A message that keeps killing the process that answers it is set aside on its own,
        without stopping recovery for anyone else.
        """
        now = self._ledger.clock.now()
        inbound = self._ledger.store.start_inbound(inbound_id, now=now)
        if inbound.attempts > max_starts:
            self._ledger.store.quarantine_inbound(
                inbound_id,
                reason=f"answering started {inbound.attempts - 1} times without finishing",
                now=now,
            )
            return None
        return inbound

    def quarantine(self, inbound_id: int, reason: str) -> Inbound:
        return self._ledger.store.quarantine_inbound(
            inbound_id, reason=reason, now=self._ledger.clock.now()
        )
