"""SQLite verbs for inbound messages, reply records and wire operations."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from oncewire.core.errors import InboundNotFound, InvalidState, ReplyNotFound, StaleFence
from oncewire.storage.replies import (
    INBOUND_COLUMNS,
    OP_COLUMNS,
    REPLY_COLUMNS,
    Inbound,
    InboundStatus,
    OpKind,
    OpState,
    Reply,
    ReplyOp,
    ReplyState,
    ReplyVerbs,
    SendRequest,
)
from oncewire.storage.sqlite.connection import translate_errors

if TYPE_CHECKING:
    from oncewire.storage.base import Transaction

__all__ = ["SQLiteReplyVerbs"]

_INBOUND_COLUMNS = INBOUND_COLUMNS
_REPLY_COLUMNS = REPLY_COLUMNS
_OP_COLUMNS = OP_COLUMNS
_inbound = Inbound.from_row
_reply = Reply.from_row
_op = ReplyOp.from_row


class SQLiteReplyVerbs(ReplyVerbs):
    """Mixed into :class:`SQLiteStore`; uses its connection and transaction helpers."""

    if TYPE_CHECKING:

        def _conn(self) -> sqlite3.Connection: ...

        def _write(self, what: str) -> AbstractContextManager[sqlite3.Connection]: ...

        def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    # -- inbound -----------------------------------------------------------------------------
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
        key = (platform, bot, chat, thread, platform_message_id)
        with self._write("admitting an inbound message") as conn:
            inserted = conn.execute(
                "INSERT INTO oncewire_inbound (platform, bot, chat, thread, platform_message_id, "
                "payload, digest, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                f"ON CONFLICT DO NOTHING RETURNING {_INBOUND_COLUMNS}",
                (*key, payload_json, digest, now, now),
            ).fetchall()
            if inserted:
                return _inbound(inserted[0]), True
            rows = conn.execute(
                "UPDATE oncewire_inbound SET deliveries = deliveries + 1, updated_at = ? "
                "WHERE platform = ? AND bot = ? AND chat = ? AND thread = ? "
                f"AND platform_message_id = ? RETURNING {_INBOUND_COLUMNS}",
                (now, *key),
            ).fetchall()
        return _inbound(rows[0]), False

    def get_inbound(self, inbound_id: int) -> Inbound | None:
        rows = self._read(
            f"SELECT {_INBOUND_COLUMNS} FROM oncewire_inbound WHERE id = ?", (inbound_id,)
        )
        return _inbound(rows[0]) if rows else None

    def list_inbound(
        self, *, statuses: Sequence[InboundStatus] = (), limit: int = 100, after_id: int = 0
    ) -> list[Inbound]:
        where = "id > ?"
        params: list[Any] = [after_id]
        if statuses:
            where += f" AND status IN ({', '.join('?' * len(statuses))})"
            params += [str(s) for s in statuses]
        rows = self._read(
            f"SELECT {_INBOUND_COLUMNS} FROM oncewire_inbound WHERE {where} ORDER BY id LIMIT ?",
            (*params, limit),
        )
        return [_inbound(row) for row in rows]

    def _update_inbound(
        self, what: str, sql: str, params: Sequence[Any], inbound_id: int
    ) -> Inbound:
        with self._write(what) as conn:
            rows = conn.execute(
                f"{sql} WHERE id = ? RETURNING {_INBOUND_COLUMNS}", (*params, inbound_id)
            ).fetchall()
        if not rows:
            raise InboundNotFound(f"no inbound message {inbound_id}", inbound_id=inbound_id)
        return _inbound(rows[0])

    def start_inbound(self, inbound_id: int, *, now: float) -> Inbound:
        return self._update_inbound(
            "starting an inbound message",
            "UPDATE oncewire_inbound SET attempts = attempts + 1, updated_at = ?, "
            "status = CASE WHEN status = 'received' THEN 'answering' ELSE status END",
            (now,),
            inbound_id,
        )

    def quarantine_inbound(self, inbound_id: int, *, reason: str, now: float) -> Inbound:
        return self._update_inbound(
            "quarantining an inbound message",
            "UPDATE oncewire_inbound SET status = 'quarantined', last_error = ?, updated_at = ?",
            (reason, now),
            inbound_id,
        )

    # -- replies -----------------------------------------------------------------------------
    @staticmethod
    def _insert_reply(
        conn: sqlite3.Connection,
        inbound_id: int,
        request: SendRequest,
        cap: int,
        unit: str,
        max_attempts: int,
        now: float,
    ) -> None:
        exists = conn.execute(
            "SELECT 1 FROM oncewire_inbound WHERE id = ?", (inbound_id,)
        ).fetchone()
        if not exists:
            raise InboundNotFound(f"no inbound message {inbound_id}", inbound_id=inbound_id)
        conn.execute(
            "INSERT INTO oncewire_replies (inbound_id, platform, bot, chat, thread, reply_to, "
            "format, cap, unit, max_attempts, not_before, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (inbound_id) DO NOTHING",
            (
                inbound_id,
                request.platform,
                request.bot,
                request.chat,
                request.thread,
                request.reply_to,
                request.format,
                cap,
                unit,
                max_attempts,
                now,
                now,
                now,
            ),
        )

    def open_reply(
        self,
        *,
        inbound_id: int,
        request: SendRequest,
        cap: int,
        unit: str,
        max_attempts: int,
        now: float,
    ) -> Reply:
        with self._write("opening a reply") as conn:
            self._insert_reply(conn, inbound_id, request, cap, unit, max_attempts, now)
            conn.execute(
                "UPDATE oncewire_inbound SET status = 'answering', updated_at = ? "
                "WHERE id = ? AND status = 'received'",
                (now, inbound_id),
            )
            rows = conn.execute(
                f"SELECT {_REPLY_COLUMNS} FROM oncewire_replies WHERE inbound_id = ?",
                (inbound_id,),
            ).fetchall()
        return _reply(rows[0])

    def commit_reply_in_tx(
        self,
        tx: Transaction,
        *,
        inbound_id: int,
        request: SendRequest,
        cap: int,
        unit: str,
        max_attempts: int,
        final_text: str,
        plan_json: str,
        planned_sends: Sequence[tuple[int, str]],
        now: float,
    ) -> tuple[Reply, bool]:
        conn = self._conn()  # the caller's transaction runs on this thread's connection
        if not conn.in_transaction:
            raise InvalidState("commit_reply_in_tx needs an open transaction on this thread")
        with translate_errors("committing a reply"):
            self._insert_reply(conn, inbound_id, request, cap, unit, max_attempts, now)
            rows = conn.execute(
                "UPDATE oncewire_replies SET state = 'committed', final_text = ?, plan = ?, "
                "not_before = ?, updated_at = ? WHERE inbound_id = ? AND state = 'open' "
                f"RETURNING {_REPLY_COLUMNS}",
                (final_text, plan_json, now, now, inbound_id),
            ).fetchall()
            if not rows:
                existing = conn.execute(
                    f"SELECT {_REPLY_COLUMNS} FROM oncewire_replies WHERE inbound_id = ?",
                    (inbound_id,),
                ).fetchall()
                return _reply(existing[0]), False
            reply = _reply(rows[0])
            conn.execute(
                "UPDATE oncewire_inbound SET status = 'answered', updated_at = ? "
                "WHERE id = ? AND status IN ('received', 'answering')",
                (now, inbound_id),
            )
            # A slot a stream preview already sent needs no send: it will be edited.
            sent = {
                row[0]
                for row in conn.execute(
                    "SELECT slot FROM oncewire_reply_ops WHERE reply_id = ? AND kind = 'send' "
                    "AND state = 'acked'",
                    (reply.id,),
                )
            }
            seq = self._next_seq(conn, reply.id)
            conn.executemany(
                "INSERT INTO oncewire_reply_ops (reply_id, seq, slot, kind, body, created_at, "
                "updated_at) VALUES (?, ?, ?, 'send', ?, ?, ?)",
                [
                    (reply.id, seq + n, slot, body, now, now)
                    for n, (slot, body) in enumerate(
                        item for item in planned_sends if item[0] not in sent
                    )
                ],
            )
        return reply, True

    def get_reply(self, reply_id: int) -> Reply | None:
        rows = self._read(
            f"SELECT {_REPLY_COLUMNS} FROM oncewire_replies WHERE id = ?", (reply_id,)
        )
        return _reply(rows[0]) if rows else None

    def reply_for_inbound(self, inbound_id: int) -> Reply | None:
        rows = self._read(
            f"SELECT {_REPLY_COLUMNS} FROM oncewire_replies WHERE inbound_id = ?", (inbound_id,)
        )
        return _reply(rows[0]) if rows else None

    def list_replies(
        self,
        *,
        states: Sequence[ReplyState] = (),
        due_before: float | None = None,
        limit: int = 100,
        after_id: int = 0,
    ) -> list[Reply]:
        where = ["id > ?"]
        params: list[Any] = [after_id]
        if states:
            where.append(f"state IN ({', '.join('?' * len(states))})")
            params += [str(s) for s in states]
        if due_before is not None:
            where.append("not_before <= ?")
            params.append(due_before)
        order = "not_before, id" if due_before is not None else "id"
        rows = self._read(
            f"SELECT {_REPLY_COLUMNS} FROM oncewire_replies WHERE {' AND '.join(where)} "
            f"ORDER BY {order} LIMIT ?",
            (*params, limit),
        )
        return [_reply(row) for row in rows]

    def count_replies(self) -> dict[ReplyState, int]:
        counts = dict.fromkeys(ReplyState, 0)
        for state, count in self._read(
            "SELECT state, COUNT(*) FROM oncewire_replies GROUP BY state"
        ):
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
        dead = list(dead_owners)
        dead_clause = f" OR lease_owner IN ({', '.join('?' * len(dead))})" if dead else ""
        with self._write("claiming a reply") as conn:
            rows = conn.execute(
                "UPDATE oncewire_replies SET lease_owner = ?, lease_expires_at = ?, updated_at = ? "
                "WHERE id = ? AND (lease_owner IS NULL OR lease_owner = ? "
                f"OR lease_expires_at < ?{dead_clause}) AND state IN ('open', 'committed') "
                f"RETURNING {_REPLY_COLUMNS}",
                (owner, now + lease_seconds, now, reply_id, owner, now, *dead),
            ).fetchall()
        return _reply(rows[0]) if rows else None

    def reply_lease_holders(self) -> list[str]:
        return [
            row[0]
            for row in self._read(
                "SELECT DISTINCT lease_owner FROM oncewire_replies WHERE lease_owner IS NOT NULL"
            )
        ]

    def release_reply(
        self,
        reply_id: int,
        *,
        owner: str,
        now: float,
        not_before: float | None = None,
        last_error: str | None = None,
    ) -> None:
        with self._write("releasing a reply") as conn:
            conn.execute(
                "UPDATE oncewire_replies SET lease_owner = NULL, lease_expires_at = NULL, "
                "not_before = COALESCE(?, not_before), last_error = COALESCE(?, last_error), "
                "updated_at = ? WHERE id = ? AND lease_owner = ?",
                (not_before, last_error, now, reply_id, owner),
            )

    def set_reply_marked(self, reply_id: int, *, now: float) -> None:
        with self._write("recording the marker decision") as conn:
            conn.execute(
                "UPDATE oncewire_replies SET marked = 1, updated_at = ? WHERE id = ?",
                (now, reply_id),
            )

    @staticmethod
    def _finish_reply_in(
        conn: sqlite3.Connection,
        reply_id: int,
        state: ReplyState,
        now: float,
        last_error: str | None,
    ) -> Reply:
        rows = conn.execute(
            "UPDATE oncewire_replies SET state = ?, last_error = COALESCE(?, last_error), "
            "lease_owner = NULL, lease_expires_at = NULL, updated_at = ? WHERE id = ? "
            f"RETURNING {_REPLY_COLUMNS}",
            (str(state), last_error, now, reply_id),
        ).fetchall()
        if not rows:
            raise ReplyNotFound(f"no reply {reply_id}", reply_id=reply_id)
        reply = _reply(rows[0])
        if state is ReplyState.DELIVERED:  # a dead reply leaves its inbound answered
            conn.execute(
                "UPDATE oncewire_inbound SET status = 'delivered', updated_at = ? WHERE id = ?",
                (now, reply.inbound_id),
            )
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
        if state not in (ReplyState.DELIVERED, ReplyState.DEAD):
            raise InvalidState(f"a reply finishes as delivered or dead, not {state}")
        with self._write("finishing a reply") as conn:
            self._settle_in(conn, settle, now)
            return self._finish_reply_in(conn, reply_id, state, now, last_error)

    @staticmethod
    def _settle_in(conn: sqlite3.Connection, settle: tuple[int, str] | None, now: float) -> None:
        if settle is not None:
            conn.execute(
                "UPDATE oncewire_reply_ops SET state = 'acked', message_id = ?, updated_at = ? "
                "WHERE id = ? AND state = 'in_flight'",
                (settle[1], now, settle[0]),
            )

    # -- wire operations ---------------------------------------------------------------------
    def reply_ops(self, reply_id: int) -> list[ReplyOp]:
        rows = self._read(
            f"SELECT {_OP_COLUMNS} FROM oncewire_reply_ops WHERE reply_id = ? ORDER BY seq",
            (reply_id,),
        )
        return [_op(row) for row in rows]

    @staticmethod
    def _next_seq(conn: sqlite3.Connection, reply_id: int) -> int:
        row = conn.execute(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM oncewire_reply_ops WHERE reply_id = ?",
            (reply_id,),
        ).fetchone()
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
        with self._write("starting a wire operation") as conn:
            self._settle_in(conn, settle, now)
            if expect_seq is not None and self._next_seq(conn, reply_id) - 1 != expect_seq:
                raise StaleFence(
                    f"reply {reply_id} changed since its operations were read", reply_id=reply_id
                )
            if owner is not None:
                leased = conn.execute(
                    "UPDATE oncewire_replies SET lease_owner = ?, lease_expires_at = ?, "
                    "marked = MAX(marked, ?), updated_at = ? WHERE id = ? AND (lease_owner IS NULL "
                    "OR lease_owner = ? OR lease_expires_at < ?) "
                    "AND state IN ('open', 'committed')",
                    (owner, now + lease_seconds, int(marked), now, reply_id, owner, now),
                ).rowcount
                if not leased:
                    raise StaleFence(
                        f"reply {reply_id} is leased to another owner or finished",
                        reply_id=reply_id,
                    )
            elif marked:
                conn.execute(
                    "UPDATE oncewire_replies SET marked = 1, updated_at = ? WHERE id = ?",
                    (now, reply_id),
                )
            rows = conn.execute(
                "UPDATE oncewire_reply_ops SET state = 'in_flight', body = ?, marked = ?, "
                "message_id = ?, updated_at = ? WHERE id = (SELECT id FROM oncewire_reply_ops "
                "  WHERE reply_id = ? AND slot = ? AND kind = ? AND state = 'planned' "
                f"  ORDER BY seq LIMIT 1) RETURNING {_OP_COLUMNS}",
                (body, int(marked), message_id, now, reply_id, slot, str(kind)),
            ).fetchall()
            if rows:
                return _op(rows[0])
            rows = conn.execute(
                "INSERT INTO oncewire_reply_ops (reply_id, seq, slot, kind, body, marked, state, "
                "message_id, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, 'in_flight', ?, ?, ?) "
                f"RETURNING {_OP_COLUMNS}",
                (
                    reply_id,
                    self._next_seq(conn, reply_id),
                    slot,
                    str(kind),
                    body,
                    int(marked),
                    message_id,
                    now,
                    now,
                ),
            ).fetchall()
        return _op(rows[0])

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
        if state in (OpState.PLANNED, OpState.IN_FLIGHT):
            raise InvalidState(f"an operation ends acked, refused or ambiguous, not {state}")
        with self._write("recording a wire outcome") as conn:
            self._settle_in(conn, settle, now)
            rows = conn.execute(
                "UPDATE oncewire_reply_ops SET state = ?, message_id = COALESCE(?, message_id), "
                "retry_after = ?, error = ?, updated_at = ? WHERE id = ? AND state = 'in_flight' "
                f"RETURNING {_OP_COLUMNS}",
                (str(state), message_id, retry_after, error, now, op_id),
            ).fetchall()
            if not rows:
                raise InvalidState(f"wire operation {op_id} is not in flight", op_id=op_id)
            op = _op(rows[0])
            if count_attempt:
                conn.execute(
                    "UPDATE oncewire_replies SET attempts = attempts + 1, "
                    "last_error = COALESCE(?, last_error), updated_at = ? WHERE id = ?",
                    (error, now, op.reply_id),
                )
            if deliver:
                self._finish_reply_in(conn, op.reply_id, ReplyState.DELIVERED, now, None)
        return op
