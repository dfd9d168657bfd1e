"""What a turn asks the model, and how it asks again.

The request (:func:`prompt`): the system prompt, the session's history read from the ledger
(:func:`history`: its earlier messages and the answers committed for them, ``[turns]
history_messages`` and ``history_chars``, newest kept first) and the message's text. The asking
(:func:`ask`): one model call, its text deltas shown by the previewer when the platform
streams, a failure retried up to ``[model] max_retries`` times after the wait a 429 asks for, or
an exponential backoff with jitter (:func:`backoff_seconds`); every wait ends at once when the
turn is interrupted.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from oncewire.core.limits import MAX_RETRY_SECONDS
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
from oncewire.gateway.sessions import is_stop, model_text
from oncewire.gateway.tools import ToolRegistry
from oncewire.ledger import Ledger
from oncewire.storage.replies import Inbound

__all__ = ["ask", "backoff_seconds", "history", "prompt", "sleep"]

# The turn's logger: a model failure and its retries are lines of the turn's.
log = logging.getLogger("oncewire.gateway.turn")


def prompt(
    ledger: Ledger,
    inbound: Inbound,
    *,
    system_prompt: str | None,
    history_messages: int,
    history_chars: int,
) -> list[dict[str, Any]]:
    """The messages a turn sends the model for ``inbound``."""
    messages: list[dict[str, Any]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.extend(history(ledger, inbound, limit=history_messages, chars=history_chars))
    messages.append({"role": "user", "content": model_text(inbound.payload)})
    return messages


def history(ledger: Ledger, inbound: Inbound, *, limit: int, chars: int) -> list[dict[str, Any]]:
    """The session's earlier messages and the answers their user was given, read from the
    ledger (what was committed is what the chat shows), newest kept first within ``chars``;
    ``/stop`` and its confirmation are left out."""
    earlier = ledger.replies.history(inbound.id, limit=limit) if limit else []
    kept: list[dict[str, Any]] = []
    room = chars
    for exchange in reversed(earlier):
        if is_stop(exchange.inbound):
            continue
        text = model_text(exchange.inbound.payload)
        if not text and exchange.answer is None:
            continue  # nothing the model could read
        pair = [{"role": "user", "content": text}]
        if exchange.answer is not None:
            pair.append({"role": "assistant", "content": exchange.answer})
        room -= sum(len(m["content"]) for m in pair)
        if room < 0:
            break
        kept[:0] = pair
    return kept


def ask(
    model: ModelClient,
    tools: ToolRegistry,
    messages: list[dict[str, Any]],
    interrupt: Interrupt,
    previewer: Previewer | None,
    *,
    max_retries: int,
    backoff: Callable[[int, ModelFailure], float],
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
            return model.complete(
                messages, tools=tools.specs(), on_delta=on_delta, interrupt=interrupt
            )
        except ModelInterrupted:
            raise
        except ModelRejected as exc:
            log.warning("model refused the request: %s", exc)
            return exc  # sending it again will not help
        except ModelFailure as exc:
            if attempt >= max_retries:
                log.warning("model failed after %s retries: %s", attempt, exc)
                return exc
            wait = backoff(attempt, exc)
            log.info("model failed (%s); retry %s in %.2fs", exc.code, attempt + 1, wait)
            if sleep(interrupt, wait):
                raise ModelInterrupted("interrupted while waiting to retry") from exc
            attempt += 1


def backoff_seconds(
    attempt: int, failure: ModelFailure, *, base_seconds: float, cap_seconds: float
) -> float:
    """The wait before the next try: the model service's ``retry-after`` (at most a day,
    as every retry's), else exponential with jitter up to ``cap_seconds``."""
    if isinstance(failure, ModelRateLimited) and failure.retry_after_seconds is not None:
        return min(failure.retry_after_seconds, float(MAX_RETRY_SECONDS))
    base = base_seconds * 2.0 ** min(attempt, 62)
    return min(cap_seconds, base * random.uniform(0.5, 1.0))


def sleep(interrupt: Interrupt, seconds: float) -> bool:
    """Wait ``seconds``; True (at once) if the turn is interrupted meanwhile."""
    woken = threading.Event()
    interrupt.on_interrupt(woken.set)
    return woken.wait(seconds)
