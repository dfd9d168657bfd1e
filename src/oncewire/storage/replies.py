"""Inbound messages, reply records and wire operations: the records and their states.

An inbound message is admitted once under (platform, bot, chat, thread, platform message id).
Each inbound has at most one reply record, which owns every wire operation sent for it. The
verbs that read and write them (:mod:`oncewire.storage.verbs.inbound` and
:mod:`oncewire.storage.verbs.replies`) are the only way the inbound and replies ledgers and the
reply engine touch them.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oncewire.core.canonical import loads

__all__ = [
    "INBOUND_COLUMNS",
    "OP_COLUMNS",
    "REPLY_COLUMNS",
    "WITHDRAWAL_PLAN",
    "Exchange",
    "Inbound",
    "InboundState",
    "OpKind",
    "OpState",
    "Reply",
    "ReplyOp",
    "ReplyState",
    "SendRequest",
]


# Column orders of the three tables, as every backend selects them for ``from_row``.
INBOUND_COLUMNS = (
    "id, platform, bot, chat, thread, platform_message_id, payload, digest, status, deliveries, "
    "attempts, last_error, created_at, updated_at, answered_by"
)
REPLY_COLUMNS = (
    "id, inbound_id, platform, bot, chat, thread, reply_to, format, cap, unit, state, "
    "final_text, plan, marked, attempts, max_attempts, not_before, lease_owner, "
    "lease_expires_at, last_error, created_at, updated_at"
)
OP_COLUMNS = (
    "id, reply_id, seq, slot, kind, body, marked, state, message_id, retry_after, error, "
    "created_at, updated_at"
)


# The chunk plan of a withdrawal: no chunk at all (any text, even an empty one, has at least one),
# so the delivery deletes every message the reply shows.
WITHDRAWAL_PLAN = "[]"


class InboundState(enum.StrEnum):
    """Where an inbound message stands, from admitted to its reply delivered (or set aside, or
    answered by another message's reply)."""

    RECEIVED = "received"  # admitted; nobody has started answering it
    ANSWERING = "answering"  # a reply record is open (the answer may be streaming)
    ANSWERED = "answered"  # the final text is committed; delivery is not finished
    DELIVERED = "delivered"  # the reply is visible (or, if dead, its failure was reported)
    QUARANTINED = "quarantined"  # set aside after repeated failures; recovery skips it
    # Interrupted by a newer message (answered_by) before its answer was committed (0006).
    SUPERSEDED = "superseded"
    MERGED = "merged"  # steered into a running turn: answered_by's reply answers it (0006)


class ReplyState(enum.StrEnum):
    """Where a reply record stands, from open (no final text yet) to delivered, withdrawn or
    dead."""

    OPEN = "open"  # the record exists (previews may be visible); no final text yet
    # The final text and its chunk plan are committed; delivering. A withdrawal is committed
    # too, as an empty text with no chunk (WITHDRAWAL_PLAN): delivering it deletes the previews.
    COMMITTED = "committed"
    DELIVERED = "delivered"  # every chunk of the final text is acknowledged on the platform
    DEAD = "dead"  # out of attempts or refused for good; last_error says why
    WITHDRAWN = "withdrawn"  # withdrawn before its answer: no preview of it is left (0006)


class OpKind(enum.StrEnum):
    """What a wire operation does to the platform's messages."""

    SEND = "send"  # a new platform message (one per chunk slot)
    EDIT = "edit"  # replace the text of a recorded message (idempotent)
    DELETE = "delete"  # remove a recorded message (idempotent)


class OpState(enum.StrEnum):
    """Where a wire operation stands: planned, in flight, then what its outcome said."""

    PLANNED = "planned"  # written down, not started
    IN_FLIGHT = "in_flight"  # durably marked as started before the wire call
    ACKED = "acked"  # the platform acknowledged it (message_id is known)
    REFUSED = "refused"  # it never reached the platform (or was rejected): it did not happen
    AMBIGUOUS = "ambiguous"  # it may have landed: a timeout after sending, a lost ack
    # Someone else deleted the message (0006): an edit or delete found its target gone, and the
    # send that made that message is set gone with it.
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class SendRequest:
    """Where a reply goes and how, stored in full so that recovery keeps the threading.

    ``idempotency_key`` is not stored: the engine sets it on each send it hands an adapter (the
    same for every send of one chunk slot, see :func:`oncewire.replies.wire.idempotency_key`),
    for a platform that drops a repeated key (a Discord nonce, an ``Idempotency-Key`` header).
    """

    platform: str
    bot: str
    chat: str
    thread: str = ""
    reply_to: str | None = None
    format: str = "plain"
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class ReplyOpening:
    """What an inbound's reply record is created with when a verb finds none: where it goes,
    the platform's message cap (in ``unit``: "utf16" or "codepoints") and its attempts."""

    inbound_id: int
    request: SendRequest
    cap: int
    unit: str
    max_attempts: int


@dataclass(frozen=True, slots=True)
class Inbound:
    """One message received from a platform, admitted once."""

    id: int
    platform: str
    bot: str
    chat: str
    thread: str
    platform_message_id: str
    payload_json: str
    digest: str
    status: InboundState
    deliveries: int  # how often the platform delivered it (1 + re-deliveries)
    attempts: int  # how often answering it started
    last_error: str | None
    created_at: float
    updated_at: float
    # The inbound message whose reply answers this one (superseded or merged only).
    answered_by: int | None = None

    @property
    def payload(self) -> Any:
        return loads(self.payload_json)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Inbound:
        """From a row selected as :data:`INBOUND_COLUMNS`."""
        return cls(*[*row[:8], InboundState(row[8]), *row[9:15]])

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "platform": self.platform,
            "bot": self.bot,
            "chat": self.chat,
            "thread": self.thread,
            "platform_message_id": self.platform_message_id,
            "payload": self.payload,
            "status": str(self.status),
            "deliveries": self.deliveries,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "answered_by": self.answered_by,
        }


