"""Admitting inbound messages once, durably, and asking what is still unanswered.

A platform re-delivers: a webhook retries, a websocket resumes, a reconnect replays, a restart
re-reads. :meth:`Inbox.admit` is an insert-on-conflict on (platform, bot, chat, thread,
platform message id), so whichever copy arrives first is the message and every later copy is
reported as a re-delivery (and counted), never processed again.

A message a newer one interrupts is ``superseded`` (:meth:`Inbox.supersede`), one steered into
a running turn ``merged`` (:meth:`Inbox.merge`); both name the inbound message whose reply
answers them (``answered_by``). The ``_in_tx`` variants write in the caller's store transaction
(``with ledger.store.transaction() as tx``, the one the run ledger's verbs take), so a gateway
can mark the message, end the run and withdraw the reply at once.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from oncewire.core.canonical import canonical_json, digest_json
from oncewire.core.clock import Clock
from oncewire.core.errors import InboundNotFound
from oncewire.core.limits import MAX_KEY_CHARS, check_name
from oncewire.core.states import coerce_states
from oncewire.storage import InboundStore, Transaction
from oncewire.storage.replies import Inbound, InboundState
from oncewire.storage.twins import own_transaction

__all__ = ["DEFAULT_MAX_STARTS", "Admission", "Inbox"]

T = TypeVar("T")

DEFAULT_MAX_STARTS = 3  # starts of answering before an inbound is quarantined


@dataclass(frozen=True, slots=True)
class Admission:
    """What admitting an inbound message did: the stored message, and whether it was new."""

    inbound: Inbound
    new: bool  # False: a re-delivery of a message admitted before; do not process it again
    # A re-delivery whose payload differs from the admitted one (an edited message, say): it is
    # still not processed again, but the caller is told rather than left to guess.
    payload_changed: bool = False


def _text_field(name: str, value: object, *, empty: bool = False) -> str:
    # The rules of an effect key: no control characters or lone surrogates, no edge
    # whitespace, refused alike on both backends before any SQL.
    return check_name(name, value, MAX_KEY_CHARS, empty=empty)


class Inbox:
    """Inbound messages, admitted once: ``ledger.inbound``."""

    def __init__(self, store: InboundStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock

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
        inbound, new = self._store.admit_inbound(
            platform=_text_field("platform", platform),
            bot=_text_field("bot", bot),
            chat=_text_field("chat", chat),
            thread=_text_field("thread", thread, empty=True),
            platform_message_id=_text_field("platform_message_id", platform_message_id),
            payload_json=payload_json,
            digest=payload_digest,
            now=self._clock.now(),
        )
        return Admission(inbound, new, payload_changed=inbound.digest != payload_digest)

    def get(self, inbound_id: int) -> Inbound:
        inbound = self._store.get_inbound(inbound_id)
        if inbound is None:
            raise InboundNotFound(f"no inbound message {inbound_id}", inbound_id=inbound_id)
        return inbound

    def list(
        self,
        status: InboundState | str | Sequence[InboundState | str] | None = None,
        *,
        limit: int = 100,
        after_id: int = 0,
    ) -> list[Inbound]:
        return self._store.list_inbound(
            statuses=coerce_states(InboundState, status), limit=limit, after_id=after_id
        )

    def queued(self, platforms: Sequence[str], *, limit: int) -> builtins.list[Inbound]:
        """Each session's oldest ``received`` message, of ``platforms``, oldest first, at most
        ``limit``: what may be started next (a session's later messages wait behind its
        first). Handled messages are not read, however long the inbox's history."""
        return self._store.queued_inbound(platforms=platforms, limit=limit)

    def newest_ids(self, platform: str, *, since: float) -> dict[str, str]:
        """Per channel (a thread's own, else the chat's), the newest message id of ``platform``
        admitted at ``since`` or later, among the ids that are numbers, compared as numbers."""
        return self._store.newest_inbound_ids(platform=platform, since=since)

    def unanswered(self, limit: int = 100) -> builtins.list[Inbound]:
        """Admitted but not answered yet (received, or answering when a process died)."""
        return self.list([InboundState.RECEIVED, InboundState.ANSWERING], limit=limit)

    def _in_own_transaction(self, write: Callable[[Transaction], T]) -> T:
        """``write(tx)`` in a store transaction of its own, committed when it returns."""
        with self._store.transaction() as tx:
            return write(tx)

    def start_in_tx(
        self, tx: Transaction, inbound_id: int, *, max_starts: int = DEFAULT_MAX_STARTS
    ) -> Inbound | None:
        """:meth:`start` in the caller's transaction (with the turn's run start and the reply's
        opening, say): the count, and a quarantine past ``max_starts``, commit with them."""
        now = self._clock.now()
        inbound = self._store.start_inbound_in_tx(tx, inbound_id, now=now)
        if inbound.attempts > max_starts:
            self._store.quarantine_inbound_in_tx(
                tx,
                inbound_id,
                reason=f"answering started {inbound.attempts - 1} times without finishing",
                now=now,
            )
            return None
        return inbound

    start = own_transaction(
        start_in_tx,
        _in_own_transaction,
        """Count one start of answering; quarantine (and return None) past ``max_starts``.

        A message that keeps killing the process that answers it is set aside on its own,
        without stopping recovery for anyone else.
        """,
    )

    def quarantine(self, inbound_id: int, reason: str) -> Inbound:
        return self._store.quarantine_inbound(inbound_id, reason=reason, now=self._clock.now())

    def supersede_in_tx(self, tx: Transaction, inbound_id: int, *, by: int) -> Inbound:
        """The message was interrupted by the newer inbound ``by`` before its answer was
        committed: ``superseded``, answered by ``by``, in the caller's transaction.

        Allowed from ``received`` and ``answering``; superseding again by the same message
        changes nothing; anything else (an answer committed or delivered, a quarantined message,
        another link) raises :class:`InvalidState` and writes nothing.
        """
        inbound, _ = self._store.link_inbound_in_tx(
            tx,
            inbound_id,
            status=InboundState.SUPERSEDED,
            answered_by=by,
            now=self._clock.now(),
        )
        return inbound

    supersede = own_transaction(
        supersede_in_tx,
        _in_own_transaction,
        """:meth:`supersede_in_tx` in a transaction of its own.""",
    )

    def merge_in_tx(self, tx: Transaction, inbound_id: int, *, into: int) -> Inbound:
        """The message was steered into the running turn of inbound ``into``, whose reply
        answers it: ``merged``, answered by ``into``, in the caller's transaction.

        Allowed from ``received`` only (its own turn never started); merging again into the
        same message changes nothing; anything else raises :class:`InvalidState`.
        """
        inbound, _ = self._store.link_inbound_in_tx(
            tx,
            inbound_id,
            status=InboundState.MERGED,
            answered_by=into,
            now=self._clock.now(),
        )
        return inbound

    merge = own_transaction(
        merge_in_tx, _in_own_transaction, """:meth:`merge_in_tx` in a transaction of its own."""
    )
