"""One chat turn, from its start to its delivery: T2, the model stream, T5, deliver.

A turn answers one inbound message on its session (``platform, bot, chat, thread``):

1. **T2, one transaction**: the inbox counts one more start (``inbound.start_in_tx``; past
   ``[turns] max_starts`` the message is quarantined on its own, its reply commits a note that
   it was set aside, and the turn does not run), the
   reply record is opened (``replies.open_in_tx``: it exists before any preview) and the run
   ``turn:{inbound}`` starts (``runs.turn.start_in_tx``, refused with :class:`BranchBusy` while
   another turn holds the session) or, for a turn a dead process left, is taken over under the
   next fence (``runs.turn.resume_in_tx``).
2. **The model stream** (:mod:`oncewire.gateway.prompting`): the system prompt, the
   session's history (its earlier messages and the answers committed for them, ``[turns]
   history_messages`` and ``history_chars``), the message's text and the tools
   (:mod:`oncewire.gateway.tools`); a resumed turn's request ends with ``[turns]
   resume_note``. Text deltas go to a :class:`~oncewire.gateway.preview.Previewer` when the
   platform streams. A failure is retried
   up to ``[model] max_retries`` times, waiting as a 429 asks (or an exponential backoff), and
   every wait ends at once when the turn is interrupted.
3. **T3, the tool calls, T4** (:mod:`oncewire.gateway.tool_calls`), when the completed
   response asks for tool calls: the step and one effect per call in one transaction, the
   dispatcher woken, each effect awaited from the store, its result resolved and told to the
   model; the model is asked again, up to ``[turns] max_steps`` steps (a step past that commits
   an honest "stopped" answer).
4. **T5, one transaction**: the reply's final text and chunk plan (``replies.commit_in_tx``,
   which marks the inbound ``answered``), the model step (``runs.turn.record_step_in_tx``) and
   the ``answered`` terminal carrying the text's digest (``outcome_unknown`` while a
   world-changing call is unresolved). When the model could not answer, the committed text is
   an honest failure note and the terminal ``failed``: an inbound is never left silent.
5. The previewer is stopped (joined for a bounded time), then ``engine.deliver``.

**Interrupted** (an interrupt recorded on the run, :mod:`oncewire.gateway.sessions`; the
runner signals the worker, which ends its model stream or tool wait, or T3/T5 is refused by
the transition table): the previewer is stopped, then one transaction
(:func:`end_interrupted_in_tx`) ends the run ``interrupted``, marks the message
``superseded`` by the interrupting one and withdraws the reply; ``engine.deliver`` then
deletes its previews. A ``/stop`` message has no turn of its own: it is started, its reply
opened and committed with a one-line confirmation in one transaction, then delivered.

**Its lease is renewed** every third of ``lease_seconds`` (``[leases] turn_lease_seconds``) while
it runs, from T2 until T5 committed. A renewal refused (another process took the turn over: its
fence moved) interrupts the turn, which then stops without writing anything more: its model
stream is closed, its previewer stopped, and no terminal, step or reply is written under the
lost fence (a write that raced with the takeover is refused by its fence).

Nothing of a model call is recorded until it completed, so a process killed mid-stream leaves
the run ``running`` with no new step: the next process takes it over, rebuilds the
conversation from the recorded steps
(:meth:`~oncewire.gateway.tool_calls.ToolCalls.replay`: a ``done`` tool is never run again)
and asks the model again; its stream edits the preview messages the record already holds.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from oncewire.core import crash
from oncewire.core.canonical import digest
from oncewire.core.errors import (
    BranchBusy,
    ConfigurationError,
    RunNotFound,
    StaleFence,
    TransitionRefused,
)
from oncewire.core.limits import MAX_RETRY_SECONDS
from oncewire.gateway import prompting
from oncewire.gateway.config import PlatformConfig
from oncewire.gateway.model_results import (
    Interrupt,
    ModelClient,
    ModelFailure,
    ModelInterrupted,
    ModelResponse,
)
from oncewire.gateway.preview import Previewer
from oncewire.gateway.sessions import NOTHING_TO_STOP, STOPPED_NOTE, is_stop, stopped_by
from oncewire.gateway.tool_calls import (
    Conversation,
    ToolCalls,
    ToolWaitInterrupted,
    response_digest,
    usage,
)
from oncewire.gateway.tools import ToolRegistry, assistant_message, recorded_calls
from oncewire.ledger import Ledger
from oncewire.replies import PlatformProfile, ReplyEngine, ReplyState
from oncewire.replies.operations import COMMITTED_NOT_SENT
from oncewire.runs import Run, TurnSession
from oncewire.runs.turn import run_id, text_sha256
from oncewire.storage import Transaction
from oncewire.storage.replies import Inbound

__all__ = [
    "EMPTY_ANSWER_TEXT",
    "FAILURE_TEXT",
    "STOPPED_TEXT",
    "TurnResult",
    "TurnSettings",
    "TurnWorker",
    "end_interrupted_in_tx",
]

log = logging.getLogger("oncewire.gateway.turn")

TURN_STARTED = crash.register(
    "gateway.turn_started_before_model",
    "T2 committed (the inbox counted a start, the reply is open, the turn run holds the "
    "session); the model not asked yet",
)
INTERRUPT_RECORDED = crash.register(
    "gateway.interrupt_recorded_before_withdraw",
    "an interrupt is recorded on the running turn; the turn not yet ended interrupted, its "
    "message not superseded, its reply not withdrawn",
)
PREVIEW_AT_COMMIT = crash.register(
    "gateway.preview_in_flight_at_commit",
    "T5 committed the answer while a preview operation was still in flight on the platform",
)

FAILURE_TEXT = (
    "Sorry: the model service is unavailable right now, so I could not answer this message. "
    "Please send it again later."
)
EMPTY_ANSWER_TEXT = "(The model returned an empty answer.)"
SET_ASIDE_TEXT = (
    "Sorry: answering this message failed {starts} times, so I have set it aside and will not "
    "try again. Please rephrase it, or send it again later."
)
STOPPED_TEXT = (
    "(I stopped after {steps} without a final answer: that is the limit of model steps for "
    "one message.)"
)


@dataclass(frozen=True)
class TurnSettings:
    """How turns run; the runner builds it from ``[model]`` and ``[turns]``."""

    max_retries: int
    max_starts: int
    resume_note: str
    system_prompt: str | None = None
    history_messages: int = 20  # earlier messages of the session the model sees, at most
    history_chars: int = 24_000  # and their texts' length, at most (the oldest left out first)
    max_steps: int = 16
    tool_poll_seconds: float = 0.05  # how often a waiting turn reads its tool effects
    lease_seconds: float = 600.0
    retry_base_seconds: float = 0.5
    retry_cap_seconds: float = 30.0
    preview_join_seconds: float = 10.0
    failure_text: str = FAILURE_TEXT
    set_aside_text: str = SET_ASIDE_TEXT  # a quarantined message's reply ({starts}: max_starts)

    def __post_init__(self) -> None:
        # Written so that NaN fails too; refused rather than capped (as RetryPolicy does).
        for name in ("tool_poll_seconds", "lease_seconds"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ConfigurationError(f"{name} must be positive and finite, not {value!r}")
        base, cap = self.retry_base_seconds, self.retry_cap_seconds
        if not (0 <= base < math.inf and 0 <= cap <= MAX_RETRY_SECONDS):
            raise ConfigurationError(
                "retry_base_seconds must be finite and not negative, retry_cap_seconds between "
                f"0 and {MAX_RETRY_SECONDS} (a day); not {base!r} and {cap!r}"
            )
        if base > cap:  # the cap would silently replace the base
            raise ConfigurationError(
                f"retry_base_seconds ({base:g}) is above retry_cap_seconds ({cap:g}): every "
                "wait would be the cap; raise retry_cap_seconds too"
            )


@dataclass(frozen=True, slots=True)
class TurnResult:
    """How a turn ended here: ``answered``, ``failed`` (an honest failure note was committed),
    ``outcome_unknown`` (answered, but a world-changing tool call's outcome is unknown),
    ``quarantined`` (set aside past ``max_starts``; its reply says so), ``busy`` (another
    turn holds the session; nothing was written),
    ``interrupted`` (its recorded interrupt ended it, its reply withdrawn; or stopped
    mid-stream by a drain, without a terminal: the next process takes it over) or ``lost``
    (its lease was taken over by another process: stopped, nothing more written)."""

    inbound_id: int
    status: str
    delivery: str | None = None  # the delivery pass's status, once delivered


class TurnWorker:
    """Runs turns on the calling thread; one instance serves every worker thread."""

    def __init__(
        self,
        ledger: Ledger,
        engine: ReplyEngine,
        model: ModelClient,
        platforms: Mapping[str, PlatformConfig],
        settings: TurnSettings,
        *,
        owner: str,
        tools: ToolRegistry | None = None,
        wake_tools: Callable[[], None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.engine = engine
        self.model = model
        self.platforms = dict(platforms)
        self.settings = settings
        self.owner = owner
        self.tools = tools if tools is not None else ToolRegistry()
        self.calls = ToolCalls(ledger, self.tools, poll_seconds=settings.tool_poll_seconds)
        self._wake_tools = wake_tools  # the dispatcher's wake(): look for the new effects now

    def run(
        self, inbound_id: int, interrupt: Interrupt, *, resume_fence: int | None = None
    ) -> TurnResult:
        """Answer ``inbound_id``: a new turn, or (``resume_fence``) the takeover of a turn a
        dead process held under that fence."""
        inbound = self.ledger.inbound.get(inbound_id)
        profile = self.engine.platform(inbound.platform).profile
        session = TurnSession(inbound.platform, inbound.bot, inbound.chat, inbound.thread)
        turn = self.ledger.runs.turn
        if is_stop(inbound):
            return self._confirm_stop(inbound_id, profile)
        try:
            with self.ledger.transaction() as tx:
                started = self.ledger.inbound.start_in_tx(
                    tx, inbound_id, max_starts=self.settings.max_starts
                )
                if resume_fence is None and started is None:
                    self._set_aside_in_tx(tx, inbound_id, profile)
                elif resume_fence is None:
                    self.ledger.replies.open_in_tx(tx, inbound_id, profile)
                    result = turn.start_in_tx(
                        tx,
                        inbound_id,
                        session,
                        owner=self.owner,
                        lease_seconds=self.settings.lease_seconds,
                    )
                else:
                    result = turn.resume_in_tx(
                        tx,
                        inbound_id,
                        owner=self.owner,
                        from_fence=resume_fence,
                        lease_seconds=self.settings.lease_seconds,
                    )
                    if started is None:
                        # Quarantined past max_starts: the turn ends with the message set aside.
                        turn.terminate_in_tx(
                            tx, inbound_id, "failed", reason="quarantined", fence=result.run.fence
                        )
                        self._set_aside_in_tx(tx, inbound_id, profile)
                    else:
                        self.ledger.replies.open_in_tx(tx, inbound_id, profile)
        except BranchBusy:
            return TurnResult(inbound_id, "busy")  # rolled back: the inbox's count too
        if started is None:
            return self._deliver_set_aside(inbound_id)
        if result.run.status == "interrupting":
            # Taken over after its interrupt was recorded (a turn that raised): never resumed.
            return self._end_interrupted(inbound_id, result.run, profile)
        fence = result.run.fence
        lease = _LeaseRenewal(self, run_id(inbound_id), fence, interrupt)
        try:
            attempts = started.attempts if started is not None else None
            return self._answer(inbound, interrupt, result.run, lease, resume_fence, attempts)
        finally:
            lease.stop()

    def _answer(
        self,
        inbound: Inbound,
        interrupt: Interrupt,
        run: Run,
        lease: _LeaseRenewal,
        resume_fence: int | None,
        attempts: int | None,
    ) -> TurnResult:
        """After T2: the model, the tool calls, T5 and the delivery, under ``lease``."""
        inbound_id = inbound.id
        platform = self.platforms[inbound.platform]
        profile = self.engine.platform(inbound.platform).profile
        TURN_STARTED.hit()
        fence = run.fence
        steps = int(run.state.get("steps", 0))
        log.info(
            "turn start inbound=%s session=%s/%s/%s%s attempt=%s fence=%s",
            inbound_id,
            inbound.platform,
            inbound.chat,
            inbound.thread or "-",
            " (resumed)" if resume_fence is not None else "",
            attempts if attempts is not None else "?",
            fence,
        )
        reply = self.engine.open(inbound_id)
        if reply.state is ReplyState.OPEN:
            previewer = None
            if platform.streaming and profile.can_edit:
                previewer = Previewer(
                    self.engine,
                    reply.id,
                    edit_interval_seconds=platform.edit_interval_seconds,
                    name=f"preview-{inbound_id}",
                ).start()
            messages = prompting.prompt(
                self.ledger,
                inbound,
                system_prompt=self.settings.system_prompt,
                history_messages=self.settings.history_messages,
                history_chars=self.settings.history_chars,
            )
            loop = Conversation(inbound_id, fence, steps, messages)
            try:
                if steps:
                    self.calls.replay(loop, interrupt)
                if resume_fence is not None:
                    messages.append({"role": "user", "content": self.settings.resume_note})
                response = self._converse(loop, interrupt, previewer)
                status = self._commit(inbound_id, profile, loop, response)
                lease.stop()  # the run is ended: nothing left to renew
                if previewer is not None and previewer.in_flight:
                    PREVIEW_AT_COMMIT.hit()
            except (ModelInterrupted, ToolWaitInterrupted, TransitionRefused, StaleFence) as exc:
                if previewer is not None:
                    previewer.stop(self.settings.preview_join_seconds)
                if lease.lost or isinstance(exc, StaleFence):
                    # Another process holds the turn now: nothing more is written here.
                    log.warning("turn lost inbound=%s fence=%s: taken over", inbound_id, fence)
                    return TurnResult(inbound_id, "lost")
                run = self.ledger.runs.get(run_id(inbound_id))
                if run.status == "interrupting":
                    return self._end_interrupted(inbound_id, run, profile)
                if isinstance(exc, TransitionRefused):
                    raise
                log.info("turn interrupted inbound=%s (the next process resumes it)", inbound_id)
                return TurnResult(inbound_id, "interrupted")
            if previewer is not None:
                # After the commit: a parked preview never held the answer up.
                previewer.stop(self.settings.preview_join_seconds)
        else:
            status = "answered"  # committed before (cannot happen while T5 is one commit)
        delivery = self.engine.deliver(reply.id, wait=True)
        log.info(
            "turn deliver inbound=%s reply=%s status=%s", inbound_id, reply.id, delivery.status
        )
        return TurnResult(inbound_id, status, delivery.status)

    def _end_interrupted(self, inbound_id: int, run: Run, profile: PlatformProfile) -> TurnResult:
        """The recorded interrupt won: the run ends ``interrupted``, the message superseded,
        the reply withdrawn (one commit); the delivery then deletes the previews."""
        INTERRUPT_RECORDED.hit()
        with self.ledger.transaction() as tx:
            end_interrupted_in_tx(self.ledger, tx, run, profile)
        reply = self.ledger.replies.for_inbound(inbound_id)
        delivery = None if reply is None else self.engine.deliver(reply.id, wait=True).status
        log.info("turn interrupted inbound=%s withdrawn=%s", inbound_id, delivery)
        return TurnResult(inbound_id, "interrupted", delivery)

    def _set_aside_in_tx(self, tx: Transaction, inbound_id: int, profile: PlatformProfile) -> None:
        """The message was quarantined in ``tx`` (past ``max_starts``): its reply commits, in
        the same transaction, a note saying so. An inbound is never left silent, and the
        previews an earlier attempt left on the screen become that note instead of staying a
        fragment of an answer that never came. The message stays ``quarantined``."""
        text = self.settings.set_aside_text.format(starts=self.settings.max_starts)
        self.ledger.replies.commit_in_tx(tx, inbound_id, text, profile)

    def _deliver_set_aside(self, inbound_id: int) -> TurnResult:
        reply = self.engine.open(inbound_id)
        delivery = self.engine.deliver(reply.id, wait=True)
        log.warning("turn set aside inbound=%s delivery=%s", inbound_id, delivery.status)
        return TurnResult(inbound_id, "quarantined", delivery.status)

    def _confirm_stop(self, inbound_id: int, profile: PlatformProfile) -> TurnResult:
        """``/stop``: its interrupt was recorded at admission; the scheduler starts it once the
        session's turn has ended. Its reply is a one-line confirmation, committed (started,
        opened and answered in one transaction) before it is sent."""
        text = STOPPED_NOTE if stopped_by(self.ledger, inbound_id) else NOTHING_TO_STOP
        with self.ledger.transaction() as tx:
            started = self.ledger.inbound.start_in_tx(
                tx, inbound_id, max_starts=self.settings.max_starts
            )
            if started is None:
                self._set_aside_in_tx(tx, inbound_id, profile)
            else:
                self.ledger.replies.open_in_tx(tx, inbound_id, profile)
                self.ledger.replies.commit_in_tx(tx, inbound_id, text, profile)
        if started is None:
            return self._deliver_set_aside(inbound_id)
        reply = self.engine.open(inbound_id)
        delivery = self.engine.deliver(reply.id, wait=True)
        log.info("stop confirmed inbound=%s delivery=%s", inbound_id, delivery.status)
        return TurnResult(inbound_id, "answered", delivery.status)

    def _converse(
        self, loop: Conversation, interrupt: Interrupt, previewer: Previewer | None
    ) -> ModelResponse | ModelFailure:
        """Ask the model until it answers without tool calls, fails, or uses up max_steps;
        each step with tool calls is T3, its calls run as effects, each result T4."""
        while True:
            response = prompting.ask(
                self.model,
                self.tools,
                loop.messages,
                interrupt,
                previewer,
                max_retries=self.settings.max_retries,
                backoff=self._backoff,
            )
            if isinstance(response, ModelFailure) or not response.tool_calls:
                return response
            if loop.steps + 1 >= self.settings.max_steps:
                loop.stopped = True
                return response  # committed by T5 with its calls unrun
            calls = self.calls.record(loop, response)
            if self._wake_tools is not None:
                self._wake_tools()
            loop.messages.append(assistant_message(response.text, calls))
            for index, call in enumerate(calls):
                content = self.calls.outcome(loop, loop.steps, index, call, interrupt)
                loop.messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": content}
                )

    def _backoff(self, attempt: int, failure: ModelFailure) -> float:
        """The wait before the next try (:func:`~oncewire.gateway.prompting.backoff_seconds`
        with ``retry_base_seconds`` and ``retry_cap_seconds``)."""
        return prompting.backoff_seconds(
            attempt,
            failure,
            base_seconds=self.settings.retry_base_seconds,
            cap_seconds=self.settings.retry_cap_seconds,
        )

    def _commit(
        self,
        inbound_id: int,
        profile: PlatformProfile,
        loop: Conversation,
        response: ModelResponse | ModelFailure,
    ) -> str:
        """T5: the reply, the step and the terminal in one transaction."""
        turn = self.ledger.runs.turn
        fence = loop.fence
        with self.ledger.transaction() as tx:
            if isinstance(response, ModelResponse):
                text = response.text.strip()
                reason = "final_answer"
                calls: list[dict[str, Any]] = []
                if loop.stopped:
                    # Recorded as asked, never proposed: nothing of them ran.
                    calls = recorded_calls(response.tool_calls, loop.steps + 1)
                    count = loop.steps + 1
                    stopped = STOPPED_TEXT.format(steps=f"{count} step{'s' * (count != 1)}")
                    text = f"{text}\n\n{stopped}" if text else stopped
                    reason = "max_steps"
                text = text or EMPTY_ANSWER_TEXT
                self.ledger.replies.commit_in_tx(tx, inbound_id, text, profile)
                turn.record_step_in_tx(
                    tx,
                    inbound_id,
                    loop.steps + 1,
                    request_digest=digest({"messages": loop.messages}),
                    response_digest=response_digest(response),
                    usage=usage(response),
                    finish_reason=response.finish_reason,
                    tool_calls=calls,
                    fence=fence,
                )
                status = "answered"
            else:
                text = self.settings.failure_text
                self.ledger.replies.commit_in_tx(tx, inbound_id, text, profile)
                status, reason = "failed", response.code
            if loop.unknown:
                # The preset admits no other terminal while a world-changing call is open.
                status = "outcome_unknown"
            turn.terminate_in_tx(
                tx, inbound_id, status, reason=reason, reply_text=text, fence=fence
            )
        # The answer is durable, its delivery not started: the reply engine's crash window of
        # the same name, so the lab arms it in a gateway as in any engine user.
        COMMITTED_NOT_SENT.hit()
        log.info(
            "turn commit inbound=%s status=%s chars=%s digest=%s",
            inbound_id,
            status,
            len(text),
            text_sha256(text)[:12],
        )
        return status


def end_interrupted_in_tx(
    ledger: Ledger, tx: Transaction, run: Run, profile: PlatformProfile
) -> None:
    """In ``tx``: the turn ``run`` (its interrupt recorded) ends ``interrupted``, its message is
    ``superseded`` by the interrupting one, its reply withdrawn (delivered afterwards)."""
    inbound_id = int(run.turn or 0)
    interrupt = run.state.get("interrupt") or {}
    by = interrupt.get("by")
    reason = str(interrupt.get("reason") or "superseded")
    ledger.runs.turn.terminate_in_tx(tx, inbound_id, "interrupted", reason=reason, fence=run.fence)
    if isinstance(by, int):
        ledger.inbound.supersede_in_tx(tx, inbound_id, by=by)
    ledger.replies.withdraw_in_tx(tx, inbound_id, profile)


class _LeaseRenewal:
    """Renews one running turn's lease on a thread of its own until :meth:`stop`; a renewal
    refused (the fence moved, the run is gone) sets :attr:`lost` and interrupts the turn."""

    def __init__(self, worker: TurnWorker, name: str, fence: int, interrupt: Interrupt) -> None:
        self.worker = worker
        self.name = name
        self.fence = fence
        self.interrupt = interrupt
        self.lost = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        seconds = self.worker.settings.lease_seconds
        while not self._stopped.wait(seconds / 3):
            try:
                self.worker.ledger.runs.renew(
                    self.name, owner=self.worker.owner, fence=self.fence, lease_seconds=seconds
                )
            except (StaleFence, RunNotFound) as exc:
                if self._stopped.is_set():
                    return  # T5 ended the run meanwhile: nothing was lost
                self.lost = True
                log.warning(
                    "turn %s: its lease renewal was refused (%s); stopping it", self.name, exc
                )
                self.interrupt.interrupt()
                return
            except Exception as exc:
                # The store may be back before the lease runs out; T5 is refused if it is not.
                log.warning("turn %s: its lease renewal failed (%s); trying again", self.name, exc)
