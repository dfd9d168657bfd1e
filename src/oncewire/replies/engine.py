"""The reply engine: previews, sealing, the final delivery and recovery, all from the record.

Everything the engine does to a chat is a wire operation on the reply record, durably
``in_flight`` before the platform is called and settled after. Each step reads the record and
computes what is still missing (:mod:`oncewire.replies.plan`), so a live delivery and a
recovery after a crash are one algorithm: for each chunk slot of the plan,

* a slot whose message was acknowledged is edited if it shows something else (edits are
  idempotent and replayed freely) and never sent again;
* a slot with no message is sent; unmarked if no earlier send of it may have landed, with the
  duplicate marker if one may have (an ``ambiguous`` send, or one still ``in_flight`` when its
  process died);
* a slot whose message someone else deleted (an edit or delete answered :class:`Gone`) has no
  message again, and is sent again like one never sent;
* on the final delivery, slots beyond the plan are deleted.

A withdrawal (:meth:`ReplyEngine.withdraw`) is committed as a plan with no chunk, so the same
convergence deletes every message the reply shows (or, where the platform cannot delete, edits
each to a one-line note) and finishes it ``withdrawn``.

Streaming sends the first preview, edits it at a bounded cadence, and when the text outgrows
the cap seals the full chunk and carries on in a new message; on an editable platform the final
delivery is then a (recoverable) edit. Its steps are public, for a caller that previews on one
thread and answers on another: :meth:`ReplyEngine.open`, :meth:`ReplyEngine.preview` (the
newest text, as often as the caller likes), :meth:`ReplyEngine.commit` and
:meth:`ReplyEngine.deliver`. A preview holds no database lock during its platform call, so one
parked on a slow platform never holds up the commit of the answer.

Refusals wait as the platform asks: short waits inline, long ones scheduled on the record so
other replies go on, and none longer than a day (``MAX_RETRY_SECONDS``: a platform's
``retry_after`` beyond it is clamped, a ``backoff_cap_seconds`` beyond it refused). After
``max_attempts`` failed operations the reply is ``dead`` and one "could not deliver" notice is
attempted.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from oncewire.core.errors import ConfigurationError, ReplyConflict, StaleFence
from oncewire.core.ids import this_process_owner
from oncewire.core.limits import MAX_RETRY_SECONDS
from oncewire.replies.operations import COMMITTED_NOT_SENT, PREVIEW_NOT_COMMITTED, ReplyOperations
from oncewire.replies.plan import DEFAULT_STOPPED_NOTE, plan_steps, read_slots
from oncewire.replies.reports import DeliveryPass, PreviewPass, RecoveryReport
from oncewire.replies.service import plan_chunks
from oncewire.replies.splitting import Chunk
from oncewire.replies.wire import (
    Delivered,
    Gone,
    MaybeDelivered,
    NotDelivered,
    Platform,
    check_platform,
    vet_outcome,
)
from oncewire.storage import ReplyStore
from oncewire.storage.replies import OpKind, Reply, ReplyOp, ReplyState

if TYPE_CHECKING:
    from oncewire.ledger import Ledger, LedgerTransaction

__all__ = [
    "DEFAULT_NOTICE",
    "DEFAULT_STOPPED_NOTE",
    "DeliveryPass",
    "PreviewPass",
    "RecoveryReport",
    "ReplyEngine",
]

log = logging.getLogger("oncewire.replies")

DEFAULT_NOTICE = "Sorry: a reply to your message could not be delivered."


class ReplyEngine(ReplyOperations):
    """``ReplyEngine(ledger, {"tg": telegram_adapter}).answer(inbound_id, text)``."""

    ledger: Ledger

    def __init__(
        self,
        ledger: Ledger,
        platforms: Mapping[str, Platform],
        *,
        owner: str | None = None,
        inline_wait_max_seconds: float = 5.0,
        edit_interval_seconds: float = 1.0,
        backoff_base_seconds: float = 0.5,
        backoff_cap_seconds: float = 60.0,
        lease_seconds: float = 120.0,
        notice: str = DEFAULT_NOTICE,
        stopped_note: str = DEFAULT_STOPPED_NOTE,
    ) -> None:
        for name, value in (
            ("inline_wait_max_seconds", inline_wait_max_seconds),
            ("edit_interval_seconds", edit_interval_seconds),
            ("backoff_base_seconds", backoff_base_seconds),
            ("backoff_cap_seconds", backoff_cap_seconds),
            ("lease_seconds", lease_seconds),
        ):
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ConfigurationError(f"{name} must be a finite number >= 0, not {value!r}")
        if lease_seconds <= 0:
            raise ConfigurationError("lease_seconds must be positive")
        if backoff_base_seconds > backoff_cap_seconds:  # the cap would silently replace it
            raise ConfigurationError(
                f"backoff_base_seconds ({backoff_base_seconds:g}) is above backoff_cap_seconds "
                f"({backoff_cap_seconds:g}): every wait would be the cap; raise "
                "backoff_cap_seconds too"
            )
        if backoff_cap_seconds > MAX_RETRY_SECONDS:
            raise ConfigurationError(
                f"backoff_cap_seconds ({backoff_cap_seconds:g}) is above {MAX_RETRY_SECONDS} "
                "(a day), the longest wait for a retry"
            )
        for name, adapter in platforms.items():
            check_platform(name, adapter)  # async or generator operations could never answer
        self.ledger = ledger
        self.platforms = dict(platforms)
        self.owner = owner or this_process_owner()
        self.inline_wait_max_seconds = inline_wait_max_seconds
        self.edit_interval_seconds = edit_interval_seconds
        self.backoff_base_seconds = backoff_base_seconds
        self.backoff_cap_seconds = backoff_cap_seconds
        self.lease_seconds = lease_seconds
        self.notice = notice
        self.stopped_note = stopped_note
        # What ReplyOperations keeps per reply (see its declarations).
        self._pending = {}
        self._working = {}
        self._working_lock = threading.Condition()
        self._answered = {}

    # -- answering ---------------------------------------------------------------------------
    @property
    def store(self) -> ReplyStore:
        """The Ledger's store as the replies see it: the engine calls no verb beyond this seam."""
        return self.ledger.store

    def platform(self, name: str) -> Platform:
        try:
            return self.platforms[name]
        except KeyError:
            raise ConfigurationError(f"no platform adapter named {name!r}") from None

    def withdraw(self, inbound_id: int) -> DeliveryPass:
        """Withdraw the inbound's reply before its answer is committed, then converge it: every
        preview it shows is deleted (edited to :attr:`stopped_note` where the platform cannot
        delete) and the record ends ``withdrawn``.

        The withdrawal is on the record before any operation, so a crash part-way is finished
        by :meth:`recover` like any delivery. To withdraw in the caller's transaction, use
        ``ledger.replies.withdraw_in_tx`` and then :meth:`deliver`. A committed answer is always
        delivered: withdrawing it raises :class:`InvalidState`.
        """
        inbound = self._inbound(inbound_id)
        reply = self.ledger.replies.withdraw(inbound_id, self.platform(inbound.platform).profile)
        return self.deliver(reply.id)

    def answer(
        self,
        inbound_id: int,
        text: str,
        *,
        on_commit: Callable[[LedgerTransaction, str], Any] | None = None,
    ) -> DeliveryPass:
        """Commit ``text`` as the reply (with the caller's rows, via ``on_commit``), deliver it.

        If the inbound's answer was committed before, it is delivered as recorded and
        ``on_commit`` is not called (another text raises :class:`ReplyConflict`).
        """
        reply = self.commit(inbound_id, text, on_commit=on_commit)
        return self.deliver(reply.id)

    def stream(
        self,
        inbound_id: int,
        deltas: Iterable[str],
        *,
        on_commit: Callable[[LedgerTransaction, str], Any] | None = None,
        preview: bool = True,
    ) -> DeliveryPass:
        """Show ``deltas`` as an edited preview, then commit the whole text and deliver it.

        The record is opened before the first preview, so a crash at any point leaves every
        preview message id written down; calling ``stream`` again for the same inbound (after a
        restart) edits those messages instead of sending a second answer.
        """
        reply, taken = self._open(inbound_id)
        if reply.state is not ReplyState.OPEN:
            return self.deliver(reply.id)
        platform = self.platform(reply.request.platform)
        previewing = preview and platform.profile.can_edit and taken
        text, shown, next_at = "", "", float("-inf")
        try:
            for delta in deltas:
                text += delta
                now = self.ledger.clock.now()
                if previewing and now >= next_at:
                    previewing, wait = self._preview_safely(reply, platform, text)
                    shown = text if previewing else shown
                    next_at = now + max(self.edit_interval_seconds, wait)
        except BaseException:
            # The answer failed mid-stream: leave the record open (its previews are written
            # down) and the reply free for whoever answers it next.
            self._flush(reply.id)
            self.store.release_reply(reply.id, owner=self.owner, now=self.ledger.clock.now())
            raise
        if previewing and shown != text and self.ledger.clock.now() >= next_at:
            previewing, _ = self._preview_safely(reply, platform, text)
            shown = text if previewing else shown
        if shown == text:
            PREVIEW_NOT_COMMITTED.hit()
        reply = self.commit(inbound_id, text, on_commit=on_commit)
        return self.deliver(reply.id)

    # -- the steps of a stream, one by one ----------------------------------------------------
    def open(self, inbound_id: int) -> Reply:
        """The inbound's reply record, opened before any preview and taken by this engine.

        Operations a dead process left in flight become ``ambiguous`` here. A record that is
        not ``open`` (its answer was committed before) is returned as it is: deliver it.
        """
        return self._open(inbound_id)[0]

    def _open(self, inbound_id: int) -> tuple[Reply, bool]:
        """(record, taken): taken is False while another live engine holds it."""
        inbound = self._inbound(inbound_id)
        reply = self.ledger.replies.open(inbound_id, self.platform(inbound.platform).profile)
        if reply.state is not ReplyState.OPEN:
            return reply, False
        taken = self._take(reply)
        return (reply, False) if taken is None else (taken, True)

    def preview(self, reply: Reply | int, text: str) -> PreviewPass:
        """Bring the reply's preview up to ``text`` (the newest text: call it as often as the
        answer grows, from a thread of its own if the caller likes).

        Each operation is written ``in_flight`` under the record's lease and the sequence
        number last read (``expect_seq``), so two writers can never both act on one view. No
        database lock is held during a platform call: a preview parked on a slow platform
        does not hold up :meth:`commit` on another thread. Once the answer is committed,
        previews stop.
        """
        reply_id = reply if isinstance(reply, int) else reply.id
        current = self.ledger.replies.get(reply_id)
        platform = self.platform(current.request.platform)
        if current.state is not ReplyState.OPEN or not platform.profile.can_edit:
            return PreviewPass(False)
        if not self._enter(reply_id):
            return PreviewPass(True, self.edit_interval_seconds)  # another thread is on it
        try:
            previewing, wait = self._preview_safely(current, platform, text)
        finally:
            self._leave(reply_id)
        return PreviewPass(previewing, wait)

    def commit(
        self,
        inbound_id: int,
        text: str,
        *,
        on_commit: Callable[[LedgerTransaction, str], Any] | None = None,
    ) -> Reply:
        """Commit ``text`` as the inbound's answer (with the caller's rows, via ``on_commit``)
        without sending anything; :meth:`deliver` sends it.

        A preview in flight on another thread does not hold it up (its outcome is recorded on
        the record whenever the platform answers). If the inbound's answer was committed
        before, that record is returned and ``on_commit`` is not called (another text raises
        :class:`ReplyConflict`).
        """
        inbound = self._inbound(inbound_id)
        profile = self.platform(inbound.platform).profile
        with self.ledger.transaction() as tx:
            # Read under the write lock: an answer committed before (by a process that died
            # before delivering it) is delivered as it is, and the caller's rows are not
            # written a second time.
            existing = self.store.reply_for_inbound(inbound_id)
            if existing is not None and existing.state is not ReplyState.OPEN:
                if existing.final_text != text:
                    raise ReplyConflict(
                        f"inbound {inbound_id} already has a committed reply with other text",
                        inbound_id=inbound_id,
                        reply_id=existing.id,
                    )
                return existing
            if on_commit is not None:
                on_commit(tx, text)
            reply = self.ledger.replies.commit_in_tx(tx, inbound_id, text, profile)
        COMMITTED_NOT_SENT.hit()
        return reply

    def _preview_safely(self, reply: Reply, platform: Platform, text: str) -> tuple[bool, float]:
        try:
            return self._preview(reply, platform, text)
        except StaleFence:
            return False, 0.0  # another engine holds the reply: leave the screen to it

    def _preview(self, reply: Reply, platform: Platform, text: str) -> tuple[bool, float]:
        """Bring the preview up to ``text``: (keep previewing, seconds to wait before the next)."""
        chunks = plan_chunks(text, platform.profile)
        while True:
            if self.ledger.replies.get(reply.id).state is not ReplyState.OPEN:
                return False, 0.0  # the answer is committed: the delivery owns the screen now
            ops = self._ops(reply.id)
            steps = plan_steps(
                read_slots(ops), chunks, False, platform, now=self.ledger.clock.now()
            )
            if not steps:
                return True, 0.0
            outcome = self._perform(reply, platform, steps[0], ops, deliver=False, count=False)
            if isinstance(outcome, Gone):
                continue  # the slot has no message now: the next step sends it again
            if isinstance(outcome, NotDelivered):
                return True, outcome.retry_after or self.backoff_base_seconds
            if not isinstance(outcome, Delivered):
                return False, 0.0  # the final delivery repairs (and marks) what is unknown

    # -- delivering --------------------------------------------------------------------------
    def deliver(
        self, reply_id: int, *, ignore_schedule: bool = False, wait: bool = False
    ) -> DeliveryPass:
        """Bring the chat in line with the committed reply, as far as the platform allows now.

        Where another thread of this engine is delivering it, the pass is ``busy`` at once, or
        with ``wait`` it waits for that thread to end its pass and then delivers what is left
        (nothing, if that pass delivered it): a turn delivering its own reply ends only once
        the reply is delivered or given back, whichever thread of the process sent it."""
        if not self._enter(reply_id, wait=wait):  # another thread of this engine is on it
            return DeliveryPass(self.ledger.replies.get(reply_id), "busy")
        try:
            reply = self.ledger.replies.get(reply_id)  # read after the other thread left
            if reply.state is not ReplyState.COMMITTED:
                return DeliveryPass(reply, str(reply.state))
            if not ignore_schedule and reply.not_before > self.ledger.clock.now():
                return DeliveryPass(reply, "scheduled")
            taken, ops = self._take_reading(reply)
            if taken is None:
                return DeliveryPass(reply, "busy")
            platform = self.platform(taken.request.platform)
            chunks = self.ledger.replies.chunks(taken)
            return self._converge(taken, platform, chunks, ops)
        except StaleFence:
            return DeliveryPass(self.ledger.replies.get(reply_id), "busy")
        finally:
            self._leave(reply_id)

    def _converge(
        self, reply: Reply, platform: Platform, chunks: list[Chunk], read: list[ReplyOp] | None
    ) -> DeliveryPass:
        """Step the chat toward ``chunks``; ``read``: the record's operations as :meth:`_take`
        just read them (the first step is planned from those), or None to read them."""
        store, clock = self.store, self.ledger.clock
        # A withdrawal finishes as withdrawn, in a write of its own after its last operation.
        end = ReplyState.WITHDRAWN if reply.withdrawal else ReplyState.DELIVERED
        while True:
            ops, read = self._ops(reply.id, read), None
            steps = plan_steps(
                read_slots(ops), chunks, True, platform, self.stopped_note, clock.now()
            )
            if not steps:
                done = store.finish_reply(
                    reply.id,
                    state=end,
                    now=clock.now(),
                    settle=self._pending.pop(reply.id, None),
                )
                return DeliveryPass(done, str(end))
            # A platform's "retry after" binds every later operation of the reply, previews'
            # refusals included.
            hold = (
                max(
                    (
                        op.updated_at + min(op.retry_after, MAX_RETRY_SECONDS)
                        for op in ops
                        if op.retry_after is not None
                    ),
                    default=0.0,
                )
                - clock.now()
            )
            if hold > self.inline_wait_max_seconds:
                return self._schedule(reply, clock.now() + hold, "rate limited by the platform")
            if hold > 0:
                clock.sleep(hold)
            # The reply is delivered with its last operation, unless that operation repeats an
            # earlier send's body: the edit to the answer is still to come.
            last = len(steps) == 1 and not steps[0].interim and end is ReplyState.DELIVERED
            outcome = self._perform(reply, platform, steps[0], ops, deliver=last, count=True)
            if isinstance(outcome, Delivered):
                if last:
                    return DeliveryPass(self.ledger.replies.get(reply.id), "delivered")
                continue
            if isinstance(outcome, Gone):
                continue  # not a failure of ours: the next step sends the slot again
            reply = self.ledger.replies.get(reply.id)
            if not isinstance(outcome, NotDelivered | MaybeDelivered):
                return self._give_up(reply, platform, f"rejected: {outcome.reason}")
            if reply.attempts >= reply.max_attempts:
                return self._give_up(reply, platform, f"out of attempts ({reply.attempts})")
            wait = self._backoff(reply.attempts)
            if isinstance(outcome, NotDelivered) and outcome.retry_after is not None:
                continue  # the wait is taken at the top, from the record
            if wait > self.inline_wait_max_seconds:
                return self._schedule(reply, clock.now() + wait, outcome.reason)
            clock.sleep(wait)

    def _schedule(self, reply: Reply, when: float, reason: str) -> DeliveryPass:
        """Give the reply back with its next try at ``when``; other replies go on meanwhile."""
        self._flush(reply.id)
        now = self.ledger.clock.now()
        log.info(
            "reply scheduled",
            extra={"reply_id": reply.id, "not_before": when, "reason": reason},
        )
        self.store.release_reply(
            reply.id, owner=self.owner, now=now, not_before=when, last_error=reason
        )
        return DeliveryPass(self.ledger.replies.get(reply.id), "scheduled")

    def _backoff(self, attempts: int) -> float:
        exponent = min(max(0, attempts - 1), 62)  # past the cap long before: no overflow
        return float(min(self.backoff_cap_seconds, self.backoff_base_seconds * 2.0**exponent))

    def _give_up(self, reply: Reply, platform: Platform, reason: str) -> DeliveryPass:
        """``dead``, after one attempt at an honest "could not deliver" notice (a withdrawal
        has nothing to apologise for: it gets none)."""
        store, clock = self.store, self.ledger.clock
        self._flush(reply.id)
        ops = store.reply_ops(reply.id)
        if not reply.withdrawal and not any(op.slot == -1 for op in ops):
            op = store.begin_op(
                reply.id,
                slot=-1,
                kind=OpKind.SEND,
                body=self.notice,
                marked=False,
                message_id=None,
                now=clock.now(),
                owner=self.owner,
                lease_seconds=self.lease_seconds,
                expect_seq=max((op.seq for op in ops), default=0),
            )
            answer = platform.send(self._keyed(reply, -1, 0), self.notice, marked=False)
            self._record(op, vet_outcome(answer, "send", reply.id), deliver=False, count=False)
        dead = store.finish_reply(
            reply.id, state=ReplyState.DEAD, now=clock.now(), last_error=reason
        )
        log.warning("reply dead", extra={"reply_id": reply.id, "reason": reason})
        return DeliveryPass(dead, "dead")

    # -- schedules and recovery --------------------------------------------------------------
    def run_due(self, limit: int = 100) -> list[DeliveryPass]:
        """Deliver every committed reply whose time has come."""
        return [self.deliver(reply.id) for reply in self.ledger.replies.due(limit=limit)]

    def next_due(self) -> float | None:
        pending = self.ledger.replies.undelivered(limit=1_000)
        return min((reply.not_before for reply in pending), default=None)

    def recover(self) -> RecoveryReport:
        """After a restart: deliver what is committed, and list what still needs an answer.

        Delivered replies are not touched; an open reply (its answer never committed) is left
        to the application, whose next :meth:`stream` or :meth:`answer` for that inbound reuses
        the recorded preview messages.
        """
        report = RecoveryReport()
        for reply in self.ledger.replies.undelivered(limit=100_000):
            if reply.lease_owner is not None and reply.lease_owner != self.owner:
                report.released.append(reply.id)
            buckets = {
                "delivered": report.delivered,
                "withdrawn": report.withdrawn,
                "scheduled": report.scheduled,
                "dead": report.dead,
            }
            buckets.get(self.deliver(reply.id).status, report.busy).append(reply.id)
        report.unanswered = [
            inbound.id for inbound in self.ledger.inbound.unanswered(limit=100_000)
        ]
        return report
