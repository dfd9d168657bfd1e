"""What the dispatcher counts and says: its stats, the log line of each attempt, the count of
what a store step recorded, the warning about effects that wait for a kind no sink handles, and
the periodic status line of ``oncewire dispatch``.

Nothing here decides an effect's state (:mod:`oncewire.dispatch.settling` does); these only
report decisions already taken, so they share the dispatcher's logger (``oncewire.dispatch``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from oncewire.core.clock import Clock
from oncewire.core.errors import OncewireError
from oncewire.dispatch.settling import Label, Verdict
from oncewire.storage.records import Backlog, Claim, EffectState, Settlement

__all__ = [
    "DispatchStats",
    "Status",
    "StatusSource",
    "count_attempt",
    "count_settled",
    "read_status",
    "say_attempt",
    "shown",
    "warn_waiting_kinds",
]

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


def count_attempt(
    stats: DispatchStats,
    claim: Claim,
    verdict: Verdict,
    item: Settlement,
    started_at: float | None,
    finished_at: float,
) -> None:
    """Count an attempt that failed, and say any attempt in the log (:func:`say_attempt`).
    The dispatcher skips the call for an attempt that is done, when INFO is off."""
    label = verdict.label
    if label is Label.TIMEOUT:
        stats.timeouts += 1
    elif label is Label.ERROR:
        stats.errors += 1
    elif label is Label.UNDECODABLE:
        stats.undecodable += 1
    say_attempt(claim, verdict, item, started_at, finished_at)


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


@dataclass(frozen=True)
class Status:
    """One status line: what this dispatcher settled since it started, and what the store holds
    for its kinds now (claimed by any worker, waiting for an attempt, the oldest one's age).

    The store's part is ``None`` when it could not be read: the line says so instead of
    showing numbers it does not have.
    """

    done: int
    retried: int  # attempts that ended not sent or maybe sent: the effect goes round again
    rejected: int
    dead: int
    redelivered: int  # attempts made as flagged redeliveries
    claimed: int | None = None
    waiting: int | None = None
    oldest_waiting_seconds: float | None = None
    store_error: str | None = None

    def line(self) -> str:
        settled = (
            f"since start: done {self.done}, retried {self.retried}, rejected {self.rejected}, "
            f"dead {self.dead}, redelivered {self.redelivered}"
        )
        if self.store_error is not None:
            return f"{settled}; store unreadable: {self.store_error}"
        oldest = (
            f" (oldest {self.oldest_waiting_seconds:.0f}s)"
            if self.oldest_waiting_seconds is not None
            else ""
        )
        return f"{settled}; now: in flight {self.claimed}, waiting {self.waiting}{oldest}"

    def fields(self) -> dict[str, Any]:
        found = {k: v for k, v in self.__dict__.items() if v is not None}
        if self.oldest_waiting_seconds is not None:
            found["oldest_waiting_seconds"] = round(self.oldest_waiting_seconds, 1)
        return found


class StatusSource(Protocol):
    """The two store reads a status line makes (the store a Ledger holds has both)."""

    def backlog(self, kinds: Sequence[str] | None = None) -> Backlog: ...

    def waiting_kinds(self) -> dict[str, tuple[int, float]]: ...


def read_status(
    stats: DispatchStats, store: StatusSource, kinds: Sequence[str], now: float
) -> Status:
    """A :class:`Status` from the dispatcher's counters and two small reads of the store: its
    backlog for ``kinds`` (how many are claimed) and the effects waiting per kind. A store that
    cannot be read is named on the line, with the counters still shown."""
    counted = Status(
        done=stats.done,
        retried=stats.not_sent + stats.maybe_sent,
        rejected=stats.rejected,
        dead=stats.dead,
        redelivered=stats.redeliveries,
    )
    try:
        backlog = store.backlog(kinds)
        waiting = store.waiting_kinds()
    except OncewireError as exc:
        return replace(counted, store_error=f"{type(exc).__name__}: {exc}")
    mine = [waiting[kind] for kind in kinds if kind in waiting]
    oldest = min((created for _, created in mine), default=None)
    return replace(
        counted,
        claimed=backlog.claimed,
        waiting=sum(count for count, _ in mine),
        oldest_waiting_seconds=None if oldest is None else max(0.0, now - oldest),
    )
