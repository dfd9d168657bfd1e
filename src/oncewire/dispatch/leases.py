"""Leases: this dispatcher's renewed while its sinks run, dead or expired owners' released,
and the effects an owner died on (suspects) claimed alone.

A claim is leased to its dispatcher for ``lease_seconds``. A heartbeat thread renews the leases
of the claims in flight every third of a lease, so a sink that takes longer than a lease keeps
its claim, through the grace period of a stop too. A dispatcher that dies stops renewing: a peer
releases its claims when the lease runs out, or at once where it can tell the owner is dead (a
pid and start time on this host), which is what :func:`reap` looks for.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from oncewire.core.errors import OncewireError
from oncewire.core.ids import owner_is_dead_locally

if TYPE_CHECKING:
    from oncewire.core.clock import Clock
    from oncewire.storage.records import Claim
    from oncewire.storage.store import EffectStore

__all__ = ["InFlight", "reap", "renew_until"]

log = logging.getLogger("oncewire.dispatch")


class InFlight:
    """The claims this dispatcher holds, by effect id with their fences: written by the
    dispatcher's thread, read by the heartbeat's."""

    def __init__(self) -> None:
        self._fences: dict[int, int] = {}
        self._lock = threading.Lock()

    def hold(self, claims: Iterable[Claim]) -> None:
        with self._lock:
            for claim in claims:
                self._fences[claim.id] = claim.fence

    def forget(self, claims: Iterable[Claim]) -> None:
        with self._lock:
            for claim in claims:
                self._fences.pop(claim.id, None)

    def clear(self) -> None:
        with self._lock:
            self._fences.clear()

    def fences(self) -> list[tuple[int, int]]:
        """(effect id, fence) of every claim held."""
        with self._lock:
            return list(self._fences.items())


def renew_until(
    finished: threading.Event,
    store: EffectStore,
    held: InFlight,
    *,
    owner: str,
    lease_seconds: float,
    clock: Clock,
) -> None:
    """The heartbeat: renew the leases of the claims ``held`` every third of a lease until
    ``finished`` is set. A failed renewal is a warning: the next one may get through, and a
    lease lost meanwhile only means a peer redelivers the effect, flagged."""
    interval = lease_seconds / 3
    while not finished.wait(interval):
        fences = held.fences()
        if not fences:
            continue
        now = clock.now()
        try:
            store.renew_leases(owner, fences, now + lease_seconds, now)
        except OncewireError as exc:
            log.warning("lease renewal failed: %s", exc)


def reap(
    store: EffectStore, *, owner: str, now: float, max_recoveries: int
) -> tuple[int, list[str]]:
    """Release the claims of owners seen dead on this host and of leases that ran out, and
    move waiting effects past their deadline to ``dead``: how many, and the dead owners."""
    dead = [
        holder
        for holder in store.lease_holders()
        if holder != owner and owner_is_dead_locally(holder)
    ]
    released = store.release_claims(now=now, dead_owners=dead, max_recoveries=max_recoveries)
    released += store.expire_deadlines(now)
    return released, dead


# How often a busy dispatcher looks for an effect an owner died on. An idle one, or one that has
# just released a dead owner's claims or settled such an effect, looks at its next claim.
SUSPECTS_EVERY_SECONDS = 1.0


class Suspects:
    """Effects an owner died on while their sink ran (recoveries > 0): each is claimed alone
    (a batch claim never takes one), and nothing more is claimed while it runs, so an effect
    that kills its process takes no other effect down with it. Looking for one is a statement
    of its own, which a dispatcher claiming one effect at a time would otherwise pay for every
    effect; it looks when it starts, when told to (:meth:`look_soon`), after a step that found
    nothing or a suspect, and at least every :data:`SUSPECTS_EVERY_SECONDS` while busy."""

    def __init__(self) -> None:
        self.running: set[int] = set()  # claim ids of the suspects in flight
        self._look_at = 0.0  # time.monotonic() of the next look

    def due(self, now: float) -> bool:
        return now >= self._look_at

    def look_soon(self) -> None:
        self._look_at = 0.0

    def stepped(self, began: float, claims: Sequence[Claim]) -> None:
        """After a claim step that looked, or that found nothing."""
        again = not claims or claims[0].recoveries > 0
        self._look_at = 0.0 if again else began + SUSPECTS_EVERY_SECONDS
