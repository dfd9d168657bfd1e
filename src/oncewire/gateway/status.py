"""What the gateway's store says about each chat session, read without the gateway.

:func:`session_status` reads the inbox, the reply records and the active turn runs (no lock is
taken and nothing is written, so it is safe while a gateway runs) and counts, per session
``(platform, bot, chat, thread)``:

==========================  ==================================================================
``active_turn``             the run id of the session's active turn, or None
``received``                messages admitted and waiting for their turn (the queue)
``answering``               messages whose turn started and whose answer is not committed
``answered_not_delivered``  answers committed and still being delivered (not yet visible in
                            full)
``scheduled``               of those, replies waiting for a retry time still in the future
``dead``                    answers whose delivery was given up for good (the platform refused
                            it, "chat not found", or it ran out of attempts): never tried again;
                            ``oncewire replies show`` gives the reason
``quarantined``             messages set aside after too many starts
==========================  ==================================================================

Sessions with nothing to report (every message delivered, superseded or merged) are left out;
a dead reply is reported, since its message was never delivered.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from oncewire.inbound import InboundState
from oncewire.ledger import Ledger
from oncewire.replies import Reply, ReplyState
from oncewire.storage.replies import Inbound

__all__ = ["SessionStatus", "session_status"]

PAGE = 500
ACTIVE_TURN = ("running", "interrupting")  # a turn run's statuses before its terminal
_COUNTED = {
    InboundState.RECEIVED: "received",
    InboundState.ANSWERING: "answering",
    InboundState.ANSWERED: "answered_not_delivered",
    InboundState.QUARANTINED: "quarantined",
}


@dataclass
class SessionStatus:
    platform: str
    bot: str
    chat: str
    thread: str
    active_turn: str | None = None
    received: int = 0
    answering: int = 0
    answered_not_delivered: int = 0
    scheduled: int = 0
    dead: int = 0
    quarantined: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _inbound(ledger: Ledger, statuses: list[InboundState]) -> Iterator[Inbound]:
    after = 0
    while True:
        page = ledger.inbound.list(statuses, limit=PAGE, after_id=after)
        yield from page
        if len(page) < PAGE:
            return
        after = page[-1].id


def _undelivered(ledger: Ledger) -> list[Reply]:
    return ledger.replies.undelivered(limit=100_000)


def _given_up(ledger: Ledger) -> set[int]:
    """The inbound ids whose reply is dead: their message stays ``answered`` for good."""
    found: set[int] = set()
    after = 0
    while True:
        page = ledger.replies.list(ReplyState.DEAD, limit=PAGE, after_id=after)
        found.update(reply.inbound_id for reply in page)
        if len(page) < PAGE:
            return found
        after = page[-1].id


def session_status(ledger: Ledger) -> list[SessionStatus]:
    """Every session with an active turn or a message not yet delivered, in key order."""
    sessions: dict[tuple[str, str, str, str], SessionStatus] = {}

    def of(platform: str, bot: str, chat: str, thread: str) -> SessionStatus:
        key = (platform, bot, chat, thread)
        if key not in sessions:
            sessions[key] = SessionStatus(platform, bot, chat, thread)
        return sessions[key]

    with ledger.store.read_snapshot():
        now = ledger.clock.now()
        dead = _given_up(ledger)
        for inbound in _inbound(ledger, list(_COUNTED)):
            status = of(inbound.platform, inbound.bot, inbound.chat, inbound.thread)
            field = _COUNTED[inbound.status]
            if inbound.status is InboundState.ANSWERED and inbound.id in dead:
                field = "dead"
            setattr(status, field, getattr(status, field) + 1)
        for reply in _undelivered(ledger):
            if reply.not_before > now:
                request = reply.request
                of(request.platform, request.bot, request.chat, request.thread).scheduled += 1
        after = ""
        while True:
            rows = ledger.runs.list(status=ACTIVE_TURN, limit=PAGE, after_run_id=after)
            for row in rows:
                if row.workflow != "turn" or row.turn is None or not row.turn.isdigit():
                    continue
                inbound = ledger.inbound.get(int(row.turn))
                of(
                    inbound.platform, inbound.bot, inbound.chat, inbound.thread
                ).active_turn = row.run_id
            if len(rows) < PAGE:
                break
            after = rows[-1].run_id
    return [sessions[key] for key in sorted(sessions)]
