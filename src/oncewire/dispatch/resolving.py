"""From a finished call to the settlements the next store step records.

The dispatcher's thread learns that a call finished (its sink returned or raised), timed out,
or never started; here that becomes one :class:`~oncewire.dispatch.settling.Verdict` per claim
(:func:`verdicts`), and each verdict a settlement (:func:`settle`), observed
(:mod:`oncewire.core.observe`) and counted and said (:mod:`oncewire.dispatch.reporting`) as it
is made. A timed-out call's sink is told, when it can be (:func:`cancel`). What to do with the
settlements (hold them for the next store step) and the claims (forget them) stays with the
dispatcher.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from oncewire.core.observe import ATTEMPT, LISTENERS, emit
from oncewire.dispatch import settling
from oncewire.dispatch.reporting import DispatchStats, count_attempt, shown
from oncewire.dispatch.retry import RetryPolicy
from oncewire.dispatch.runner import Call
from oncewire.dispatch.settling import Label, Verdict
from oncewire.storage.records import Claim, Settlement

__all__ = ["cancel", "settle", "verdicts"]

# The dispatcher's logger: an attempt's lines are the dispatcher's.
log = logging.getLogger("oncewire.dispatch")


def verdicts(call: Call, max_result_bytes: int) -> list[Verdict]:
    """What the sink of a finished ``call`` answered, one verdict per claim (a sink that
    raised: each of its attempts is uncertain, and the log says so)."""
    if call.error is not None:
        what = "batch sink" if call.batch else "sink"
        log.warning(
            "%s for %s raised on %s: %s", what, call.spec.kind, shown(call.keys), call.error
        )
        return [settling.raised(call.error, what)] * len(call.claims)
    if call.batch:
        return settling.read_batch(call.value, len(call.claims), max_result_bytes)
    return [settling.read_value(call.value, max_result_bytes)]


def cancel(call: Call) -> None:
    """Tell the sink of a timed-out ``call`` (its ``cancel(attempt)``, when it has one)."""
    if call.spec.cancel is None:
        return
    for attempt in call.attempts:
        try:
            call.spec.cancel(attempt)
        except Exception as exc:
            log.warning(
                "cancel(%r) of the sink for %s raised: %s", attempt.key, call.spec.kind, exc
            )


def settle(
    claims: Sequence[Claim],
    verdicts: Sequence[Verdict],
    call: Call | None,
    *,
    into: list[Settlement],
    policy: RetryPolicy,
    now: float,
    owner: str,
    stats: DispatchStats,
) -> None:
    """Turn each attempt's verdict into a settlement appended to ``into``, and say it in the
    log (every attempt at INFO, and what is not plainly ``done`` at any level)."""
    started_at = call.started_at if call is not None else None
    finished_at = now
    if call is not None and call.finished_at is not None:
        finished_at = call.finished_at
    info = log.isEnabledFor(logging.INFO)
    observed = bool(LISTENERS)
    for claim, verdict in zip(claims, verdicts, strict=True):
        item = settling.settlement(
            claim,
            verdict,
            policy=policy,
            now=now,
            attempt_number=claim.fence,
            started_at=started_at,
            finished_at=finished_at,
        )
        into.append(item)
        if observed:
            emit(ATTEMPT, settling.observed(claim, verdict, item, owner))
        if info or verdict.label is not Label.DONE or verdict.result_error is not None:
            count_attempt(stats, claim, verdict, item, started_at, finished_at)
