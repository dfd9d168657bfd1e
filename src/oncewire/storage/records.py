"""The records the store speaks in. Frozen: a record is a snapshot of a row, not a handle."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oncewire.core.canonical import loads
from oncewire.core.errors import InvalidPayload, InvalidState

__all__ = [
    "ATTEMPT_COLUMNS",
    "EFFECT_COLUMNS",
    "RECEIPT_COLUMNS",
    "TERMINAL_STATES",
    "AttemptRecord",
    "Backlog",
    "Claim",
    "Effect",
    "EffectState",
    "Receipt",
    "Settlement",
    "UndecodableText",
    "attempt_error",
    "attempt_outcome",
    "cancelled_attempt",
]


class EffectState(enum.StrEnum):
    """Where an effect stands in the outbox; done, rejected, dead and cancelled are terminal."""

    PENDING = "pending"  # accepted, waiting for its not_before; never attempted or NotSent
    CLAIMED = "claimed"  # leased to one worker, whose attempt is in flight
    UNCERTAIN = "uncertain"  # an attempt may have landed (MaybeSent, lost lease, crash)
    DONE = "done"  # the sink reported it happened; result stored
    REJECTED = "rejected"  # the receiver refused it; it never happened
    DEAD = "dead"  # out of attempts or past its deadline; last_error says which
    CANCELLED = "cancelled"  # an operator or the caller withdrew it


TERMINAL_STATES = frozenset(
    {EffectState.DONE, EffectState.REJECTED, EffectState.DEAD, EffectState.CANCELLED}
)


EFFECT_COLUMNS = (
    "id, key, kind, payload, digest, state, attempts, max_attempts, not_before, deadline, fence, "
    "lease_owner, lease_expires_at, maybe_sent, result, last_error, created_at, updated_at, "
    "recoveries, started_fence"
)
RECEIPT_COLUMNS = "key, digest, payload, result, created_at, expires_at"
ATTEMPT_COLUMNS = (
    "effect_id, attempt, fence, owner, redelivery, outcome, state, error, started_at, finished_at"
)

# The attempt history's outcome of a settlement that does not name one, by the state it sets.
_OUTCOME_BY_STATE = {"uncertain": "maybe_sent", "pending": "not_sent"}


def cancelled_attempt(effect: Effect, reason: str, now: float) -> tuple[Any, ...]:
    """The attempt-history row (effect_id, attempt, fence, owner, redelivery, error,
    finished_at) of a claimed effect that is being cancelled, read before the cancel."""
    return (
        effect.id,
        effect.attempts,
        effect.fence,
        effect.lease_owner,
        effect.maybe_sent,
        reason,
        now,
    )


def attempt_outcome(settlement: Settlement) -> str:
    """What the attempt history records as the outcome of ``settlement``."""
    state = str(settlement.state)
    return settlement.outcome or _OUTCOME_BY_STATE.get(state, state)


def attempt_error(settlement: Settlement) -> str | None:
    """What the attempt history records in its ``error`` column for ``settlement``: the
    effect's ``last_error``, then the settlement's ``note``."""
    error, note = settlement.last_error, settlement.note
    if note is None:
        return error
    return note if error is None else f"{error}; {note}"


@dataclass(frozen=True, slots=True)
class Effect:
    """One accepted intent to change the world."""

    id: int
    key: str
    kind: str
    payload_json: str
    digest: str
    state: EffectState
    attempts: int
    max_attempts: int
    not_before: float
    deadline: float | None
    fence: int
    lease_owner: str | None
    lease_expires_at: float | None
    maybe_sent: bool  # some earlier attempt may have landed: later attempts are redeliveries
    result_json: str | None
    last_error: str | None
    created_at: float
    updated_at: float
    # How many times an owner died (or lost its lease) while this effect's sink ran: bounded
    # apart from max_attempts, and an effect with any is claimed alone.
    recoveries: int = 0
    # The fence of the last claim whose sink call was recorded as starting (0: none).
    started_fence: int = 0

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Effect:
        """A row selected as :data:`EFFECT_COLUMNS`, on any backend."""
        return cls(*[*row[:5], EffectState(row[5]), *row[6:13], bool(row[13]), *row[14:20]])

    @property
    def payload(self) -> Any:
        return loads(self.payload_json)

    @property
    def result(self) -> Any:
        return None if self.result_json is None else loads(self.result_json)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def check_cancellable(self) -> None:
        """Only a non-terminal effect can be cancelled (the rule every backend applies)."""
        if self.terminal:
            raise InvalidState(
                f"effect {self.key!r} is already {self.state}; only a non-terminal effect can "
                "be cancelled",
                key=self.key,
                state=str(self.state),
            )

    def check_retryable(self) -> None:
        """Only a dead, rejected or cancelled effect can be retried."""
        if self.state not in TERMINAL_STATES - {EffectState.DONE}:
            raise InvalidState(
                f"effect {self.key!r} is {self.state}; only a dead, rejected or cancelled "
                "effect can be retried",
                key=self.key,
                state=str(self.state),
            )

    def as_dict(self) -> dict[str, Any]:
        """The effect as JSON-ready data. A stored payload or result that does not decode
        (written by hand, by an older version, nested too deeply) is ``None`` with a
        ``payload_error`` / ``result_error`` saying why, instead of failing the whole read."""
        payload, payload_error = _decoded(self.payload_json, "payload")
        result, result_error = _decoded(self.result_json, "result")
        data = {
            "id": self.id,
            "key": self.key,
            "kind": self.kind,
            "payload": payload,
            "digest": self.digest,
            "state": str(self.state),
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "recoveries": self.recoveries,
            "not_before": self.not_before,
            "deadline": self.deadline,
            "fence": self.fence,
            "lease_owner": self.lease_owner,
            "lease_expires_at": self.lease_expires_at,
            "maybe_sent": self.maybe_sent,
            "result": result,
            "last_error": self.last_error,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }
        if payload_error is not None:
            data["payload_error"] = payload_error
        if result_error is not None:
            data["result_error"] = result_error
        return data


@dataclass(frozen=True, slots=True)
class Claim:
    """An effect leased to a worker for one attempt."""

    id: int
    key: str
    kind: str
    payload_json: str
    attempt: int  # 1-based attempt number, counting this one
    max_attempts: int
    fence: int
    redelivery: bool
    deadline: float | None
    lease_expires_at: float
    not_sent: int = 0  # not-sent attempts in a row before this one
    traceparent: str | None = None  # the W3C trace context the effect was accepted under
    recoveries: int = 0  # owners that died while its sink ran: such a claim is claimed alone
    started: bool = True  # recorded as starting: its sink may be called now

    @classmethod
    def from_row(cls, row: Sequence[Any], lease_expires_at: float) -> Claim:
        """A row returned by a claim as ``id, key, kind, payload, attempts, max_attempts, fence,
        maybe_sent, deadline, not_sent, traceparent, recoveries, started_fence``, on any
        backend."""
        started = row[12] == row[6]
        return cls(*[*row[:7], bool(row[7]), row[8], lease_expires_at, *row[9:12], started])


@dataclass(frozen=True, slots=True)
class Settlement:
    """How to close one claimed attempt: the new state and what to write with it.

    The store applies it only if the effect is still claimed under ``fence``.
    """

    id: int
    fence: int
    state: EffectState
    result_json: str | None = None
    last_error: str | None = None
    not_before: float | None = None
    maybe_sent: bool = False
    # Give the claim's attempt back (attempts - 1): nothing was sent (NotSent, or the sink was
    # never called), so it does not count against max_attempts.
    refund_attempt: bool = False
    # What the attempt history records about the attempt this settlement closes.
    attempt: int = 0  # the attempt number being closed (0: not known to the caller)
    redelivery: bool = False  # the attempt was flagged a redelivery
    outcome: str = ""  # done, not_sent, maybe_sent, rejected, timeout, error, undecodable
    started_at: float | None = None  # when the sink was called
    finished_at: float | None = None  # when it returned (or was given up on)
    note: str | None = None  # said in the attempt history only (a replayed receipt)


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One row of an effect's attempt history: one call of its sink, or one claim lost.

    Written in the same transaction as the settlement (or the release of a claim whose owner
    died or whose lease expired), so a recovered crash stays visible afterwards.
    """

    effect_id: int
    attempt: int
    fence: int
    owner: str | None
    redelivery: bool
    outcome: str  # as Settlement.outcome, or lease_expired / owner_died for a released claim
    state: EffectState  # the effect's state after this attempt was recorded
    error: str | None
    started_at: float | None
    finished_at: float

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> AttemptRecord:
        """A row selected as :data:`ATTEMPT_COLUMNS`, on any backend."""
        return cls(*[*row[:4], bool(row[4]), row[5], EffectState(row[6]), *row[7:10]])

    @property
    def duration_ms(self) -> float | None:
        if self.started_at is None:
            return None
        return max(0.0, (self.finished_at - self.started_at) * 1000.0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "effect_id": self.effect_id,
            "attempt": self.attempt,
            "fence": self.fence,
            "owner": self.owner,
            "redelivery": self.redelivery,
            "outcome": self.outcome,
            "state": str(self.state),
            "error": self.error,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration_ms": self.duration_ms,
        }


