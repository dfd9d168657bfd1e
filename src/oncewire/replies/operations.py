"""One reply's wire operations, as the reply engine performs them.

Every operation is written ``in_flight`` on the reply record (under the record's lease and the
sequence number last read) before the platform is called, and its typed outcome is recorded
after; an acknowledged edit's outcome may ride on the engine's next write for the reply. Within
one engine, the thread working on a reply has it to itself: another thread of the same engine
leaves it alone, because an operation in flight there is a live call, not a dead process's
leftover. Taking a reply over from a dead owner turns its leftover ``in_flight`` operations into
``ambiguous`` ones (they may have landed).

:class:`~oncewire.replies.engine.ReplyEngine` inherits these as the half of it that touches the
wire and the record; the decisions (what to send next, when to wait, when to give up) are the
engine's and :mod:`oncewire.replies.plan`'s. Each operation whose outcome is recorded is observed
(:mod:`oncewire.core.observe`): its kind, its outcome and how long the platform took.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Protocol

from oncewire.core import crash
from oncewire.core.clock import Clock
from oncewire.core.errors import InvalidState, StaleFence
from oncewire.core.ids import owner_is_dead_locally
from oncewire.core.observe import LISTENERS, REPLY_OPERATION, emit
from oncewire.inbound import Inbox
from oncewire.replies.plan import Step
from oncewire.replies.wire import (
    Delivered,
    Gone,
    MaybeDelivered,
    NotDelivered,
    Platform,
    RejectedForGood,
    WireOutcome,
    idempotency_key,
    vet_outcome,
)
from oncewire.storage import ReplyStore
from oncewire.storage.replies import Inbound, OpKind, OpState, Reply, ReplyOp, SendRequest

__all__ = [
    "COMMITTED_NOT_SENT",
    "EDIT_ACK_LOST",
    "PREVIEW_NOT_COMMITTED",
    "SEND_IN_FLIGHT",
    "SENT_ACK_LOST",
    "ReplyOperations",
]

log = logging.getLogger("oncewire.replies")

COMMITTED_NOT_SENT = crash.register(
    "replies.committed_not_sent",
    "the final text and the reply record are committed; the final delivery has not started",
)
SEND_IN_FLIGHT = crash.register(
    "replies.send_in_flight",
    "a send is durably in flight; the platform has not been called (it never sees it)",
)
SENT_ACK_LOST = crash.register(
    "replies.sent_ack_lost",
    "the platform accepted a send; its acknowledgement is not recorded",
)
EDIT_ACK_LOST = crash.register(
    "replies.edit_ack_lost",
    "the platform accepted an edit; its acknowledgement is not recorded",
)
PREVIEW_NOT_COMMITTED = crash.register(
    "replies.preview_visible_not_committed",
    "a stream preview shows the whole answer; the final text is not committed",
)


_ANSWERED_KEPT = 4096

# How an observation names each wire outcome (docs/observability.md).
_OUTCOME_NAMES: dict[type, str] = {
    Delivered: "delivered",
    NotDelivered: "not_delivered",
    MaybeDelivered: "maybe_delivered",
    RejectedForGood: "rejected",
    Gone: "gone",
}


class _LedgerParts(Protocol):
    """What the operations use of the engine's Ledger (which sits above this package)."""

    @property
    def store(self) -> ReplyStore: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def inbound(self) -> Inbox: ...


