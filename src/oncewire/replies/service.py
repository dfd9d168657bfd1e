"""The replies ledger: one record per inbound message that owns every wire operation.

A reply record is opened before the first stream preview is sent (so every preview message id
is written down) or created when the final text is committed. The final assistant text and the
reply record commit in one transaction with the caller's own rows::

    with ledger.transaction() as tx:
        tx.execute("INSERT INTO transcript (inbound, text) VALUES (:id, :text)",
                   {"id": inbound.id, "text": text})
        ledger.replies.commit_in_tx(tx, inbound.id, text, profile)

Delivering it is the reply engine's job (:class:`oncewire.replies.engine.ReplyEngine`).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import TypeVar

from oncewire.core import crash
from oncewire.core.canonical import canonical_json
from oncewire.core.clock import Clock
from oncewire.core.errors import ConfigurationError, InvalidState, ReplyConflict, ReplyNotFound
from oncewire.core.limits import MAX_ATTEMPTS_LIMIT, check_count
from oncewire.core.states import coerce_states
from oncewire.inbound.service import Inbox
from oncewire.replies.splitting import Chunk, split_text
from oncewire.replies.wire import PlatformProfile
from oncewire.storage import ReplyStore, Transaction
from oncewire.storage.replies import (
    Exchange,
    Inbound,
    InboundState,
    Reply,
    ReplyOp,
    ReplyOpening,
    ReplyState,
    SendRequest,
)
from oncewire.storage.twins import own_transaction

__all__ = ["DEFAULT_REPLY_ATTEMPTS", "HISTORY_LIMIT", "Replies", "plan_chunks"]

T = TypeVar("T")

DEFAULT_REPLY_ATTEMPTS = 8
HISTORY_LIMIT = 1000  # earlier messages one history() call returns at most

# The earlier messages a history shows: those answered, and those another message's answer
# stands for (superseded: interrupted by a newer one; merged into one). Not the ones still
# waiting, nor a quarantined one: it failed to be answered again and again, and carrying it into
# every later turn would carry its failure too.
_HISTORY_STATUSES = (
    InboundState.ANSWERED,
    InboundState.DELIVERED,
    InboundState.SUPERSEDED,
    InboundState.MERGED,
)

COMMIT_BEFORE_COMMIT = crash.register(
    "replies.commit_before_commit",
    "the final text and the reply record are written in the caller's transaction, not committed",
)


def plan_chunks(text: str, profile: PlatformProfile) -> list[Chunk]:
    """The chunk plan of ``text``: within the cap, with room for the marker in every chunk."""
    return split_text(text, profile.cap, profile.unit, reserve=profile.marker_cost)


class Replies:
    """Reply records and their wire operations: ``ledger.replies`` (it reads ``inbox`` for
    the message a reply answers)."""

    def __init__(self, store: ReplyStore, clock: Clock, *, inbox: Inbox) -> None:
        self._store = store
        self._clock = clock
        self._inbox = inbox

    def _inbound(self, inbound_id: int) -> Inbound:
        return self._inbox.get(inbound_id)

    def _opening(
        self,
        inbound_id: int,
        profile: PlatformProfile,
        max_attempts: int,
        reply_to: str | None = None,
        format: str = "plain",
        use_reply_to: bool = True,
    ) -> ReplyOpening:
        """What the inbound's reply record is created with, if it has none yet; every way of
        making a reply record builds it here, so ``max_attempts`` is checked for all of them
        before the inbound is read or anything stored."""
        check_count("max_attempts", max_attempts, 1, MAX_ATTEMPTS_LIMIT)
        inbound = self._inbound(inbound_id)
        request = SendRequest(
            platform=inbound.platform,
            bot=inbound.bot,
            chat=inbound.chat,
            thread=inbound.thread,
            reply_to=(reply_to or inbound.platform_message_id) if use_reply_to else None,
            format=format,
        )
        return ReplyOpening(inbound.id, request, profile.cap, profile.unit, max_attempts)

    def _in_own_transaction(self, write: Callable[[Transaction], T]) -> T:
        """``write(tx)`` in a store transaction of its own, committed when it returns."""
        with self._store.transaction() as tx:
            return write(tx)

    def open(
        self,
        inbound_id: int,
        profile: PlatformProfile,
        *,
        reply_to: str | None = None,
        format: str = "plain",
        use_reply_to: bool = True,
        max_attempts: int = DEFAULT_REPLY_ATTEMPTS,
    ) -> Reply:
        """The inbound's reply record, opened (before any preview is sent) if it has none."""
        return self._store.open_reply(
            self._opening(inbound_id, profile, max_attempts, reply_to, format, use_reply_to),
            now=self._clock.now(),
        )

    def open_in_tx(
        self,
        tx: Transaction,
        inbound_id: int,
        profile: PlatformProfile,
        *,
        reply_to: str | None = None,
        format: str = "plain",
        use_reply_to: bool = True,
        max_attempts: int = DEFAULT_REPLY_ATTEMPTS,
    ) -> Reply:
        """:meth:`open` in the caller's transaction, so that a turn's start (the inbound's
        start, the run's, the reply record) commits as one."""
        return self._store.open_reply_in_tx(
            tx,
            self._opening(inbound_id, profile, max_attempts, reply_to, format, use_reply_to),
            now=self._clock.now(),
        )

    def commit_in_tx(
        self,
        tx: Transaction,
        inbound_id: int,
        text: str,
        profile: PlatformProfile,
        *,
        reply_to: str | None = None,
        format: str = "plain",
        use_reply_to: bool = True,
        max_attempts: int = DEFAULT_REPLY_ATTEMPTS,
    ) -> Reply:
        """Commit the final text on the inbound's reply record, in the caller's transaction.

        Committing the same text again returns the record unchanged; another text raises
        :class:`ReplyConflict` (and the caller's transaction rolls back when it propagates).
        """
        if not isinstance(text, str):
            raise ConfigurationError("a reply's text must be a string")
        opening = self._opening(inbound_id, profile, max_attempts, reply_to, format, use_reply_to)
        chunks = plan_chunks(text, profile)
        reply, changed = self._store.commit_reply_in_tx(
            tx,
            opening,
            final_text=text,
            plan_json=canonical_json([c.as_dict() for c in chunks]),
            planned_sends=[(slot, chunk.text) for slot, chunk in enumerate(chunks)],
            now=self._clock.now(),
        )
        if not changed and reply.final_text != text:
            raise ReplyConflict(
                f"inbound {inbound_id} already has a committed reply with other text",
                inbound_id=inbound_id,
                reply_id=reply.id,
            )
        if changed:
            COMMIT_BEFORE_COMMIT.hit()
        return reply

    commit = own_transaction(
        commit_in_tx, _in_own_transaction, """Commit the final text in a transaction of its own."""
    )

    def withdraw_in_tx(
        self,
        tx: Transaction,
        inbound_id: int,
        profile: PlatformProfile,
        *,
        max_attempts: int = DEFAULT_REPLY_ATTEMPTS,
    ) -> Reply:
        """Withdraw the inbound's reply before its answer is committed, in the caller's store
        transaction (``ledger.store.transaction()``, with the run's ``interrupted`` and the
        inbound's ``superseded``, say).

        The record (created if the inbound has none) is committed with no chunk, so delivering
        it deletes every preview it shows, or edits them to a one-line note where the platform
        cannot delete, and it ends ``withdrawn``; a later commit of an answer for the inbound
        raises :class:`ReplyConflict`. Withdrawing again returns the record. A reply whose
        answer is committed is always delivered: withdrawing it raises :class:`InvalidState`.
        """
        reply, _ = self._store.withdraw_reply_in_tx(
            tx,
            self._opening(inbound_id, profile, max_attempts),
            now=self._clock.now(),
        )
        if not reply.withdrawal:
            raise InvalidState(
                f"reply {reply.id} of inbound {inbound_id} is {reply.state} with an answer: "
                "a committed answer is delivered, not withdrawn",
                reply_id=reply.id,
                inbound_id=inbound_id,
            )
        return reply

    withdraw = own_transaction(
        withdraw_in_tx,
        _in_own_transaction,
        """:meth:`withdraw_in_tx` in a transaction of its own.""",
    )

    def get(self, reply_id: int) -> Reply:
        reply = self._store.get_reply(reply_id)
        if reply is None:
            raise ReplyNotFound(f"no reply {reply_id}", reply_id=reply_id)
        return reply

    def for_inbound(self, inbound_id: int) -> Reply | None:
        return self._store.reply_for_inbound(inbound_id)

    def history(self, inbound_id: int, *, limit: int = 20) -> builtins.list[Exchange]:
        """What came before ``inbound_id`` on its session (platform, bot, chat, thread), oldest
        first: at most ``limit`` earlier messages, each with the answer its user was given.

        The messages are those answered or delivered, and those superseded or merged (their
        ``answer`` is ``None``: a newer message's reply answers them). The answer is the
        committed final text, as the user sees it; ``None`` while none is committed, for a
        withdrawn reply and for a reply whose delivery was given up."""
        check_count("limit", limit, 0, HISTORY_LIMIT)
        inbound = self._inbound(inbound_id)
        if limit == 0:
            return []
        return self._store.session_history(
            platform=inbound.platform,
            bot=inbound.bot,
            chat=inbound.chat,
            thread=inbound.thread,
            before_id=inbound.id,
            statuses=_HISTORY_STATUSES,
            limit=limit,
        )

    def ops(self, reply_id: int) -> list[ReplyOp]:
        return self._store.reply_ops(reply_id)

    def chunks(self, reply: Reply) -> list[Chunk]:
        return [Chunk.from_dict(item) for item in reply.plan]

    def list(
        self,
        state: ReplyState | str | Sequence[ReplyState | str] | None = None,
        *,
        limit: int = 100,
        after_id: int = 0,
    ) -> list[Reply]:
        return self._store.list_replies(
            states=coerce_states(ReplyState, state), limit=limit, after_id=after_id
        )

    def undelivered(self, limit: int = 100) -> builtins.list[Reply]:
        """Committed but not yet delivered (whatever their schedule), withdrawals included."""
        return self.list(ReplyState.COMMITTED, limit=limit)

    def due(self, limit: int = 100) -> builtins.list[Reply]:
        return self._store.list_replies(
            states=[ReplyState.COMMITTED], due_before=self._clock.now(), limit=limit
        )

    def deliverable(self, platforms: Sequence[str], *, limit: int = 100) -> builtins.list[Reply]:
        """Committed replies of ``platforms`` whose time has come and that nobody holds (no
        lease, or one run out), soonest first: what a delivery thread may take now."""
        return self._store.deliverable_replies(
            platforms=platforms, now=self._clock.now(), limit=limit
        )

    def next_deliverable(self, platforms: Sequence[str]) -> float | None:
        """When the next committed reply of ``platforms`` becomes deliverable (its retry time,
        or its lease's end when later); None when none is committed."""
        return self._store.next_reply_due(platforms=platforms)

    def counts(self) -> dict[ReplyState, int]:
        return self._store.count_replies()
