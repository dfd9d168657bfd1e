"""The dispatcher: claim due effects, call their sinks, record typed outcomes.

One store transaction settles the attempts that finished and claims the next batch, so a steady
stream costs about one commit per batch. A claim is recorded as starting before its sink is
called (:mod:`oncewire.dispatch.marking`: a wave at a time, in those same commits): if this
process dies mid-call, the store knows which sinks may have run; their next attempts are flagged
redeliveries and count a recovery, and the claims whose sinks never ran go back as they were.
A dispatcher recognises a dead owner on the same host (pid and start time) at once, and any
other owner when its lease runs out.

Sinks never run on the dispatcher's thread (:mod:`oncewire.dispatch.runner`): plain sinks run in
worker threads, ``async def`` sinks on the dispatcher's event loop. Each outcome is recorded
soon after its sink returns, not when its whole batch does: what finished is recorded together,
once nothing else is about to finish (``SETTLE_LINGER_SECONDS``), so a hung sink never holds its
neighbours' outcomes and a batch of fast sinks still costs one commit.

How it stops (grace period, signals) is in :mod:`oncewire.dispatch.stopping`; what it counts
and says (stats, a log line per attempt) in :mod:`oncewire.dispatch.reporting`. Each batch
claimed, each claim released and each attempt's outcome is observed
(:mod:`oncewire.core.observe`) on the dispatcher's thread, when it learns of it.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from oncewire.core import crash
from oncewire.core.clock import Clock
from oncewire.core.errors import ConfigurationError, StorageError
from oncewire.core.ids import this_process_owner
from oncewire.core.limits import DEFAULT_MAX_RESULT_BYTES, check_max_result_bytes, check_seconds
from oncewire.core.observe import CLAIMED, LISTENERS, RELEASED, emit
from oncewire.dispatch import leases, marking, resolving, settling
from oncewire.dispatch.outage import Outage, check_patience
from oncewire.dispatch.reporting import (
    DispatchStats,
    count_settled,
    shown,
    warn_waiting_kinds,
)
from oncewire.dispatch.retry import DEFAULT_IDLE_HORIZON_SECONDS, RetryPolicy, drained
from oncewire.dispatch.runner import Call, SinkRunner, attempt_of, form_calls
from oncewire.dispatch.settling import Verdict
from oncewire.dispatch.sinkspec import SinkSpec, check_ledger, inspect_sinks
from oncewire.dispatch.stopping import (
    abandon_running,
    check_grace,
    install_signals,
    say_left,
    say_stopping,
)
from oncewire.effects.attempt import Attempt
from oncewire.ledger import Ledger
from oncewire.storage import EffectStore
from oncewire.storage.records import Claim, Settlement

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

# How long finished outcomes may wait for their neighbours before they are recorded anyway.
SETTLE_LINGER_SECONDS = 0.02
# How often the dispatcher looks for waiting effects of kinds it has no sink for.
WAITING_KINDS_EVERY_SECONDS = 60.0


class Dispatcher:
    """``Dispatcher(ledger, sinks={"charge": charge_card}).run()``, ``ledger`` a
    :class:`~oncewire.Ledger` (anything else is a ``WrongType``, a ``TypeError``).

    ``sinks`` maps an effect kind to a sink: a callable taking an :class:`Attempt`, an object
    with ``call_batch(attempts)`` returning a list with one outcome per attempt in order, or
    both; either may be ``async def`` (awaited on the dispatcher's event loop, ``concurrency``
    coroutines in flight). Sinks are checked here: anything else is a ``ConfigurationError``.

    What a sink answers decides the effect's next state (docs/dispatch.md has the table).
    ``Done``, a ``ReceiptResult`` (what ``Receipts.run_once`` returns) or any other value it
    returns is ``done``, its result stored when JSON holds it within ``max_result_bytes`` (else
    "result not stored", a WARNING); ``Rejected`` is ``rejected``; ``MaybeSent``, a sink that
    raises, a timeout, or an answer that shows the work may not have run (a coroutine never
    awaited, a generator, the class ``NotSent``, an exception instance) is ``uncertain`` and
    counts against ``max_attempts``. ``NotSent`` is ``pending`` and does **not** count: it is
    bounded by the effect's deadline, or else by ``RetryPolicy.max_not_sent`` in a row.

    ``attempt_timeout`` (seconds, None: no limit) bounds one sink call; ``attempt_timeouts``
    overrides it per kind. A timed-out attempt is recorded ``uncertain``: an ``async def`` sink
    is cancelled, a thread is abandoned (a new one takes its place), and a sink with
    ``cancel(attempt)`` is told (``SubprocessSink`` kills its child's process group).

    ``stop()`` (or SIGTERM/SIGINT when ``run`` handles signals) stops claiming, hands back the
    claims whose sinks were not called yet, and waits at most ``grace_seconds`` for the
    attempts in flight; attempts still running then are left claimed for recovery. A second
    signal leaves at once.

    ``recorded`` (None: nothing) is called on the dispatcher's thread after each commit that
    recorded outcomes, so that a caller in this process waiting for them reads them at once.

    ``claimable`` (None: every due effect of its kinds) is called on the dispatcher's thread
    before each claim and each reading of the backlog: only effects whose key it returns are
    claimed, and the rest of its kinds' effects are left alone (not claimed, not waited for), for
    a process that may perform only some of a kind's effects: an MCP proxy performs only the
    calls its own client waits for, with the server of its own session. A caller that adds a
    key calls :meth:`wake`, so that it is claimed at once.
    """

    def __init__(
        self,
        ledger: Ledger,
        sinks: Mapping[str, Any],
        *,
        batch_size: int = 32,
        concurrency: int = 1,
        lease_seconds: float = 30.0,
        poll_seconds: float = 0.5,
        retry: RetryPolicy | None = None,
        owner: str | None = None,
        storage_patience_seconds: float = 60.0,
        attempt_timeout: float | None = None,
        attempt_timeouts: Mapping[str, float | None] | None = None,
        grace_seconds: float = 30.0,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        recorded: Callable[[], None] | None = None,
        claimable: Callable[[], Collection[str]] | None = None,
    ) -> None:
        check_ledger(ledger)
        self._store: EffectStore = ledger.store  # the outbox's seam: no other verb is called
        self.specs: dict[str, SinkSpec] = inspect_sinks(
            sinks, attempt_timeout=attempt_timeout, attempt_timeouts=attempt_timeouts
        )
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
        self.storage_patience_seconds = check_patience(storage_patience_seconds)
        self.grace_seconds = check_grace(grace_seconds)
        self.max_result_bytes = check_max_result_bytes(max_result_bytes)
        self.stats = DispatchStats()
        self._recorded = recorded
        self._claimable = claimable
        self._stop = threading.Event()
        self._abort = threading.Event()
        self._finished_run = threading.Event()  # the heartbeat renews leases until this is set
        self._wake = threading.Event()
        self._woken = False  # set by wake(): the store says something committed
        self._inflight = leases.InFlight()  # the claims held, for the heartbeat's renewals
        self._runner: SinkRunner | None = None
        self._calls: dict[int, Call] = {}  # submitted and not yet resolved, by call id
        # Calls whose claims are not yet recorded as starting: held back from the runner until
        # a store step records them (marking.py says why and how many at a time).
        self._held = marking.Held(
            concurrency,
            batch_size,
            batching=any(spec.batch is not None for spec in self.specs.values()),
        )
        self._suspects = leases.Suspects()  # claims an owner died on: claimed alone
        self._finished: list[Settlement] = []  # resolved, not yet recorded
        self._first_finished: float | None = None  # time.monotonic() of the oldest of those
        self._warned_kinds: set[str] = set()
        self._timeouts = any(spec.timeout_seconds is not None for spec in self.specs.values())

    # -- control -----------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming; wait (at most the grace period) for the attempts in flight."""
        self._stop.set()
        self._poke()

    def abort(self) -> None:
        """Leave now: attempts in flight stay claimed, for recovery."""
        self._abort.set()
        self._stop.set()
        self._poke()

    def wake(self) -> None:
        """Look for due work now instead of at the next poll."""
        self._woken = True
        self._poke()

    def _poke(self) -> None:
        self._wake.set()
        runner = self._runner
        if runner is not None:
            runner.completions.put(None)

    @property
    def clock(self) -> Clock:
        return self.ledger.clock

    # -- the loop ----------------------------------------------------------------------------
    def run(
        self,
        *,
        until_idle: bool = False,
        handle_signals: bool = True,
        grace_seconds: float | None = None,
        idle_horizon_seconds: float = DEFAULT_IDLE_HORIZON_SECONDS,
    ) -> DispatchStats:
        """Dispatch until stopped (SIGTERM/SIGINT: see the class) or, with ``until_idle``,
        until nothing is due or claimed and no retry is due within ``idle_horizon_seconds``
        (:func:`~oncewire.dispatch.retry.drained`)."""
        grace = self.grace_seconds if grace_seconds is None else check_grace(grace_seconds)
        horizon = check_seconds("idle_horizon_seconds", idle_horizon_seconds)
        self._stop.clear()
        self._abort.clear()
        self._finished_run.clear()
        self._runner = SinkRunner(self.concurrency, self.clock)
        restore = install_signals(self._stop, self.stop, self.abort) if handle_signals else None
        heartbeat = threading.Thread(
            target=leases.renew_until,
            # Renews through the grace period too: attempts still running keep their leases.
            args=(self._finished_run, self._store, self._inflight),
            kwargs={"owner": self.owner, "lease_seconds": self.lease_seconds, "clock": self.clock},
            name="oncewire-lease",
            daemon=True,
        )
        heartbeat.start()
        unsubscribe = self._store.subscribe(self.wake)
        try:
            self._loop(until_idle, grace, horizon)
        finally:
            self._stop.set()
            self._finished_run.set()
            unsubscribe()
            heartbeat.join(timeout=5)
            self._runner.close()
            self._runner = None
            self._calls.clear()
            self._held.drain()
            self._suspects.running.clear()
            self._finished = []
            self._first_finished = None
            self._inflight.clear()
            if restore is not None:
                restore()
        return self.stats

    def _loop(self, until_idle: bool, grace: float, horizon: float) -> None:
        last_reap = last_kinds = -math.inf
        # Reaping is cheap (a read of the lease holders, an update that usually matches nothing)
        # and bounds how long a dead peer's claims wait: at most a second on the same host.
        reap_every = min(self.lease_seconds / 2, 1.0)
        outage = Outage(self.storage_patience_seconds)
        stopped_at: float | None = None
        next_claim = -math.inf  # while calls run, when to look for more work again
        while True:
            try:
                self._collect(0.0)
                if self._abort.is_set():
                    self._leave("a second signal")
                    return
                if self._stop.is_set():
                    if stopped_at is None:
                        stopped_at = time.monotonic()
                        self._stopping(grace)
                    if self._finished:
                        self._store_step(claim=False)
                    if not self._calls:
                        return
                    left = stopped_at + grace - time.monotonic()
                    if left <= 0:
                        self._leave(f"the grace period of {grace:g}s")
                        return
                    self._collect(min(left, self._next_timeout()))
                    outage.over()
                    continue
                now = time.monotonic()
                if now - last_reap >= reap_every:
                    self._reap()
                    last_reap = now
                if now - last_kinds >= WAITING_KINDS_EVERY_SECONDS:
                    kinds = self._store.waiting_kinds()
                    warn_waiting_kinds(
                        kinds, handled=self.kinds, warned=self._warned_kinds, clock=self.clock
                    )
                    last_kinds = now
                linger_over = self._first_finished is not None and (
                    now - self._first_finished >= SETTLE_LINGER_SECONDS
                )
                if not self._calls:
                    claims = self._store_step(claim=True)
                    outage.over()
                    if claims or self._calls or self._finished:
                        continue
                    if until_idle and self._reap():
                        continue
                    # One reading of the backlog decides both whether to leave and how long
                    # to sleep.
                    backlog = self._store.backlog(self.kinds, self._keys())
                    if until_idle and drained(backlog, self.clock.now(), horizon):
                        return
                    self._sleep_until_due(backlog.next_due)
                    continue
                if self._woken:  # something committed: claim again without waiting a poll
                    self._woken = False
                    next_claim = -math.inf
                room = now >= next_claim and self._has_room()
                if linger_over or room or self._mark_due():
                    claims = self._store_step(claim=room)
                    outage.over()
                    if room and not claims:
                        next_claim = time.monotonic() + self.poll_seconds
                    continue
                wait = self._next_timeout()
                if self._first_finished is not None:
                    wait = min(wait, self._first_finished + SETTLE_LINGER_SECONDS - now)
                if self._has_room():
                    wait = min(wait, next_claim - now)
                wait = min(wait, last_reap + reap_every - now)
                self._collect(max(wait, 0.0))
            except StorageError as exc:
                # The database went away (restart, failover, network): outage.py says how
                # outcomes not yet recorded are kept and retried, and for how long.
                if not exc.transient:  # a schema, a file or a statement that will not heal
                    raise
                self.stats.storage_errors += 1
                delay = outage.failed(time.monotonic())
                if delay is None:
                    log.error("%s: giving up", outage.too_long(time.monotonic()))
                    raise
                log.warning("store unavailable (%s); retrying in %.2fs", exc, delay)
                deadline = time.monotonic() + delay
                while not self._abort.is_set() and time.monotonic() < deadline:
                    self._collect(max(0.0, deadline - time.monotonic()))
                if self._stop.is_set() and not self._finished and not self._calls:
                    return

    def _has_room(self) -> bool:
        """Every call claimed has started and a sink slot is free: more work can start. Not
        while a suspect runs: claimed alone, it must stay alone until it is settled."""
        assert self._runner is not None
        return not self._held and not self._suspects.running and self._runner.has_room()

    def _next_timeout(self) -> float:
        """Seconds until the first running call times out (a poll interval at most)."""
        if self._timeouts and self._runner is not None:
            return self._runner.until_timeout(self.poll_seconds)
        return self.poll_seconds

    def _store_step(self, *, claim: bool) -> list[Claim]:
        """Record what finished, record the next wave of held calls as starting and, with
        ``claim``, claim the next batch: one transaction."""
        assert self._runner is not None
        settlements = self._finished
        if settlements:
            AFTER_SINK_BEFORE_RECORD.hit()
        size = self._held.size
        wave = self._held.take(self._runner.waiting())
        began = time.monotonic()
        keys = self._keys() if claim else None
        claim = claim and keys != []  # no key it may claim: nothing to look for
        if not (settlements or wave or claim):
            return []  # nothing to record and nothing to look for: no transaction at all
        look = claim and self._suspects.due(began)
        try:
            step = self._store.dispatch_step(
                settlements,
                owner=self.owner,
                now=self.clock.now(),
                lease_seconds=self.lease_seconds,
                limit=self.batch_size if claim else 0,
                kinds=self.kinds,
                starting=[(c.id, c.fence) for call in wave for c in call.claims],
                mark=size,
                suspects=look,
                keys=keys,
            )
        except BaseException:
            self._held.put_back(wave)  # still held: recorded at the next step
            raise
        if wave:  # what recording a wave costs, not a first claim's or a big settlement's
            self._held.waves.commit_took(time.monotonic() - began)
        self._finished = []
        self._first_finished = None
        if settlements:
            count_settled(self.stats, settlements, step.applied)
            AFTER_RECORD.hit()
            if self._recorded is not None:
                self._recorded()
        if wave:
            self._release_wave(wave, step.started)
        claims = step.claims
        if look or (claim and not claims):
            self._suspects.stepped(began, claims)
        if claims:
            self.stats.batches += 1
            self.stats.claimed += len(claims)
            if LISTENERS:
                emit(
                    CLAIMED,
                    {
                        "owner": self.owner,
                        "count": len(claims),
                        "redeliveries": sum(claim.redelivery for claim in claims),
                        "kinds": sorted({claim.kind for claim in claims}),
                    },
                )
            AFTER_CLAIM.hit()
            self._start(claims)
        # While calls are held, the runner wakes this thread when it is about to run out of
        # recorded ones (not otherwise: each wakeup costs this thread a turn per call).
        self._runner.low_water = size if self._held else 0
        return claims

    def _keys(self) -> list[str] | None:
        """The keys it may claim now (None: any)."""
        return None if self._claimable is None else sorted(self._claimable())

    # -- calling sinks -----------------------------------------------------------------------
    def _start(self, claims: Sequence[Claim]) -> None:
        """Call the sinks of the claims recorded as starting; hold the others back until a
        store step records them (:meth:`_store_step`)."""
        assert self._runner is not None
        self._inflight.hold(claims)
        pairs: list[tuple[Claim, Attempt]] = []
        for claim in claims:
            if claim.recoveries:
                self._suspects.running.add(claim.id)
            try:
                pairs.append((claim, attempt_of(claim)))
            except Exception as exc:  # a row written by hand or by an older version
                self._resolve([claim], [settling.undecodable(exc)], None)
                continue
            if claim.redelivery:
                self.stats.redeliveries += 1
        calls: list[Call] = []
        for call in form_calls(self.specs, pairs):
            self._calls[call.id] = call
            # A batch call starts all its attempts at once: it waits until all are recorded.
            if all(claim.started for claim in call.claims):
                calls.append(call)
            else:
                self._held.hold(call)
        self._runner.submit(calls)

    def _mark_due(self) -> bool:
        assert self._runner is not None
        return self._held.due(self._runner.waiting())

    def _release_wave(self, wave: Sequence[Call], started: set[int]) -> None:
        """Hand the calls of a recorded wave to the runner; drop the claims the store would not
        record (released or cancelled meanwhile: someone else's now, never to be called)."""
        assert self._runner is not None
        ready: list[Call] = []
        for call in wave:
            kept, lost = marking.split(call, started)
            if lost:
                self._calls.pop(call.id, None)
                log.warning(
                    "claim(s) of %s lost before their sink was called; not calling it: %s",
                    call.spec.kind,
                    shown([claim.key for claim in lost]),
                )
                self._forget(lost)
                if kept is not None:
                    self._calls[kept.id] = kept
            if kept is not None:
                ready.append(kept)
        self._runner.submit(ready)

    def _forget(self, claims: Sequence[Claim]) -> None:
        self._inflight.forget(claims)
        for claim in claims:
            self._suspects.running.discard(claim.id)

    def _collect(self, timeout: float) -> None:
        """Take what finished (waiting up to ``timeout`` for the first), then give up on the
        calls whose attempt timeout passed."""
        runner = self._runner
        assert runner is not None
        completions = runner.completions
        if timeout > 0:
            try:
                item = completions.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is not None:
                self._completed(item)
        while not completions.empty():  # this thread is the only reader
            item = completions.get_nowait()
            if item is not None:
                self._completed(item)
        if not self._timeouts:
            return
        for call in runner.overdue():
            if call.id in self._calls and runner.abandon(call):
                self._timed_out(call)

    def _completed(self, call: Call) -> None:
        if self._calls.pop(call.id, None) is None:
            return  # already resolved (timed out, or left behind)
        if call.started_at is not None and call.finished_at is not None:
            self._held.waves.call_took(call.finished_at - call.started_at)
        self._resolve(call.claims, resolving.verdicts(call, self.max_result_bytes), call)

    def _timed_out(self, call: Call) -> None:
        del self._calls[call.id]
        timeout = call.spec.timeout_seconds or 0.0
        log.warning(
            "attempt(s) of %s timed out after %gs: %s; recorded uncertain",
            call.spec.kind,
            timeout,
            shown(call.keys),
        )
        self._resolve(call.claims, [settling.timed_out(timeout)] * len(call.claims), call)
        resolving.cancel(call)

    def _not_started(self, calls: Sequence[Call]) -> None:
        for call in calls:
            self._calls.pop(call.id, None)
            self.stats.not_started += len(call.claims)
            verdict = settling.not_started(
                "the dispatcher stopped before this attempt started; nothing was sent"
            )
            self._resolve(call.claims, [verdict] * len(call.claims), call)

    def _resolve(
        self, claims: Sequence[Claim], verdicts: Sequence[Verdict], call: Call | None
    ) -> None:
        """Turn each attempt's verdict into a settlement to record, and say it in the log."""
        resolving.settle(
            claims,
            verdicts,
            call,
            into=self._finished,
            policy=self.retry,
            now=self.clock.now(),
            owner=self.owner,
            stats=self.stats,
        )
        if self._first_finished is None:
            self._first_finished = time.monotonic()
        self._forget(claims)

    # -- stopping ----------------------------------------------------------------------------
    def _stopping(self, grace: float) -> None:
        assert self._runner is not None
        held = self._held.drain()
        self._not_started([*self._runner.take_unstarted(), *held])
        say_stopping(grace, [key for call in self._calls.values() for key in call.keys])

    def _leave(self, why: str) -> None:
        """Exit with attempts still running: they stay claimed, for recovery."""
        assert self._runner is not None
        left = abandon_running(self._runner, self._calls.values())
        self._calls.clear()
        self._held.drain()
        self._suspects.running.clear()
        self._inflight.clear()
        self.stats.abandoned += len(left)
        say_left(why, left)

    # -- recovery and waiting ----------------------------------------------------------------
    def _reap(self) -> int:
        now, max_recoveries = self.clock.now(), self.retry.max_recoveries
        released, dead = leases.reap(
            self._store, owner=self.owner, now=now, max_recoveries=max_recoveries
        )
        if released:
            self._suspects.look_soon()
            log.info("released %d claim(s) (dead owners: %s)", released, dead or "none")
            self.stats.released += released
            if LISTENERS:
                emit(RELEASED, {"owner": self.owner, "count": released})
        return released

    def _sleep_until_due(self, next_due: float | None) -> None:
        wait, now = self.poll_seconds, self.clock.now()
        if next_due is not None and next_due - now < wait:  # never for NaN: a poll's wait
            wait = max(0.0, next_due - now)
        if wait > 0:
            self.clock.wait(self._wake, wait)
        self._wake.clear()
