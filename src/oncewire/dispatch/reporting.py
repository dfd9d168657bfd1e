"""What the dispatcher counts and says: its stats, the log line of each attempt, the count of
what a store step recorded, and the warning about effects that wait for a kind no sink handles.

Nothing here decides an effect's state (:mod:`oncewire.dispatch.settling` does); these only
report decisions already taken, so they share the dispatcher's logger (``oncewire.dispatch``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oncewire.core.clock import Clock
from oncewire.dispatch.settling import Label, Verdict
from oncewire.storage.records import Claim, EffectState, Settlement

__all__ = ["DispatchStats", "count_settled", "say_attempt", "shown", "warn_waiting_kinds"]

log = logging.getLogger("oncewire.dispatch")

_KEYS_SHOWN = 20


@dataclass
class DispatchStats:
    """What one dispatcher did since it was built, counted per attempt and per claim."""

    claimed: int = 0
    done: int = 0
    rejected: int = 0
    not_sent: int = 0
    maybe_sent: int = 0
    dead: int = 0
    redeliveries: int = 0
    timeouts: int = 0  # attempts given up on after their attempt timeout
    errors: int = 0  # sinks that raised or answered something that is not an outcome
    undecodable: int = 0  # stored payloads that could not be read (sent to dead, never sent)
    not_started: int = 0  # claims handed back on stop before their sink was called
    abandoned: int = 0  # attempts still running when the grace period ended (left claimed)
    stale_refused: int = 0  # outcomes refused because the lease had moved on
    released: int = 0  # claims of dead or expired owners released by this dispatcher
    storage_errors: int = 0  # store calls that failed and were retried
    batches: int = 0
    by_state: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "by_state"}


def shown(keys: Sequence[str]) -> str:
    """Keys for a log line: the first few, and how many more."""
    more = f" and {len(keys) - _KEYS_SHOWN} more" if len(keys) > _KEYS_SHOWN else ""
    return ", ".join(keys[:_KEYS_SHOWN]) + more


def say_attempt(
    claim: Claim,
    verdict: Verdict,
    item: Settlement,
    started_at: float | None,
    finished_at: float,
) -> None:
    """One log line per attempt: an error for misuse, a warning for a failure, else info."""
    label = verdict.label
    if verdict.misuse or label is Label.UNDECODABLE:
        level = logging.ERROR
    elif verdict.result_error is not None:
        level = logging.WARNING
    else:
        level = logging.INFO
    if not log.isEnabledFor(level):
        return
    ms = (finished_at - started_at) * 1000.0 if started_at is not None else 0.0
    log.log(
        level,
        "attempt key=%s kind=%s attempt=%d redelivery=%s outcome=%s ms=%.1f -> %s%s",
        claim.key,
        claim.kind,
        item.attempt,
        "yes" if claim.redelivery else "no",
        label,
        ms,
        item.state,
        f": {item.last_error}" if item.last_error and level > logging.INFO else "",
        # The same facts as attributes, for structured logs (--log-format json).
        extra={
            "key": claim.key,
            "kind": claim.kind,
            "attempt": item.attempt,
            "redelivery": claim.redelivery,
            "outcome": str(label),
            "duration_ms": round(ms, 1),
            "state": str(item.state),
        },
    )


def count_settled(
    stats: DispatchStats, settlements: Sequence[Settlement], applied: Sequence[bool]
) -> None:
    """Count what one store step recorded, and say which outcomes it refused as stale."""
    for item, ok in zip(settlements, applied, strict=True):
        if not ok:
            stats.stale_refused += 1
            log.warning("outcome for effect %s refused: fence %s is stale", item.id, item.fence)
            continue
        stats.by_state[str(item.state)] = stats.by_state.get(str(item.state), 0) + 1
        if item.state is EffectState.DONE:
            stats.done += 1
        elif item.state is EffectState.REJECTED:
            stats.rejected += 1
        elif item.state is EffectState.DEAD:
            stats.dead += 1
        elif item.state is EffectState.UNCERTAIN:
            stats.maybe_sent += 1
        else:
            stats.not_sent += 1


def warn_waiting_kinds(
    waiting: Mapping[str, tuple[int, float]],
    *,
    handled: Sequence[str],
    warned: set[str],
    clock: Clock,
) -> None:
    """Once per kind (``warned`` remembers): effects wait for a kind none of ``handled`` is."""
    for kind, (count, oldest) in sorted(waiting.items()):
        if kind in handled or kind in warned:
            continue
        warned.add(kind)
        log.warning(
            "%d effect(s) of kind %r wait (the oldest accepted %.0fs ago), and no sink in "
            "this dispatcher handles %r (its sinks: %s)",
            count,
            kind,
            max(0.0, clock.now() - oldest),
            kind,
            ", ".join(handled),
        )