@dataclass(frozen=True, slots=True)
class Backlog:
    """What is left to do, as a dispatcher deciding whether it is idle sees it."""

    next_due: float | None  # earliest not_before of a pending or uncertain effect
    uncertain: int  # effects whose last attempt may have landed
    claimed: int  # effects leased to some worker right now
    retrying: int  # pending effects already attempted at least once (a retry is scheduled)
    # earliest not_before of an uncertain effect or a retrying one (None: no retry waits)
    next_retry: float | None = None


@dataclass(frozen=True, slots=True)
class Receipt:
    """The receiver's durable record: key -> payload digest -> result."""

    key: str
    digest: str
    payload_json: str
    result_json: str | None
    created_at: float
    expires_at: float | None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Receipt:
        """A row selected as :data:`RECEIPT_COLUMNS`, on any backend."""
        return cls(*row[:6])

    @property
    def result(self) -> Any:
        return None if self.result_json is None else loads(self.result_json)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready data; an undecodable payload or result is ``None`` with an ``*_error``."""
        payload, payload_error = _decoded(self.payload_json, "payload")
        result, result_error = _decoded(self.result_json, "result")
        data = {
            "key": self.key,
            "digest": self.digest,
            "payload": payload,
            "result": result,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
        }
        if payload_error is not None:
            data["payload_error"] = payload_error
        if result_error is not None:
            data["result_error"] = result_error
        return data


class UndecodableText(str):
    """A stored text that was not valid UTF-8, shown with replacement characters."""

    __slots__ = ()


def _decoded(text: str | None, what: str) -> tuple[Any, str | None]:
    """(value, None), or (None, why) when the stored text does not decode.

    Readers show one bad row as such instead of failing for the whole store. ``loads`` raises
    InvalidPayload; RecursionError (how deep it gets first depends on the process's recursion
    limit) and any ValueError are caught too, so that no limit setting turns a read into a crash.
    """
    if text is None:
        return None, None
    if isinstance(text, UndecodableText):
        return None, f"undecodable {what}: the stored text is not valid UTF-8"
    try:
        return loads(text), None
    except (InvalidPayload, RecursionError, ValueError, TypeError) as exc:
        detail = str(exc) or type(exc).__name__
        return None, f"undecodable {what}: {detail[:200]}"
