"""The reply verbs, written once (statements in ``storage/sql/replies.sql``).

Each inbound message (:mod:`oncewire.storage.verbs.inbound`) has at most one reply record, which
owns every wire operation sent for it (see :mod:`oncewire.storage.replies` for the records and
the seam these verbs implement).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oncewire.core.errors import InboundNotFound, InvalidState, ReplyNotFound, StaleFence
from oncewire.storage.driver import Driver, Transaction
from oncewire.storage.replies import (
    WITHDRAWAL_PLAN,
    OpKind,
    OpState,
    Reply,
    ReplyOp,
    ReplyOpening,
    ReplyState,
)
from oncewire.storage.twins import verb_twins

__all__ = ["ReplyVerbs"]


class ReplyVerbs:
    """The replies' seam: open, commit and withdraw replies, lease them, record their wire
    operations; written once over ``self.db``, each docstring the contract."""

    db: Driver

    # -- replies -----------------------------------------------------------------------------
    def _insert_reply(self, conn: Any, opening: ReplyOpening, now: float) -> None:
        db, q = self.db, self.db.queries
        inbound_id, request = opening.inbound_id, opening.request
        if db.one(conn, q.inbound_exists, inbound_id=inbound_id) is None:
            raise InboundNotFound(f"no inbound message {inbound_id}", inbound_id=inbound_id)
        db.run(
            conn,
            q.insert_reply,
            inbound_id=inbound_id,
            platform=request.platform,
            bot=request.bot,
            chat=request.chat,
            thread=request.thread,
            reply_to=request.reply_to,
            format=request.format,
            cap=opening.cap,
            unit=opening.unit,
            max_attempts=opening.max_attempts,
            now=now,
        )

    def _open_reply(self, conn: Any, opening: ReplyOpening, *, now: float) -> Reply:
        """The inbound's reply record, created ``open`` if it has none (inbound: answering)."""
        db, q = self.db, self.db.queries
        self._insert_reply(conn, opening, now)
        db.run(conn, q.inbound_answering, inbound_id=opening.inbound_id, now=now)
        row = db.one(conn, q.reply_for_inbound, inbound_id=opening.inbound_id)
        assert row is not None  # inserted, or already there, in this transaction
        return Reply.from_row(row)

    open_reply, open_reply_in_tx = verb_twins("opening a reply", _open_reply)

    def commit_reply_in_tx(
        self,
        tx: Transaction,
        opening: ReplyOpening,
        *,
        final_text: str,
        plan_json: str,
        planned_sends: Sequence[tuple[int, str]],
        now: float,
    ) -> tuple[Reply, bool]:
        """Commit the final text on the inbound's reply (creating it if needed); (row, changed).

        An open reply becomes ``committed`` and its inbound ``answered``; ``planned_sends``
        (slot, body) are written as planned operations, except for slots a
        preview already sent. A reply that already has a final text is
        returned unchanged (the ledger compares the texts)."""
        db, q = self.db, self.db.queries
        conn = db.conn()  # the caller's transaction runs on this thread's connection
        if not db.in_transaction(conn):
            raise InvalidState("commit_reply_in_tx needs an open transaction on this thread")
        with db.translate_errors("committing a reply"):
            self._insert_reply(conn, opening, now)
            inbound_id = opening.inbound_id
            row = db.one(
                conn,
                q.commit_reply,
                inbound_id=inbound_id,
                final_text=final_text,
                plan=plan_json,
                now=now,
            )
            if row is None:
                existing = db.one(conn, q.reply_for_inbound, inbound_id=inbound_id)
                assert existing is not None  # inserted, or already there, in this transaction
                return Reply.from_row(existing), False
            reply = Reply.from_row(row)
            db.run(conn, q.inbound_answered, inbound_id=inbound_id, now=now)
            # A slot a stream preview already sent needs no send: it will be edited.
            sent = {slot for (slot,) in db.all(conn, q.acked_send_slots, reply_id=reply.id)}
            seq = self._next_seq(conn, reply.id)
            sends = [item for item in planned_sends if item[0] not in sent]
            db.batch(
                conn,
                q.plan_send,
                [
                    {"reply_id": reply.id, "seq": seq + n, "slot": slot, "body": body, "now": now}
                    for n, (slot, body) in enumerate(sends)
                ],
            )
        return reply, True

    def withdraw_reply_in_tx(
        self,
        tx: Transaction,
        opening: ReplyOpening,
        *,
        now: float,
    ) -> tuple[Reply, bool]:
        """Withdraw the inbound's reply (creating it if needed) before an answer is committed;
        (row, changed).

        An open reply becomes ``committed`` with an empty text and :data:`WITHDRAWAL_PLAN`, so
        the delivery deletes every message it shows and finishes it ``withdrawn``; the inbound's
        status is the caller's. A reply already committed, finished or withdrawn is returned
        unchanged (the ledger tells a withdrawal from an answer)."""
        db, q = self.db, self.db.queries
        with db.in_tx(tx, "withdrawing a reply") as conn:
            self._insert_reply(conn, opening, now)
            inbound_id = opening.inbound_id
            row = db.one(
                conn, q.withdraw_reply, inbound_id=inbound_id, plan=WITHDRAWAL_PLAN, now=now
            )
            if row is not None:
                return Reply.from_row(row), True
            existing = db.one(conn, q.reply_for_inbound, inbound_id=inbound_id)
        assert existing is not None  # inserted, or already there, in this transaction
        return Reply.from_row(existing), False

    def get_reply(self, reply_id: int) -> Reply | None:
        rows = self.db.read(self.db.queries.get_reply, reply_id=reply_id)
        return Reply.from_row(rows[0]) if rows else None

    def reply_for_inbound(self, inbound_id: int) -> Reply | None:
        rows = self.db.read(self.db.queries.reply_for_inbound, inbound_id=inbound_id)
        return Reply.from_row(rows[0]) if rows else None

    def list_replies(
        self,
        *,
        states: Sequence[ReplyState] = (),
        due_before: float | None = None,
        limit: int = 100,
        after_id: int = 0,
    ) -> list[Reply]:
        q = self.db.queries
        filters: dict[str, Any] = {
            "after_id": after_id,
            "any_state": not states,
            "states": [str(s) for s in states],
            "limit": limit,
        }
        if due_before is None:
            rows = self.db.read(q.list_replies, **filters)
        else:
            rows = self.db.read(q.list_due_replies, **filters, due_before=due_before)
        return [Reply.from_row(row) for row in rows]

    def deliverable_replies(
        self, *, platforms: Sequence[str], now: float, limit: int = 100
    ) -> list[Reply]:
        """Committed replies of ``platforms`` due by ``now`` that nobody holds (no lease, or
        one run out at ``now``), soonest first: what a delivery thread may take now. Reads the
        committed replies only, never the delivered ones."""
        rows = self.db.read(
            self.db.queries.deliverable_replies, platforms=list(platforms), now=now, limit=limit
        )
        return [Reply.from_row(row) for row in rows]

    def next_reply_due(self, *, platforms: Sequence[str]) -> float | None:
        """When the next committed reply of ``platforms`` becomes deliverable (its
        ``not_before``, or its lease's end when that is later); None when none is committed."""
        rows = self.db.read(self.db.queries.next_reply_due, platforms=list(platforms))
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def count_replies(self) -> dict[ReplyState, int]:
        counts = dict.fromkeys(ReplyState, 0)
        for state, count in self.db.read(self.db.queries.count_replies):
            counts[ReplyState(state)] = count
        return counts

    def claim_reply(
        self,
        reply_id: int,
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        dead_owners: Sequence[str] = (),
    ) -> Reply | None:
        """Lease the reply to ``owner`` unless another live owner holds it or it is finished
        (``delivered`` or ``dead``); None if so."""
        db = self.db
        with db.write("claiming a reply") as conn:
            row = db.one(
                conn,
                db.queries.claim_reply,
                owner=owner,
                expires_at=now + lease_seconds,
                now=now,
                reply_id=reply_id,
                dead=list(dead_owners),
            )
        return Reply.from_row(row) if row is not None else None

    def release_reply(
        self,
        reply_id: int,
        *,
        owner: str,
        now: float,
        not_before: float | None = None,
        last_error: str | None = None,
    ) -> None:
        """Give the lease back (optionally scheduling the next try)."""
        db = self.db
        with db.write("releasing a reply") as conn:
            db.run(
                conn,
                db.queries.release_reply,
                not_before=not_before,
                last_error=last_error,
                now=now,
                reply_id=reply_id,
                owner=owner,
            )

    def _finish_reply_in(
        self, conn: Any, reply_id: int, state: ReplyState, now: float, last_error: str | None
    ) -> Reply:
        db, q = self.db, self.db.queries
        row = db.one(
            conn,
            q.finish_reply,
            state=str(state),
            last_error=last_error,
            now=now,
            reply_id=reply_id,
        )
        if row is None:
            raise ReplyNotFound(f"no reply {reply_id}", reply_id=reply_id)
        reply = Reply.from_row(row)
        if state is ReplyState.DELIVERED:  # a dead reply leaves its inbound answered
            db.run(conn, q.inbound_delivered, inbound_id=reply.inbound_id, now=now)
        return reply

    def finish_reply(
        self,
        reply_id: int,
        *,
        state: ReplyState,
        now: float,
        last_error: str | None = None,
        settle: tuple[int, str] | None = None,
    ) -> Reply:
        """``delivered`` (the inbound becomes ``delivered``, unless it is ``quarantined``: then
        the reply said it was set aside, and it stays so), ``dead`` (it stays ``answered``) or
        ``withdrawn`` (a withdrawal whose messages are deleted; the inbound is left as it is);
        the lease ends."""
        if state not in (ReplyState.DELIVERED, ReplyState.DEAD, ReplyState.WITHDRAWN):
            raise InvalidState(f"a reply finishes as delivered, dead or withdrawn, not {state}")
        with self.db.write("finishing a reply") as conn:
            self._settle_in(conn, settle, now)
            return self._finish_reply_in(conn, reply_id, state, now, last_error)

    def _settle_in(self, conn: Any, settle: tuple[int, str] | None, now: float) -> None:
        if settle is not None:
            op_id, message_id = settle
            self.db.run(
                conn, self.db.queries.settle_op, op_id=op_id, message_id=message_id, now=now
            )

    # -- wire operations ---------------------------------------------------------------------
    def reply_ops(self, reply_id: int) -> list[ReplyOp]:
        rows = self.db.read(self.db.queries.reply_ops, reply_id=reply_id)
        return [ReplyOp.from_row(row) for row in rows]

    def _next_seq(self, conn: Any, reply_id: int) -> int:
        row = self.db.one(conn, self.db.queries.next_op_seq, reply_id=reply_id)
        assert row is not None  # an aggregate always has its one row
        return int(row[0])

    def begin_op(
        self,
        reply_id: int,
        *,
        slot: int,
        kind: OpKind,
        body: str,
        marked: bool,
        message_id: str | None,
        now: float,
        owner: str | None = None,
        lease_seconds: float = 60.0,
        settle: tuple[int, str] | None = None,
        expect_seq: int | None = None,
    ) -> ReplyOp:
        """Mark an operation ``in_flight`` (a matching planned one, or a new one) and commit.

        ``expect_seq`` is the last operation sequence number the caller read: if the reply's
        operations changed since, :class:`StaleFence` is raised and nothing is written (an
        engine acting on a stale view could send a chunk twice).

        ``settle`` (op id, message id) records an earlier in-flight edit as acknowledged in the
        same transaction (``settle`` means the same in :meth:`end_op` and :meth:`finish_reply`):
        an engine may fold an edit's acknowledgement into its next write, because an edit
        left ``in_flight`` by a crash is only replayed.

        With ``owner``, the reply is leased to it in the same transaction (or
        :class:`StaleFence` is raised if another live lease holds it, or the reply is finished).
        A marked send records the marker decision on the reply."""
        db, q = self.db, self.db.queries
        with db.write("starting a wire operation") as conn:
            self._settle_in(conn, settle, now)
            if expect_seq is not None and self._next_seq(conn, reply_id) - 1 != expect_seq:
                raise StaleFence(
                    f"reply {reply_id} changed since its operations were read", reply_id=reply_id
                )
            if owner is not None:
                leased = db.run(
                    conn,
                    q.lease_reply_for_op,
                    owner=owner,
                    expires_at=now + lease_seconds,
                    marked=marked,
                    now=now,
                    reply_id=reply_id,
                )
                if not leased:
                    raise StaleFence(
                        f"reply {reply_id} is leased to another owner or finished",
                        reply_id=reply_id,
                    )
            elif marked:
                db.run(conn, q.mark_reply, reply_id=reply_id, now=now)
            op = {"body": body, "marked": marked, "message_id": message_id, "now": now}
            row = db.one(
                conn, q.start_planned_op, **op, reply_id=reply_id, slot=slot, kind=str(kind)
            )
            if row is None:
                row = db.one(
                    conn,
                    q.insert_op,
                    **op,
                    reply_id=reply_id,
                    seq=self._next_seq(conn, reply_id),
                    slot=slot,
                    kind=str(kind),
                )
        assert row is not None  # an insert returns its row
        return ReplyOp.from_row(row)

    def end_op(
        self,
        op_id: int,
        *,
        state: OpState,
        now: float,
        message_id: str | None = None,
        retry_after: float | None = None,
        error: str | None = None,
        count_attempt: bool = False,
        deliver: bool = False,
        settle: tuple[int, str] | None = None,
    ) -> ReplyOp:
        """Record an operation's outcome; ``count_attempt`` adds a failed attempt to the reply;
        ``deliver`` also finishes the reply as delivered, in the same transaction."""
        if state in (OpState.PLANNED, OpState.IN_FLIGHT):
            raise InvalidState(f"an operation ends acked, refused, ambiguous or gone, not {state}")
        db, q = self.db, self.db.queries
        with db.write("recording a wire outcome") as conn:
            self._settle_in(conn, settle, now)
            row = db.one(
                conn,
                q.end_op,
                state=str(state),
                message_id=message_id,
                retry_after=retry_after,
                error=error,
                now=now,
                op_id=op_id,
            )
            if row is None:
                raise InvalidState(f"wire operation {op_id} is not in flight", op_id=op_id)
            op = ReplyOp.from_row(row)
            if state is OpState.GONE:
                db.run(conn, q.send_gone, reply_id=op.reply_id, message_id=op.message_id, now=now)
            if count_attempt:
                db.run(conn, q.count_reply_attempt, error=error, now=now, reply_id=op.reply_id)
            if deliver:
                self._finish_reply_in(conn, op.reply_id, ReplyState.DELIVERED, now, None)
        return op
