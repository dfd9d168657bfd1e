"""The dispatcher: claim due effects, call their sinks, record typed outcomes.

One loop iteration is one store transaction that settles the attempts just finished and claims
the next batch, so a steady stream costs one commit per batch. A claim is durable before its
sink is called: if this process dies mid-call, the claim says so, and the next attempt is
flagged a redelivery. A dispatcher recognises a dead owner on the same host (pid and start time)
at once, and any other owner when its lease runs out.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from oncewire.core import crash
from oncewire.core.canonical import canonical_json, loads
from oncewire.core.clock import Clock
from oncewire.core.errors import ConfigurationError, OncewireError, SchemaError, StorageError
from oncewire.core.ids import owner_is_dead_locally, this_process_owner
from oncewire.dispatch.retry import RetryPolicy
from oncewire.effects.attempt import Attempt
from oncewire.effects.ledger import Ledger
from oncewire.effects.outcomes import Done, MaybeSent, NotSent, Outcome, Rejected
from oncewire.storage.records import Claim, EffectState, Settlement

__all__ = ["DispatchStats", "Dispatcher", "Sink"]

log = logging.getLogger("oncewire.dispatch")

Sink = Callable[[Attempt], Any]

AFTER_CLAIM = crash.register(
    "dispatch.after_claim", "a batch is claimed and committed; no sink has been called"
)
AFTER_SINK_BEFORE_RECORD = crash.register(
    "dispatch.after_sink_before_record",
    "a sink returned (the world may have changed); its outcome is not recorded",
)
AFTER_RECORD = crash.register(
    "dispatch.after_record", "outcomes are committed; the dispatcher has not moved on"
)


@dataclass
class DispatchStats:
    claimed: int = 0
    done: int = 0
    rejected: int = 0
    not_sent: int = 0
    maybe_sent: int = 0
    dead: int = 0
    redeliveries: int = 0
    stale_refused: int = 0  # outcomes refused because the lease had moved on
    released: int = 0  # claims of dead or expired owners released by this dispatcher
    storage_errors: int = 0  # store calls that failed and were retried
    batches: int = 0
    by_state: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "by_state"}


def _to_outcome(value: Any) -> Outcome:
    if isinstance(value, Done | NotSent | MaybeSent | Rejected):
        return value
    return Done(value)


class Dispatcher:
    """``Dispatcher(ledger, sinks={"charge": charge_card}).run()``."""

    def __init__(
        self,
        ledger: Ledger,
        sinks: Mapping[str, Sink],
        *,
        batch_size: int = 32,
        concurrency: int = 1,
        lease_seconds: float = 30.0,
        poll_seconds: float = 0.5,
        retry: RetryPolicy | None = None,
        owner: str | None = None,
        storage_patience_seconds: float = 60.0,
    ) -> None:
        if not sinks:
            raise ConfigurationError("a dispatcher needs at least one sink")
        if batch_size < 1 or concurrency < 1:
            raise ConfigurationError("batch_size and concurrency must be at least 1")
        if not (0 < lease_seconds < math.inf and 0 < poll_seconds < math.inf):
            raise ConfigurationError("lease_seconds and poll_seconds must be positive and finite")
        self.ledger = ledger
        self.sinks = dict(sinks)
        self.kinds = sorted(self.sinks)
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.retry = retry or RetryPolicy()
        self.owner = owner or this_process_owner()
        self.storage_patience_seconds = storage_patience_seconds
        self.stats = DispatchStats()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._inflight: dict[int, int] = {}  # effect id -> fence, for lease renewal
        self._inflight_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    # -- control -----------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop after the attempts in flight are recorded."""
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        """Look for due work now instead of at the next poll."""
        self._wake.set()

    @property
    def clock(self) -> Clock:
        return self.ledger.clock

    # -- the loop ----------------------------------------------------------------------------
    def run(self, *, until_idle: bool = False, handle_signals: bool = True) -> DispatchStats:
        """Dispatch until stopped (SIGTERM/SIGINT stop gracefully) or, with ``until_idle``,
        until nothing is due, uncertain, claimed or waiting for a retry."""
        self._stop.clear()
        restore = self._install_signals() if handle_signals else None
        heartbeat = threading.Thread(target=self._heartbeat, name="oncewire-lease", daemon=True)
        heartbeat.start()
        unsubscribe = self.ledger.store.subscribe(self.wake)
        if self.concurrency > 1:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="oncewire-sink")
        try:
            self._loop(until_idle)
        finally:
            self._stop.set()
            unsubscribe()
            heartbeat.join(timeout=5)
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            if restore is not None:
                restore()
        return self.stats

    def _loop(self, until_idle: bool) -> None:
        settlements: list[Settlement] = []
        last_reap = -float("inf")
        # Reaping is cheap (a read of the lease holders, an update that usually matches nothing)
        # and bounds how long a dead peer's claims wait: at most a second on the same host.
        reap_every = min(self.lease_seconds / 2, 1.0)
        failing_since: float | None = None
        while True:
            try:
                if time.monotonic() - last_reap >= reap_every:
                    self._reap()
                    last_reap = time.monotonic()
                settlements, done = self._step(settlements, until_idle)
                failing_since = None
                if done:
                    return
                if settlements:
                    continue
                if until_idle:
                    if self._reap():
                        continue
                    if self._idle():
                        return
                self._sleep_until_due()
            except StorageError as exc:
                # The database went away (restart, failover, network). Outcomes not yet
                # recorded are kept and retried: they are fenced, so a retry after a commit
                # whose answer was lost is refused rather than applied twice.
                if isinstance(exc, SchemaError):
                    raise
                now = time.monotonic()
                failing_since = failing_since or now
                self.stats.storage_errors += 1
                if now - failing_since > self.storage_patience_seconds:
                    raise
                delay = min(2.0, 0.05 * 2 ** min(self.stats.storage_errors, 6))
                log.warning("store unavailable (%s); retrying in %.2fs", exc, delay)
                if self._stop.wait(delay) and not settlements:
                    return

    def _step(
        self, settlements: list[Settlement], until_idle: bool
    ) -> tuple[list[Settlement], bool]:
        """Record ``settlements`` and claim the next batch in one transaction; attempt it.

        Returns the new settlements to record and whether the loop is finished.
        """
        stopping = self._stop.is_set()
        applied, claims = self.ledger.store.settle_and_claim(
            settlements,
            owner=self.owner,
            now=self.clock.now(),
            lease_seconds=self.lease_seconds,
            limit=0 if stopping else self.batch_size,
            kinds=self.kinds,
        )
        if settlements:
            self._count_settled(settlements, applied)
            AFTER_RECORD.hit()
        if stopping:
            return [], True
        if not claims:
            return [], False
        self.stats.batches += 1
        self.stats.claimed += len(claims)
        AFTER_CLAIM.hit()
        return self._attempt(claims), False

    def _attempt(self, claims: Sequence[Claim]) -> list[Settlement]:
        with self._inflight_lock:
            for claim in claims:
                self._inflight[claim.id] = claim.fence
        try:
            outcomes: list[Outcome | None] = [None] * len(claims)
            singles: list[int] = []
            batches: dict[str, list[int]] = {}
            by_kind: dict[str, list[int]] = {}
            for index, claim in enumerate(claims):
                by_kind.setdefault(claim.kind, []).append(index)
            for kind, indexes in by_kind.items():
                if len(indexes) > 1 and hasattr(self.sinks[kind], "call_batch"):
                    batches[kind] = indexes
                else:
                    singles.extend(indexes)
            singles.sort()
            for kind, indexes in batches.items():
                for index, outcome in zip(
                    indexes, self._call_batch(kind, [claims[i] for i in indexes]), strict=True
                ):
                    outcomes[index] = outcome
            if self._pool is not None and len(singles) > 1:
                results = self._pool.map(self._call, [claims[i] for i in singles])
            else:
                results = map(self._call, [claims[i] for i in singles])
            for index, outcome in zip(singles, results, strict=True):
                outcomes[index] = outcome
        finally:
            with self._inflight_lock:
                for claim in claims:
                    self._inflight.pop(claim.id, None)
        AFTER_SINK_BEFORE_RECORD.hit()
        now = self.clock.now()
        return [
            self._settlement(claim, outcome or MaybeSent("no outcome"), now)
            for claim, outcome in zip(claims, outcomes, strict=True)
        ]

    def _attempt_of(self, claim: Claim) -> Attempt:
        if claim.redelivery:
            self.stats.redeliveries += 1
        return Attempt(
            key=claim.key,
            kind=claim.kind,
            payload=loads(claim.payload_json),
            attempt=claim.attempt,
            redelivery=claim.redelivery,
            fence=claim.fence,
            deadline=claim.deadline,
        )

    def _call(self, claim: Claim) -> Outcome:
        attempt = self._attempt_of(claim)
        try:
            return _to_outcome(self.sinks[claim.kind](attempt))
        except Exception as exc:  # the sink may have acted before raising: we cannot know
            log.warning("sink for %s raised on %r: %s", claim.kind, claim.key, exc)
            return MaybeSent(f"sink raised {type(exc).__name__}: {exc}")

    def _call_batch(self, kind: str, claims: Sequence[Claim]) -> list[Outcome]:
        """One call of a batch sink (``sink.call_batch(attempts)``) for every claim of a kind."""
        attempts = [self._attempt_of(claim) for claim in claims]
        try:
            values = list(self.sinks[kind].call_batch(attempts))  # type: ignore[attr-defined]
        except Exception as exc:
            log.warning("batch sink for %s raised on %d attempts: %s", kind, len(attempts), exc)
            return [MaybeSent(f"batch sink raised {type(exc).__name__}: {exc}")] * len(attempts)
        if len(values) != len(attempts):
            reason = f"batch sink returned {len(values)} outcomes for {len(attempts)} attempts"
            return [MaybeSent(reason)] * len(attempts)
        return [_to_outcome(value) for value in values]

    def _settlement(self, claim: Claim, outcome: Outcome, now: float) -> Settlement:
        if isinstance(outcome, Done):
            try:
                return Settlement(
                    claim.id, claim.fence, EffectState.DONE, canonical_json(outcome.result)
                )
            except OncewireError as exc:
                return Settlement(
                    claim.id, claim.fence, EffectState.DONE, None, f"result not stored: {exc}"
                )
        if isinstance(outcome, Rejected):
            return Settlement(claim.id, claim.fence, EffectState.REJECTED, None, outcome.reason)
        maybe = isinstance(outcome, MaybeSent)
        reason = outcome.reason
        unknown = "; the outcome of the last attempt is unknown" if maybe else ""
        if claim.attempt >= claim.max_attempts:
            return Settlement(
                claim.id,
                claim.fence,
                EffectState.DEAD,
                None,
                f"out of attempts ({claim.attempt}): {reason}{unknown}",
                maybe_sent=maybe,
            )
        retry_after = outcome.retry_after if isinstance(outcome, NotSent) else None
        not_before = now + self.retry.delay(claim.attempt, retry_after)
        if claim.deadline is not None and not_before > claim.deadline:
            return Settlement(
                claim.id,
                claim.fence,
                EffectState.DEAD,
                None,
                f"deadline would pass before the next attempt: {reason}{unknown}",
                maybe_sent=maybe,
            )
        state = EffectState.UNCERTAIN if maybe else EffectState.PENDING
        return Settlement(claim.id, claim.fence, state, None, reason, not_before, maybe_sent=maybe)

    def _count_settled(self, settlements: Sequence[Settlement], applied: Sequence[bool]) -> None:
        for item, ok in zip(settlements, applied, strict=True):
            if not ok:
                self.stats.stale_refused += 1
                log.warning("outcome for effect %s refused: fence %s is stale", item.id, item.fence)
                continue
            self.stats.by_state[str(item.state)] = self.stats.by_state.get(str(item.state), 0) + 1
            if item.state is EffectState.DONE:
                self.stats.done += 1
            elif item.state is EffectState.REJECTED:
                self.stats.rejected += 1
            elif item.state is EffectState.DEAD:
                self.stats.dead += 1
            elif item.state is EffectState.UNCERTAIN:
                self.stats.maybe_sent += 1
            else:
                self.stats.not_sent += 1

    # -- recovery and waiting ----------------------------------------------------------------
    def _reap(self) -> int:
        store = self.ledger.store
        now = self.clock.now()
        dead = [
            owner
            for owner in store.lease_holders()
            if owner != self.owner and owner_is_dead_locally(owner)
        ]
        released = store.release_claims(now=now, dead_owners=dead)
        released += store.expire_deadlines(now)
        if released:
            log.info("released %d claim(s) (dead owners: %s)", released, dead or "none")
            self.stats.released += released
        return released

    def _idle(self) -> bool:
        """Nothing due, uncertain, claimed or waiting for a retry.

        A pending effect whose first attempt is scheduled later (``delay_seconds``) does not
        keep ``run(until_idle=True)`` waiting; a retry already under way does.
        """
        backlog = self.ledger.store.backlog(self.kinds)
        if backlog.claimed or backlog.uncertain or backlog.retrying:
            return False
        return backlog.next_due is None or backlog.next_due > self.clock.now()

    def _sleep_until_due(self) -> None:
        next_due = self.ledger.store.backlog(self.kinds).next_due
        wait = self.poll_seconds
        if next_due is not None:
            wait = min(wait, max(0.0, next_due - self.clock.now()))
        if wait > 0:
            self.clock.wait(self._wake, wait)
        self._wake.clear()

    def _heartbeat(self) -> None:
        interval = self.lease_seconds / 3
        while not self._stop.wait(interval):
            with self._inflight_lock:
                fences = list(self._inflight.items())
            if not fences:
                continue
            now = self.clock.now()
            try:
                self.ledger.store.renew_leases(self.owner, fences, now + self.lease_seconds, now)
            except OncewireError as exc:
                log.warning("lease renewal failed: %s", exc)

    def _install_signals(self) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: stopping after the attempts in flight", signum)
            self.stop()

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore
