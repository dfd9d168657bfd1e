"""Sessions and busy modes: what a message does to its session's running turn.

A session is ``(platform, bot, chat, thread)``. It is busy while a ``turn`` run is active on
its branch (the run ledger's one-active-run-per-branch index; nothing else is a flag). The
session's queue is its ``received`` inbound rows, by id.

At admission (:func:`interrupt_running_turn`, after the message's T1 commit):

* ``busy_mode = "interrupt"`` (the default) records ``request_interrupt`` on the running turn,
  ``by`` the new message. The transition table refuses it once the turn's answer is committed
  (a committed answer is always delivered); the new message then simply waits its turn. A
  turn with tool calls not yet resolved is not interrupted either (the message waits).
* ``busy_mode = "queue"``, or a message starting with ``/queue ``: nothing; it waits.
* ``/stop``: an interrupt whatever the mode, with no successor; the ``/stop`` message itself
  is answered by a one-line confirmation (:data:`STOPPED_NOTE` or :data:`NOTHING_TO_STOP`).

The worker holding the turn is signalled by the runner, which reads the run's status; the
turn then ends ``interrupted`` with its message ``superseded`` by the interrupting one and its
reply withdrawn (:mod:`oncewire.gateway.turn`).
"""

from __future__ import annotations

import logging
from typing import Any

from oncewire.core.errors import OncewireError
from oncewire.inbound import InboundState
from oncewire.ledger import Ledger
from oncewire.runs.append import command_in_own_tx
from oncewire.runs.records import CommandResult
from oncewire.storage import Transaction
from oncewire.storage.replies import Inbound

__all__ = [
    "NOTHING_TO_STOP",
    "QUEUE_PREFIX",
    "STOPPED_NOTE",
    "interrupt_running_turn",
    "is_stop",
    "model_text",
    "stopped_by",
]

log = logging.getLogger("oncewire.gateway.sessions")

QUEUE_PREFIX = "/queue "
STOPPED_NOTE = "Stopped: the answer in progress was cancelled."
NOTHING_TO_STOP = "Nothing to stop: no answer was in progress."
PAGE = 500


def _text(inbound: Inbound) -> str:
    payload = inbound.payload
    text = payload.get("text", "") if isinstance(payload, dict) else ""
    return text if isinstance(text, str) else ""


def is_stop(inbound: Inbound) -> bool:
    """``/stop`` (or ``/stop@botname``, as Telegram writes a command in a group), alone."""
    words = _text(inbound).split()
    return len(words) == 1 and (words[0] == "/stop" or words[0].startswith("/stop@"))


def model_text(payload: Any) -> str:
    """The text the model sees: the message's, a ``/queue `` prefix taken off."""
    text = payload.get("text", "") if isinstance(payload, dict) else ""
    if not isinstance(text, str):
        return ""
    return text[len(QUEUE_PREFIX) :] if text.startswith(QUEUE_PREFIX) else text


def _session(inbound: Inbound) -> tuple[str, str, str, str]:
    return (inbound.platform, inbound.bot, inbound.chat, inbound.thread)


def _answering(ledger: Ledger, newer: Inbound) -> list[Inbound]:
    """The session's older messages whose reply is open: at most one has an active turn."""
    found: list[Inbound] = []
    after = 0
    while True:
        page = ledger.inbound.list(InboundState.ANSWERING, limit=PAGE, after_id=after)
        found.extend(i for i in page if i.id < newer.id and _session(i) == _session(newer))
        if len(page) < PAGE:
            return found
        after = page[-1].id


def interrupt_running_turn(ledger: Ledger, inbound: Inbound, busy_mode: str) -> int | None:
    """The busy decision for the newly admitted ``inbound``: the inbound id of the turn whose
    interrupt was recorded (by ``inbound``), or None (nothing to interrupt, queued, or the turn
    already committed its answer)."""
    stop = is_stop(inbound)
    if not stop and (busy_mode != "interrupt" or _text(inbound).startswith(QUEUE_PREFIX)):
        return None
    reason = "stop" if stop else "superseded"
    for older in _answering(ledger, inbound):
        try:
            run = ledger.runs.get(f"turn:{older.id}")
        except OncewireError:
            continue  # opened, its run not started (a crash between): nothing runs
        if run.status != "running":
            continue
        if run.state.get("unresolved"):
            # Its tool calls are out in the world: the turn finishes (and answers) first, and
            # this message waits its turn, rather than leaving those calls without an outcome.
            log.info("inbound %s: turn:%s waits on tool calls; queued", inbound.id, older.id)
            return None
        try:
            _record_interrupt(ledger, older.id, by=inbound.id, reason=reason)
        except OncewireError as exc:
            # Refused by the table (the answer committed, or an interrupt already recorded):
            # the committed answer is delivered, and this message waits its turn.
            log.info("inbound %s: turn:%s not interrupted (%s)", inbound.id, older.id, exc)
            continue
        log.info("inbound %s: interrupt of turn:%s recorded (%s)", inbound.id, older.id, reason)
        return older.id
    return None


def _record_interrupt(ledger: Ledger, inbound_id: int, *, by: int, reason: str) -> None:
    """``request_interrupt`` on the turn of ``inbound_id``, announced to the inbox's subscribers
    in its transaction: the process running the turn (this one or another) reads its status
    and signals its worker at the commit, not at its next look."""

    def write(tx: Transaction) -> CommandResult:
        result = ledger.runs.turn.request_interrupt_in_tx(tx, inbound_id, by=by, reason=reason)
        ledger.store.announce_inbound_in_tx(tx)
        return result

    command_in_own_tx(ledger.store, write)


def stopped_by(ledger: Ledger, stop_id: int) -> bool:
    """Whether the ``/stop`` message ``stop_id`` stopped a turn (its message is superseded
    by it)."""
    after = 0
    while True:
        page = ledger.inbound.list(InboundState.SUPERSEDED, limit=PAGE, after_id=after)
        if any(i.answered_by == stop_id for i in page):
            return True
        if len(page) < PAGE:
            return False
        after = page[-1].id