_INBOUND_WIDTH = len(INBOUND_COLUMNS.split(", "))


@dataclass(frozen=True, slots=True)
class Exchange:
    """An earlier message of a session and the answer its user was given, if any."""

    inbound: Inbound
    # The reply's final text while it is committed or delivered; None when no answer was
    # committed, the reply was withdrawn (a withdrawal commits an empty text), or its delivery
    # was given up (dead: the user may never have seen it).
    answer: str | None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Exchange:
        """From a row selected as :data:`INBOUND_COLUMNS`, then the reply's state and text."""
        state, text = row[_INBOUND_WIDTH], row[_INBOUND_WIDTH + 1]
        shown = state in (ReplyState.COMMITTED, ReplyState.DELIVERED) and bool(text)
        return cls(Inbound.from_row(row[:_INBOUND_WIDTH]), text if shown else None)


@dataclass(frozen=True, slots=True)
class Reply:
    """The single record that owns everything sent for one inbound message."""

    id: int
    inbound_id: int
    request: SendRequest
    cap: int  # the platform's cap the plan was made for, in ``unit``
    unit: str  # "utf16" or "codepoints"
    state: ReplyState
    final_text: str | None
    plan_json: str | None  # the chunk plan of final_text (JSON list of chunk objects)
    marked: bool  # the marker decision: some send of this reply may duplicate a landed one
    attempts: int  # failed wire attempts so far
    max_attempts: int
    not_before: float
    lease_owner: str | None
    lease_expires_at: float | None
    last_error: str | None
    created_at: float
    updated_at: float

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Reply:
        """From a row selected as :data:`REPLY_COLUMNS`."""
        request = SendRequest(*row[2:8])
        state, marked = ReplyState(row[10]), bool(row[13])
        return cls(*[*row[:2], request, *row[8:10], state, *row[11:13], marked, *row[14:22]])

    @property
    def withdrawal(self) -> bool:
        """The record was withdrawn before an answer was committed (its plan has no chunk)."""
        return self.plan_json == WITHDRAWAL_PLAN

    @property
    def plan(self) -> list[dict[str, str]]:
        return [] if self.plan_json is None else list(loads(self.plan_json))

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "inbound_id": self.inbound_id,
            "platform": self.request.platform,
            "bot": self.request.bot,
            "chat": self.request.chat,
            "thread": self.request.thread,
            "reply_to": self.request.reply_to,
            "format": self.request.format,
            "cap": self.cap,
            "unit": self.unit,
            "state": str(self.state),
            "final_text": self.final_text,
            "chunks": len(self.plan),
            "marked": self.marked,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "not_before": self.not_before,
            "last_error": self.last_error,
        }


@dataclass(frozen=True, slots=True)
class ReplyOp:
    """One wire operation of a reply."""

    id: int
    reply_id: int
    seq: int
    slot: int  # which visible message of the reply (-1: the could-not-deliver notice)
    kind: OpKind
    body: str  # the text without the marker (the adapter renders the marker)
    marked: bool
    state: OpState
    message_id: str | None  # send: the acknowledged id; edit/delete: the target
    retry_after: float | None
    error: str | None
    created_at: float
    updated_at: float

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ReplyOp:
        """From a row selected as :data:`OP_COLUMNS`."""
        return cls(*[*row[:4], OpKind(row[4]), row[5], bool(row[6]), OpState(row[7]), *row[8:13]])

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "slot": self.slot,
            "kind": str(self.kind),
            "state": str(self.state),
            "marked": self.marked,
            "message_id": self.message_id,
            "retry_after": self.retry_after,
            "error": self.error,
            "chars": len(self.body),
        }
