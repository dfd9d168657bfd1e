"""From what a sink did to how its claim is closed: reading answers, building settlements.

Pure logic, no I/O. A sink's answer is read into a :class:`Verdict` (what happened, by the
attempt history's vocabulary), and a verdict into a :class:`Settlement` (the effect's next
state). The rule above everything: nothing is recorded ``done`` unless a sink said so. A sink
that *returns* a value says it ran: ``Done(result)``, a :class:`~oncewire.receipts.ReceiptResult`
(what ``Receipts.run_once`` returns; a replayed one is noted in the attempt history) or any other
value is ``done``, its result stored when JSON can hold it within ``max_result_bytes`` and
"result not stored" (a WARNING) when it cannot. Only an answer that shows the work may not have
run as the caller meant (a coroutine or other awaitable that was never awaited, a generator, the
class ``NotSent`` instead of an instance, an exception instance) is a programming error: the
sink ran, so something may have happened, and the attempt is recorded ``uncertain``.
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oncewire.core.canonical import canonical_json
from oncewire.core.errors import OncewireError
from oncewire.core.limits import DEFAULT_MAX_RESULT_BYTES
from oncewire.dispatch.retry import RetryPolicy
from oncewire.effects.outcomes import OUTCOME_TYPES, Done, MaybeSent, NotSent, Rejected
from oncewire.receipts.service import ReceiptResult
from oncewire.storage.records import Claim, EffectState, Settlement

__all__ = [
    "MAX_TEXT_CHARS",
    "Label",
    "Verdict",
    "bounded",
    "observed",
    "read_batch",
    "read_value",
    "settlement",
]

MAX_TEXT_CHARS = 2000  # a rejection reason or an error stored in last_error, at most
# The attempt history's note for a receipt replayed instead of the work being done again.
REPLAYED = "replayed: the receiver's receipt from an earlier run; its work was not done again"


def bounded(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying that it was cut and by how much."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [cut: {len(text) - limit} more characters]"


class Label(enum.StrEnum):
    """What became of one attempt (``Settlement.outcome`` and the attempt history)."""

    DONE = "done"  # the sink said it happened
    NOT_SENT = "not_sent"  # nothing reached the receiver (or the sink was never called)
    MAYBE_SENT = "maybe_sent"  # the sink said it may have reached the receiver
    REJECTED = "rejected"  # the receiver refused it
    TIMEOUT = "timeout"  # the sink did not answer in time; it was cancelled or abandoned
    ERROR = "error"  # the sink raised, or answered something that is not an outcome
    UNDECODABLE = "undecodable"  # the stored payload cannot be read; the sink was not called


@dataclass(frozen=True, slots=True)
class Verdict:
    """One attempt's reading: its label, and what goes with it."""

    label: Label
    reason: str = ""
    result_json: str | None = None  # DONE: the stored result (None: JSON null or not storable)
    result_error: str | None = None  # DONE: why the result was not stored
    note: str | None = None  # DONE: said in the attempt history only (a replayed receipt)
    retry_after: float | None = None  # NOT_SENT: the receiver's wish
    misuse: bool = False  # a programming error in the sink (logged at ERROR)
    started: bool = True  # False: the sink was never called for this attempt


def _misuse(reason: str) -> Verdict:
    return Verdict(Label.ERROR, reason, misuse=True)


def _discard(value: Any) -> None:
    """Close a coroutine or generator nobody will run (no "never awaited" warning later)."""
    close = getattr(value, "close", None)
    if inspect.iscoroutine(value) or inspect.isgenerator(value) or inspect.isasyncgen(value):
        try:
            if inspect.isasyncgen(value):
                return  # aclose() is itself a coroutine; the generator never started
            if close is not None:
                close()
        except Exception:  # closing someone else's object must not hide the real error
            pass


def _not_an_outcome(value: Any) -> str | None:
    """Why ``value`` cannot be a sink's answer, or None when it may be a plain result."""
    if isinstance(value, type) and issubclass(value, OUTCOME_TYPES):
        return (
            f"sink returned the class {value.__name__}, not an outcome: "
            f"write {value.__name__}(...) with parentheses"
        )
    if isinstance(value, type):  # a class where its instance (or its call's answer) was meant
        return f"sink returned the class {value.__name__}, not a value: call it"
    if inspect.isroutine(value) or isinstance(value, functools.partial):
        name = getattr(value, "__qualname__", None) or type(value).__name__
        return f"sink returned the function {name} instead of calling it"
    if isinstance(value, BaseException):
        return (
            f"sink returned an exception instance ({type(value).__name__}: {value}) instead of "
            "raising it or returning an outcome"
        )
    if inspect.isawaitable(value):
        _discard(value)
        return (
            f"sink returned an awaitable ({type(value).__name__}) that was never awaited: "
            "declare the sink with async def so the dispatcher awaits it"
        )
    if inspect.isgenerator(value) or inspect.isasyncgen(value):
        _discard(value)
        return f"sink returned a generator ({type(value).__name__}), not an outcome"
    return None


