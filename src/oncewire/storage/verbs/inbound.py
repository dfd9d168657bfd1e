"""The inbound verbs, written once (statements in ``storage/sql/replies.sql``).

Inbound messages are admitted once under their platform identity (a re-delivery is counted, not
admitted again), started, quarantined, linked to the message whose reply answers them, and read
back as a session's history with their answers (see :mod:`oncewire.storage.replies` for the
records).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oncewire.core.errors import InboundNotFound, InvalidState
from oncewire.storage.driver import Driver, Transaction
from oncewire.storage.replies import Exchange, Inbound, InboundState
from oncewire.storage.twins import verb_twins

__all__ = ["InboundVerbs"]


class InboundVerbs:
    """The inbox's seam: admit inbound messages, start, quarantine and link them, read a
    session's history; written once over ``self.db``, each docstring the contract."""

    db: Driver

    def admit_inbound(
        self,
        *,
        platform: str,
        bot: str,
        chat: str,
        thread: str,
        platform_message_id: str,
        payload_json: str,
        digest: str,
        now: float,
    ) -> tuple[Inbound, bool]:
        """Insert the inbound unless its key exists (then count a re-delivery); (row, new)."""
        db, q = self.db, self.db.queries
        key = {
            "platform": platform,
            "bot": bot,
            "chat": chat,
            "thread": thread,
            "platform_message_id": platform_message_id,
        }
        with db.write("admitting an inbound message") as conn:
            row = db.one(conn, q.admit_inbound, **key, payload=payload_json, digest=digest, now=now)
            if row is not None:
                return Inbound.from_row(row), True
            row = db.one(conn, q.redeliver_inbound, **key, now=now)
        assert row is not None  # the insert conflicted with it, in this transaction
        return Inbound.from_row(row), False

    def get_inbound(self, inbound_id: int) -> Inbound | None:
        rows = self.db.read(self.db.queries.get_inbound, inbound_id=inbound_id)
        return Inbound.from_row(rows[0]) if rows else None

    def list_inbound(
        self, *, statuses: Sequence[InboundState] = (), limit: int = 100, after_id: int = 0
    ) -> list[Inbound]:
        rows = self.db.read(
            self.db.queries.list_inbound,
            after_id=after_id,
            any_status=not statuses,
            statuses=[str(s) for s in statuses],
            limit=limit,
        )
        return [Inbound.from_row(row) for row in rows]

    def queued_inbound(self, *, platforms: Sequence[str], limit: int) -> list[Inbound]:
        """Each session's oldest ``received`` message, of the ``platforms`` given, oldest first,
        at most ``limit`` of them: what a gateway may start next (a session's later messages
        wait behind its first). Reads the received messages only, never the handled ones."""
        rows = self.db.read(self.db.queries.queued_inbound, platforms=list(platforms), limit=limit)
        return [Inbound.from_row(row) for row in rows]

    def newest_inbound_ids(self, *, platform: str, since: float) -> dict[str, str]:
        """Per channel (a thread's own, else the chat's) of ``platform``, the newest message id
        admitted at ``since`` or later, among the ids that are numbers (compared as numbers; a
        Discord snowflake): where a backfill starts. Reads the messages admitted since then."""
        rows = self.db.read(self.db.queries.newest_inbound_ids, platform=platform, since=since)
        return {str(channel): str(int(message_id or "0")) for channel, message_id in rows}

    def announce_inbound_in_tx(self, tx: Transaction) -> None:
        """Wake :meth:`~oncewire.storage.store.Store.subscribe_inbound` subscribers when ``tx``
        commits, for a change the inbox itself does not show (a turn's interrupt recorded).
        SQLite: its commit wakes them already. PostgreSQL: ``NOTIFY oncewire_inbound``."""
        db = self.db
        with db.in_tx(tx, "announcing an inbox change") as conn:
            db.announce_inbound(conn)

    def _start_inbound(self, conn: Any, inbound_id: int, *, now: float) -> Inbound:
        """Count one start of answering; ``received`` becomes ``answering``."""
        row = self.db.one(conn, self.db.queries.start_inbound, inbound_id=inbound_id, now=now)
        return _found_inbound(row, inbound_id)

    start_inbound, start_inbound_in_tx = verb_twins("starting an inbound message", _start_inbound)

    def _quarantine_inbound(
        self, conn: Any, inbound_id: int, *, reason: str, now: float
    ) -> Inbound:
        """Set the inbound aside: ``quarantined`` whatever its status, ``reason`` its last error."""
        db = self.db
        row = db.one(
            conn, db.queries.quarantine_inbound, inbound_id=inbound_id, reason=reason, now=now
        )
        return _found_inbound(row, inbound_id)

    quarantine_inbound, quarantine_inbound_in_tx = verb_twins(
        "quarantining an inbound message", _quarantine_inbound
    )

    def link_inbound_in_tx(
        self,
        tx: Transaction,
        inbound_id: int,
        *,
        status: InboundState,
        answered_by: int,
        now: float,
    ) -> tuple[Inbound, bool]:
        """Mark the inbound ``superseded`` or ``merged``, answered by ``answered_by``; (row,
        changed).

        ``superseded`` is reached from ``received`` or ``answering`` (its answer was not
        committed), ``merged`` from ``received`` only (its own turn never started). Asking
        again with the same link changes nothing; any other transition raises
        :class:`InvalidState`, and an unknown inbound (either one) :class:`InboundNotFound`."""
        if status not in (InboundState.SUPERSEDED, InboundState.MERGED):
            raise InvalidState(f"an inbound message is superseded or merged, not {status}")
        if answered_by == inbound_id:
            raise InvalidState(f"inbound {inbound_id} cannot be answered by itself")
        db, q = self.db, self.db.queries
        with db.in_tx(tx, "linking an inbound message") as conn:
            if db.one(conn, q.inbound_exists, inbound_id=answered_by) is None:
                raise InboundNotFound(f"no inbound message {answered_by}", inbound_id=answered_by)
            row = db.one(
                conn,
                q.link_inbound,
                status=str(status),
                answered_by=answered_by,
                from_answering=status is InboundState.SUPERSEDED,
                inbound_id=inbound_id,
                now=now,
            )
            if row is not None:
                return Inbound.from_row(row), True
            current = db.one(conn, q.get_inbound, inbound_id=inbound_id)
        inbound = _found_inbound(current, inbound_id)
        if inbound.status is status and inbound.answered_by == answered_by:
            return inbound, False  # asked again: already so
        linked = "" if inbound.answered_by is None else f" by {inbound.answered_by}"
        raise InvalidState(
            f"inbound {inbound_id} is {inbound.status}{linked}: it cannot become {status} "
            f"by {answered_by}",
            inbound_id=inbound_id,
        )

    def session_history(
        self,
        *,
        platform: str,
        bot: str,
        chat: str,
        thread: str,
        before_id: int,
        statuses: Sequence[InboundState],
        limit: int,
    ) -> list[Exchange]:
        """The session's ``limit`` latest messages before ``before_id`` whose status is in
        ``statuses``, oldest first, each with the answer its user was given."""
        rows = self.db.read(
            self.db.queries.session_history,
            platform=platform,
            bot=bot,
            chat=chat,
            thread=thread,
            before_id=before_id,
            statuses=[str(s) for s in statuses],
            limit=limit,
        )
        return [Exchange.from_row(row) for row in reversed(rows)]


def _found_inbound(row: Any, inbound_id: int) -> Inbound:
    if row is None:
        raise InboundNotFound(f"no inbound message {inbound_id}", inbound_id=inbound_id)
    return Inbound.from_row(row)
