"""One chat turn, from its start to its delivery: T2, the model stream, T5, deliver.

A turn answers one inbound message on its session (``platform, bot, chat, thread``):

1. **T2, one transaction**: the inbox counts one more start (``inbound.start_in_tx``; past
   ``[turns] max_starts`` the message is quarantined on its own and the turn does not run), the
   reply record is opened (``replies.open_in_tx``: it exists before any preview) and the run
   ``turn:{inbound}`` starts (``runs.turn.start_in_tx``, refused with :class:`BranchBusy` while
   another turn holds the session) or, for a turn a dead process left, is taken over under the
   next fence (``runs.turn.resume_in_tx``).
2. **The model stream**: the system prompt and the message's text (history is the current
   message only, for now); a resumed turn's request ends with ``[turns] resume_note``. Text
   deltas go to a :class:`~oncewire.gateway.preview.Previewer` when the platform streams. A
   failure is retried up to ``[model] max_retries`` times, waiting as a 429 asks (or an
   exponential backoff), and every wait ends at once when the turn is interrupted.
3. **T5, one transaction**: the reply's final text and chunk plan (``replies.commit_in_tx``,
   which marks the inbound ``answered``), the model step (``runs.turn.record_step_in_tx``) and
   the ``answered`` terminal carrying the text's digest. When the model could not answer, the
   committed text is an honest failure note and the terminal ``failed``: an inbound is never
   left silent.
4. The previewer is stopped (joined for a bounded time), then ``engine.deliver``.

Nothing of a model call is recorded until it completed, so a process killed mid-stream leaves
the run ``running`` with no step: the next process takes it over and asks the model again, and
its stream edits the preview messages the record already holds.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oncewire.core.canonical import digest
from oncewire.core.errors import BranchBusy
from oncewire.gateway.config import PlatformConfig
from oncewire.gateway.model_results import (
    Delta,
    Interrupt,
    ModelClient,
    ModelFailure,
    ModelInterrupted,
    ModelRateLimited,
    ModelRejected,
    ModelResponse,
)
from oncewire.gateway.preview import Previewer
from oncewire.ledger import Ledger
from oncewire.replies import PlatformProfile, ReplyEngine, ReplyState
from oncewire.runs import TurnSession
from oncewire.runs.turn import text_sha256
from oncewire.storage.replies import Inbound

__all__ = ["EMPTY_ANSWER_TEXT", "FAILURE_TEXT", "TurnResult", "TurnSettings", "TurnWorker"]

log = logging.getLogger("oncewire.gateway.turn")

FAILURE_TEXT = (
    "Sorry: the model service is unavailable right now, so I could not answer this message. "
    "Please send it again later."
)
EMPTY_ANSWER_TEXT = "(The model returned an empty answer.)"


@dataclass(frozen=True)
class TurnSettings:
    """How turns run; the runner builds it from ``[model]`` and ``[turns]``."""

    max_retries: int
    max_starts: int
    resume_note: str
    system_prompt: str | None = None
    lease_seconds: float = 600.0
    retry_base_seconds: float = 0.5
    retry_cap_seconds: float = 30.0
    preview_join_seconds: float = 10.0
    failure_text: str = FAILURE_TEXT


@dataclass(frozen=True, slots=True)
class TurnResult:
    """How a turn ended here: ``answered``, ``failed`` (an honest failure note was committed),
    ``quarantined``, ``busy`` (another turn holds the session; nothing was written) or
    ``interrupted`` (stopped mid-stream by a drain: the next process takes it over)."""

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
    ) -> None:
        self.ledger = ledger
        self.engine = engine
        self.model = model
        self.platforms = dict(platforms)
        self.settings = settings
        self.owner = owner

    def run(
        self, inbound_id: int, interrupt: Interrupt, *, resume_fence: int | None = None
    ) -> TurnResult:
        """Answer ``inbound_id``: a new turn, or (``resume_fence``) the takeover of a turn a
        dead process held under that fence."""
        inbound = self.ledger.inbound.get(inbound_id)
        platform = self.platforms[inbound.platform]
        profile = self.engine.platform(inbound.platform).profile
        session = TurnSession(inbound.platform, inbound.bot, inbound.chat, inbound.thread)
        turn = self.ledger.runs.turn
        try:
            with self.ledger.transaction() as tx:
                started = self.ledger.inbound.start_in_tx(
                    tx, inbound_id, max_starts=self.settings.max_starts
                )
                if resume_fence is None and started is None:
                    return TurnResult(inbound_id, "quarantined")
                if resume_fence is None:
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
                        return TurnResult(inbound_id, "quarantined")
                    self.ledger.replies.open_in_tx(tx, inbound_id, profile)
        except BranchBusy:
            return TurnResult(inbound_id, "busy")  # rolled back: the inbox's count too
        fence = result.run.fence
        steps = int(result.run.state.get("steps", 0))
        log.info(
            "turn start inbound=%s session=%s/%s/%s%s attempt=%s fence=%s",
            inbound_id,
            inbound.platform,
            inbound.chat,
            inbound.thread or "-",
            " (resumed)" if resume_fence is not None else "",
            started.attempts if started is not None else "?",
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
            messages = self._messages(inbound, resumed=resume_fence is not None)
            try:
                response = self._ask(messages, interrupt, previewer)
            except ModelInterrupted:
                if previewer is not None:
                    previewer.stop(self.settings.preview_join_seconds)
                log.info("turn interrupted inbound=%s (the next process resumes it)", inbound_id)
                return TurnResult(inbound_id, "interrupted")
            status = self._commit(inbound_id, profile, messages, response, steps, fence)
            if previewer is not None:
                # After the commit: a parked preview never held the answer up.
                previewer.stop(self.settings.preview_join_seconds)
        else:
            status = "answered"  # committed before (cannot happen while T5 is one commit)
        delivery = self.engine.deliver(reply.id)
        log.info(
            "turn deliver inbound=%s reply=%s status=%s", inbound_id, reply.id, delivery.status
        )
        return TurnResult(inbound_id, status, delivery.status)

    def _messages(self, inbound: Inbound, *, resumed: bool) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.settings.system_prompt:
            messages.append({"role": "system", "content": self.settings.system_prompt})
        payload = inbound.payload
        text = payload.get("text", "") if isinstance(payload, dict) else ""
        messages.append({"role": "user", "content": text})
        if resumed:
            messages.append({"role": "user", "content": self.settings.resume_note})
        return messages

    def _ask(
        self,
        messages: list[dict[str, Any]],
        interrupt: Interrupt,
        previewer: Previewer | None,
    ) -> ModelResponse | ModelFailure:
        """The model's answer, or the failure that ended the retries (ModelInterrupted is
        raised: the turn stops where it is)."""
        attempt = 0
        while True:
            parts: list[str] = []

            def on_delta(delta: Delta, parts: list[str] = parts) -> None:
                if delta.text and previewer is not None:
                    parts.append(delta.text)
                    previewer.show("".join(parts))

            try:
                return self.model.complete(messages, on_delta=on_delta, interrupt=interrupt)
            except ModelInterrupted:
                raise
            except ModelRejected as exc:
                log.warning("model refused the request: %s", exc)
                return exc  # sending it again will not help
            except ModelFailure as exc:
                if attempt >= self.settings.max_retries:
                    log.warning("model failed after %s retries: %s", attempt, exc)
                    return exc
                wait = self._backoff(attempt, exc)
                log.info("model failed (%s); retry %s in %.2fs", exc.code, attempt + 1, wait)
                if _sleep(interrupt, wait):
                    raise ModelInterrupted("interrupted while waiting to retry") from exc
                attempt += 1

    def _backoff(self, attempt: int, failure: ModelFailure) -> float:
        if isinstance(failure, ModelRateLimited) and failure.retry_after_seconds is not None:
            return failure.retry_after_seconds
        base = self.settings.retry_base_seconds * float(2**attempt)
        return min(self.settings.retry_cap_seconds, base * random.uniform(0.5, 1.0))

    def _commit(
        self,
        inbound_id: int,
        profile: PlatformProfile,
        messages: list[dict[str, Any]],
        response: ModelResponse | ModelFailure,
        steps: int,
        fence: int,
    ) -> str:
        """T5: the reply, the step and the terminal in one transaction."""
        turn = self.ledger.runs.turn
        with self.ledger.transaction() as tx:
            if isinstance(response, ModelResponse):
                text = response.text.strip() or EMPTY_ANSWER_TEXT
                self.ledger.replies.commit_in_tx(tx, inbound_id, text, profile)
                usage = response.usage
                turn.record_step_in_tx(
                    tx,
                    inbound_id,
                    steps + 1,
                    request_digest=digest({"messages": messages}),
                    response_digest=digest(
                        {"text": response.text, "finish_reason": response.finish_reason}
                    ),
                    usage={} if usage is None else dataclasses.asdict(usage),
                    finish_reason=response.finish_reason,
                    fence=fence,
                )
                turn.terminate_in_tx(
                    tx,
                    inbound_id,
                    "answered",
                    reason="final_answer",
                    reply_text=text,
                    fence=fence,
                )
                status = "answered"
            else:
                text = self.settings.failure_text
                self.ledger.replies.commit_in_tx(tx, inbound_id, text, profile)
                turn.terminate_in_tx(
                    tx, inbound_id, "failed", reason=response.code, reply_text=text, fence=fence
                )
                status = "failed"
        log.info(
            "turn commit inbound=%s status=%s chars=%s digest=%s",
            inbound_id,
            status,
            len(text),
            text_sha256(text)[:12],
        )
        return status


def _sleep(interrupt: Interrupt, seconds: float) -> bool:
    """Wait ``seconds``; True (at once) if the turn is interrupted meanwhile."""
    woken = threading.Event()
    interrupt.on_interrupt(woken.set)
    return woken.wait(seconds)