# What a sink answers most: nothing (``None``, or ``Done()``), which is stored as JSON null.
_DONE_NULL = Verdict(Label.DONE, result_json="null")
# Exact builtin types that can only be a plain result: never an awaitable, a generator, an
# outcome class or an exception, so the careful look at the answer is not needed for them.
_PLAIN_TYPES = frozenset({dict, list, str, int, float, bool, tuple})


def _done(result: Any, max_bytes: int, note: str | None = None) -> Verdict:
    """The sink ran and answered ``result``: done, with the result stored if it can be."""
    try:
        stored = canonical_json(result, max_bytes=max_bytes)
        return Verdict(Label.DONE, result_json=stored, note=note)
    except OncewireError as exc:
        size = exc.fields.get("size_bytes")
        why = (
            f"its canonical JSON is {size} bytes; the limit is {max_bytes} (max_result_bytes)"
            if size is not None
            else str(exc)
        )
        error = bounded(f"result not stored: {type(result).__name__}: {why}")
        return Verdict(Label.DONE, result_error=error, note=note)


def read_value(value: Any, max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> Verdict:
    """A sink's answer for one attempt (a result bigger than ``max_result_bytes`` of canonical
    JSON is done, not stored)."""
    # The common answers first, by exact type; anything else gets the careful reading below.
    if value is None:
        return _DONE_NULL
    kind = type(value)
    if kind is Done:
        return _DONE_NULL if value.result is None else _done(value.result, max_result_bytes)
    if kind in _PLAIN_TYPES:
        return _done(value, max_result_bytes)
    if isinstance(value, Done):
        return _done(value.result, max_result_bytes)
    if isinstance(value, NotSent):
        return Verdict(Label.NOT_SENT, value.reason, retry_after=value.retry_after)
    if isinstance(value, MaybeSent):
        return Verdict(Label.MAYBE_SENT, value.reason)
    if isinstance(value, Rejected):
        return Verdict(Label.REJECTED, value.reason)
    if isinstance(value, ReceiptResult):  # the receiver's work committed, now or before
        return _done(value.result, max_result_bytes, REPLAYED if value.replayed else None)
    wrong = _not_an_outcome(value)
    if wrong is not None:
        return _misuse(wrong)
    return _done(value, max_result_bytes)  # any other value: the sink ran and answered it


def read_batch(
    values: Any, count: int, max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
) -> list[Verdict]:
    """``call_batch``'s answer: exactly one outcome per attempt, in order, as a list or tuple.

    Anything else (a dict, a set, a string, an iterator of unknown length, a list of the wrong
    length) is refused for every attempt of the batch, with the mismatch named; the batch sink
    did run, so each attempt is recorded ``uncertain``.
    """
    if not isinstance(values, list | tuple):
        wrong = _not_an_outcome(values)
        if wrong is None:
            wrong = (
                f"call_batch returned a {type(values).__name__}; it must return a list with one "
                "outcome per attempt, in the order of the attempts"
            )
        return [_misuse(wrong.replace("sink returned", "call_batch returned"))] * count
    if len(values) != count:
        reason = (
            f"call_batch returned {len(values)} outcome(s) for {count} attempt(s); it must "
            "return exactly one per attempt, in order"
        )
        for value in values:
            _discard(value)
        return [_misuse(reason)] * count
    return [read_value(value, max_result_bytes) for value in values]


def raised(exc: BaseException, what: str = "sink") -> Verdict:
    """The sink raised: it may have acted before raising, so we cannot know."""
    return Verdict(Label.ERROR, bounded(f"{what} raised {type(exc).__name__}: {exc}"))


def timed_out(seconds: float) -> Verdict:
    return Verdict(Label.TIMEOUT, f"attempt timed out after {seconds:g}s; the outcome is unknown")


def undecodable(exc: BaseException) -> Verdict:
    return Verdict(
        Label.UNDECODABLE,
        bounded(f"undecodable payload, never sent (the sink was not called): {exc}"),
    )


def not_started(reason: str) -> Verdict:
    return Verdict(Label.NOT_SENT, reason, started=False)


def settlement(
    claim: Claim,
    verdict: Verdict,
    *,
    policy: RetryPolicy,
    now: float,
    attempt_number: int,
    started_at: float | None,
    finished_at: float,
) -> Settlement:
    """How to close ``claim`` after ``verdict``.

    A not-sent attempt (the sink said ``NotSent``, or it was never called) gives its attempt
    back: it does not count against ``max_attempts``. The store counts not-sent attempts in a
    row (a charged attempt or an operator's retry starts the count again); without a deadline,
    ``policy.max_not_sent`` of them in a row make it ``dead``.
    """
    label = verdict.label
    if label is Label.DONE:  # the common case, spelled out: no dictionaries to merge
        return Settlement(
            claim.id,
            claim.fence,
            EffectState.DONE,
            verdict.result_json,
            verdict.result_error,
            attempt=attempt_number,
            note=verdict.note,
            redelivery=claim.redelivery,
            outcome="done",
            started_at=started_at,
            finished_at=finished_at,
        )
    facts: dict[str, Any] = {
        "attempt": attempt_number,
        "redelivery": claim.redelivery,
        "outcome": str(verdict.label),
        "started_at": started_at,
        "finished_at": finished_at,
    }
    ids = (claim.id, claim.fence)
    reason = bounded(verdict.reason)
    if label is Label.REJECTED:
        return Settlement(*ids, EffectState.REJECTED, None, reason, **facts)
    if label is Label.UNDECODABLE:
        return Settlement(*ids, EffectState.DEAD, None, reason, **facts)
    if label is Label.NOT_SENT:
        refund = {"refund_attempt": True, **facts}
        if not verdict.started:  # due again at once, where it was in the line
            return Settlement(*ids, EffectState.PENDING, None, reason, **refund)
        not_sent = claim.not_sent + 1  # in a row, counting this one
        not_before = now + policy.delay(not_sent, verdict.retry_after)
        if claim.deadline is not None:
            if not_before > claim.deadline:
                why = f"deadline would pass before the next attempt: {reason}"
                return Settlement(*ids, EffectState.DEAD, None, bounded(why), **refund)
        elif not_sent >= policy.max_not_sent:
            why = f"never sent: not sent {not_sent} times, the last: {reason}"
            return Settlement(*ids, EffectState.DEAD, None, bounded(why), **refund)
        return Settlement(*ids, EffectState.PENDING, None, reason, not_before, **refund)
    # MAYBE_SENT, TIMEOUT, ERROR: the attempt may have landed and counts.
    unknown = "; the outcome of the last attempt is unknown"
    if claim.attempt >= claim.max_attempts:
        why = f"out of attempts ({claim.attempt}): {reason}{unknown}"
        return Settlement(*ids, EffectState.DEAD, None, bounded(why), maybe_sent=True, **facts)
    not_before = now + policy.delay(claim.attempt)
    if claim.deadline is not None and not_before > claim.deadline:
        why = f"deadline would pass before the next attempt: {reason}{unknown}"
        return Settlement(*ids, EffectState.DEAD, None, bounded(why), maybe_sent=True, **facts)
    return Settlement(
        *ids, EffectState.UNCERTAIN, None, reason, not_before, maybe_sent=True, **facts
    )


def batch_reasons(verdicts: Sequence[Verdict]) -> list[str]:
    """The programming errors among ``verdicts`` (for one ERROR line per batch)."""
    return sorted({v.reason for v in verdicts if v.misuse})


def observed(claim: Claim, verdict: Verdict, item: Settlement, owner: str) -> dict[str, Any]:
    """An attempt's observation (``oncewire.core.observe.ATTEMPT``): what the sink did and
    the settlement the dispatcher is about to record for it."""
    return {
        "key": claim.key,
        "kind": claim.kind,
        "outcome": str(verdict.label),
        "state": str(item.state),
        "redelivery": claim.redelivery,
        "attempt": claim.fence,
        "fence": claim.fence,
        "started": verdict.started,
        "started_at": item.started_at,
        "finished_at": item.finished_at,
        "reason": verdict.reason,
        "owner": owner,
        "traceparent": claim.traceparent,
    }
