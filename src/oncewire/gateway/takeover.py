"""Taking platforms over: the row-driven recovery a gateway runs for each bot it starts to serve.

At boot, and again whenever a standby takes a bot's lease over, the process recovers what the
rows say about that bot's platform, and nothing else (no transcript is read, nothing guessed):

1. every committed reply of the platform not yet delivered is delivered (or scheduled, as its
   record says); an operation a dead process left ``in_flight`` becomes ``ambiguous`` when its
   reply is taken (:meth:`~oncewire.replies.ReplyEngine.deliver`);
2. the platform's turns whose owner is gone (a process on this host that died, or a lease that
   ran out) are taken over: ended ``answered`` when their reply is committed (a guard: T5
   commits both at once), ended ``interrupted`` when an interrupt was recorded (their message
   ``superseded`` and their reply withdrawn in the same transaction, then delivered: the
   previews deleted) or their message was superseded, and resumed otherwise (returned to the
   scheduler with the fence their dead owner held: the model is asked again).

``received`` messages need nothing: the scheduler starts them once the platform is served.
The same pass over turns runs on a timer (:func:`sweep_turns`), so a turn whose owner lost its
turn lease without dying here is taken over once the lease ran out.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from oncewire.core.ids import owner_is_dead_locally
from oncewire.gateway.turn import end_interrupted_in_tx
from oncewire.inbound import InboundState
from oncewire.ledger import Ledger
from oncewire.replies import ReplyEngine, ReplyState

__all__ = ["TURN_STATUSES", "deliver_committed", "sweep_turns"]

log = logging.getLogger("oncewire.gateway.runner")

TURN_STATUSES = ("running", "interrupting")  # a turn run that is still active
PAGE = 500


def deliver_committed(ledger: Ledger, engine: ReplyEngine, platforms: Collection[str]) -> None:
    """Step 1: deliver every committed, undelivered reply of ``platforms``."""
    counts: dict[str, int] = {}
    after = 0
    while True:
        page = ledger.replies.list(ReplyState.COMMITTED, limit=PAGE, after_id=after)
        for reply in page:
            if reply.request.platform in platforms:
                status = engine.deliver(reply.id).status
                counts[status] = counts.get(status, 0) + 1
        if len(page) < PAGE:
            break
        after = page[-1].id
    log.info("recovery of %s: replies %s", ", ".join(sorted(platforms)), counts or "none")


def sweep_turns(
    ledger: Ledger,
    engine: ReplyEngine,
    owner: str,
    platforms: Collection[str],
    *,
    skip: Collection[int] = (),
    quiet: bool = False,
) -> dict[int, int]:
    """Step 2: take over the active turns of ``platforms`` whose owner is gone; the turns to
    resume, as ``{inbound id: the fence their owner held}``. The inbound ids in ``skip``
    (resumed or running here) are left alone; a turn of ``owner`` itself that is not running
    here (its commit failed while the store was away) is taken over once its lease ran out."""
    resumes: dict[int, int] = {}
    now = ledger.clock.now()
    after = ""
    while True:
        rows = ledger.runs.list(status=TURN_STATUSES, limit=PAGE, after_run_id=after)
        for row in rows:
            if row.workflow != "turn" or row.turn is None or not row.turn.isdigit():
                continue
            inbound_id = int(row.turn)
            if inbound_id in skip:
                continue
            gone = row.owner is None or owner_is_dead_locally(row.owner)
            expired = row.lease_expires_at is not None and row.lease_expires_at <= now
            if not (gone or expired):
                if not quiet:
                    log.warning(
                        "turn %s is held by %s, which may be alive; left to it",
                        row.run_id,
                        row.owner,
                    )
                continue
            inbound = ledger.inbound.get(inbound_id)
            if inbound.platform not in platforms:
                continue
            fence = _take_over(ledger, engine, owner, inbound_id, row.fence)
            if fence is not None:
                resumes[inbound_id] = fence
        if len(rows) < PAGE:
            return resumes
        after = rows[-1].run_id


def _take_over(
    ledger: Ledger, engine: ReplyEngine, owner: str, inbound_id: int, fence: int
) -> int | None:
    """End the turn as its rows say, or return ``fence`` when it is to be resumed."""
    inbound = ledger.inbound.get(inbound_id)
    reply = ledger.replies.for_inbound(inbound_id)
    turn = ledger.runs.turn
    ending: tuple[str, str, str | None] | None = None
    run = ledger.runs.get(f"turn:{inbound_id}")
    if reply is not None and reply.state is not ReplyState.OPEN and not reply.withdrawal:
        ending = ("answered", "final_answer", reply.final_text)
    elif run.status == "interrupting" and inbound.platform in engine.platforms:
        # Its interrupt was recorded: never resumed; ended as its worker would have.
        with ledger.transaction() as tx:
            taken = turn.resume_in_tx(
                tx, inbound_id, owner=owner, from_fence=fence, lease_seconds=60.0
            )
            profile = engine.platform(inbound.platform).profile
            end_interrupted_in_tx(ledger, tx, taken.run, profile)
        withdrawn = ledger.replies.for_inbound(inbound_id)
        if withdrawn is not None:
            engine.deliver(withdrawn.id)
        log.info("turn:%s taken over and ended interrupted", inbound_id)
        return None
    elif inbound.status is InboundState.SUPERSEDED:
        ending = ("interrupted", "superseded", None)
    if ending is None:
        if inbound.platform not in engine.platforms:
            log.warning("turn:%s is on platform %s, not served here", inbound_id, inbound.platform)
            return None
        log.info("turn:%s will be resumed (its owner is gone)", inbound_id)
        return fence
    status, reason, text = ending
    with ledger.transaction() as tx:
        taken = turn.resume_in_tx(tx, inbound_id, owner=owner, from_fence=fence, lease_seconds=60.0)
        turn.terminate_in_tx(
            tx, inbound_id, status, reason=reason, reply_text=text, fence=taken.run.fence
        )
    log.info("turn:%s taken over and ended %s", inbound_id, status)
    return None