class ReplyOperations:
    """Perform and record one reply's wire operations; see the module docstring."""

    ledger: _LedgerParts
    owner: str
    lease_seconds: float
    # reply id -> (edit op id, message id): an edit the platform acknowledged whose
    # acknowledgement rides on this engine's next write for the reply. A crash before that
    # write leaves the edit in flight, and an edit in flight is only replayed.
    _pending: dict[int, tuple[int, str]]
    # reply id -> (thread, depth): the thread of this engine working on the reply now.
    _working: dict[int, tuple[int, int]]
    _working_lock: threading.Condition  # notified whenever a thread leaves a reply
    # inbound id -> its platform message id (never changes once admitted), which every send's
    # idempotency key names: read once per inbound, not once per send. Bounded: cleared when
    # it holds _ANSWERED_KEPT entries.
    _answered: dict[int, str]

    def _ops(self, reply_id: int, read: list[ReplyOp] | None = None) -> list[ReplyOp]:
        """The record's operations (``read``: as just read from it, by :meth:`_take`), with
        this engine's unwritten edit acknowledgement applied."""
        ops = self.ledger.store.reply_ops(reply_id) if read is None else read
        pending = self._pending.get(reply_id)
        if pending is None:
            return ops
        return [
            replace(op, state=OpState.ACKED, message_id=pending[1]) if op.id == pending[0] else op
            for op in ops
        ]

    def _enter(self, reply_id: int, *, wait: bool = False) -> bool:
        """Claim ``reply_id`` for this thread within this engine (re-entrant); False when
        another thread of the engine is working on it, or with ``wait`` once it has left."""
        me = threading.get_ident()
        with self._working_lock:
            while True:
                thread, depth = self._working.get(reply_id, (me, 0))
                if thread == me:
                    self._working[reply_id] = (me, depth + 1)
                    return True
                if not wait:
                    return False
                self._working_lock.wait()

    def _leave(self, reply_id: int) -> None:
        with self._working_lock:
            thread, depth = self._working[reply_id]
            if depth == 1:
                del self._working[reply_id]
                self._working_lock.notify_all()
            else:
                self._working[reply_id] = (thread, depth - 1)

    def _flush(self, reply_id: int) -> None:
        pending = self._pending.pop(reply_id, None)
        if pending is not None:
            self.ledger.store.end_op(
                pending[0], state=OpState.ACKED, message_id=pending[1], now=self.ledger.clock.now()
            )

    def _perform(
        self,
        reply: Reply,
        platform: Platform,
        step: Step,
        seen: list[ReplyOp],
        *,
        deliver: bool,
        count: bool,
    ) -> WireOutcome:
        store, clock = self.ledger.store, self.ledger.clock
        op = store.begin_op(
            reply.id,
            slot=step.slot,
            kind=step.kind,
            body=step.body,
            marked=step.marked,
            message_id=step.message_id,
            now=clock.now(),
            owner=self.owner,
            lease_seconds=self.lease_seconds,
            settle=self._pending.pop(reply.id, None),
            expect_seq=max((op.seq for op in seen), default=0),
        )
        called = time.perf_counter() if LISTENERS else 0.0
        # vet_outcome: whatever an adapter returns, only a well-formed Delivered is an ack.
        if step.kind is OpKind.SEND:
            SEND_IN_FLIGHT.hit()
            request = self._keyed(reply, step.slot, step.generation)
            answer = platform.send(request, step.body, marked=step.marked)
            outcome = vet_outcome(answer, "send", reply.id)
            if isinstance(outcome, Delivered):
                SENT_ACK_LOST.hit()
        elif step.kind is OpKind.EDIT:
            assert step.message_id is not None
            answer = platform.edit(reply.request, step.message_id, step.body, marked=step.marked)
            outcome = vet_outcome(answer, "edit", reply.id)
            if isinstance(outcome, Delivered):
                EDIT_ACK_LOST.hit()
        else:
            assert step.message_id is not None
            answer = platform.delete(reply.request, step.message_id)
            outcome = vet_outcome(answer, "delete", reply.id)
        took = time.perf_counter() - called
        try:
            self._record(op, outcome, deliver=deliver, count=count)
        except InvalidState as exc:  # another engine took the reply over mid-call
            raise StaleFence(f"reply {reply.id} was taken over during a call") from exc
        if LISTENERS:
            emit(
                REPLY_OPERATION,
                {
                    "kind": str(step.kind),
                    "outcome": _OUTCOME_NAMES.get(type(outcome), type(outcome).__name__),
                    "reply_id": reply.id,
                    "slot": step.slot,
                    "marked": step.marked,
                    "duration_seconds": took,
                },
            )
        return outcome

    def _inbound(self, inbound_id: int) -> Inbound:
        """The inbound message, read; its platform message id is remembered for the sends."""
        inbound = self.ledger.inbound.get(inbound_id)
        self._remember(inbound_id, inbound.platform_message_id)
        return inbound

    def _remember(self, inbound_id: int, platform_message_id: str) -> None:
        if len(self._answered) >= _ANSWERED_KEPT:
            self._answered.clear()
        self._answered[inbound_id] = platform_message_id

    def _keyed(self, reply: Reply, slot: int, generation: int) -> SendRequest:
        """The reply's request with the idempotency key of this slot's sends."""
        answered = self._answered.get(reply.inbound_id)
        if answered is None:
            answered = self._inbound(reply.inbound_id).platform_message_id
        key = idempotency_key(reply.request, answered, slot, generation)
        return replace(reply.request, idempotency_key=key)

    def _record(self, op: ReplyOp, outcome: WireOutcome, *, deliver: bool, count: bool) -> None:
        store, now = self.ledger.store, self.ledger.clock.now()
        if isinstance(outcome, Delivered) and op.kind is OpKind.EDIT and not deliver:
            self._pending[op.reply_id] = (op.id, outcome.message_id)
        elif isinstance(outcome, Delivered):
            store.end_op(
                op.id,
                state=OpState.ACKED,
                message_id=outcome.message_id,
                now=now,
                deliver=deliver,
                settle=self._pending.pop(op.reply_id, None),
            )
        elif isinstance(outcome, NotDelivered):
            # A refusal that says when to come back (a 429, a local rate limiter with no token)
            # is the platform's schedule, not a failed delivery: it costs no attempt, so a busy
            # chat's answer waits its turn instead of running out of attempts and going dead.
            store.end_op(
                op.id,
                state=OpState.REFUSED,
                retry_after=outcome.retry_after,
                error=outcome.reason,
                now=now,
                count_attempt=count and outcome.retry_after is None,
            )
        elif isinstance(outcome, MaybeDelivered):
            store.end_op(
                op.id, state=OpState.AMBIGUOUS, error=outcome.reason, now=now, count_attempt=count
            )
        elif isinstance(outcome, Gone):
            store.end_op(op.id, state=OpState.GONE, error=f"gone: {outcome.reason}", now=now)
        else:
            store.end_op(
                op.id,
                state=OpState.REFUSED,
                error=f"rejected: {outcome.reason}",
                now=now,
                count_attempt=count,
            )

    def _take(self, reply: Reply) -> Reply | None:
        """Lease ``reply`` for this engine (None if a live owner holds it) and settle leftovers."""
        return self._take_reading(reply)[0]

    def _take_reading(self, reply: Reply) -> tuple[Reply | None, list[ReplyOp] | None]:
        """:meth:`_take`, and the operations it read when nothing needed taking over (they are
        the record's as they stand: the first step is planned from them without reading them
        again); None when it changed them or gave up.

        An operation still ``in_flight`` here belongs to a process that died mid-call (or to an
        earlier life of this engine): it may have landed, so it becomes ``ambiguous``.
        """
        store, now = self.ledger.store, self.ledger.clock.now()
        pending = self._pending.get(reply.id)

        def orphans(ops: list[ReplyOp]) -> list[ReplyOp]:
            return [
                op
                for op in ops
                if op.state is OpState.IN_FLIGHT and (pending is None or op.id != pending[0])
            ]

        held_elsewhere = reply.lease_owner is not None and reply.lease_owner != self.owner
        if not held_elsewhere:
            ops = store.reply_ops(reply.id)
            if not orphans(ops):
                return reply, ops
        # Hold the lease first: then nobody is mid-call on what is still in flight.
        owner = reply.lease_owner
        dead = [owner] if owner is not None and owner_is_dead_locally(owner) else []
        claimed = store.claim_reply(
            reply.id, owner=self.owner, now=now, lease_seconds=self.lease_seconds, dead_owners=dead
        )
        if claimed is None:
            return None, None
        log.info(
            "reply taken over",
            extra={"reply_id": reply.id, "previous_owner": owner, "owner": self.owner},
        )
        try:
            for op in orphans(store.reply_ops(reply.id)):
                store.end_op(
                    op.id,
                    state=OpState.AMBIGUOUS,
                    error="the process died during the call",
                    now=now,
                )
        except InvalidState:
            return None, None  # taken over again meanwhile (its lease ran out): leave it
        return claimed, None
