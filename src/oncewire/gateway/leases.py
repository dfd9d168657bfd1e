"""Bot leases: one gateway process at a time polls and serves a bot.

Each platform a gateway serves has a lease in the store, ``bot:{platform}:{bot}``
(:class:`~oncewire.storage.verbs.leases.LeaseVerbs`). :class:`BotLeases` takes the ones it can
at start, renews those it holds every third of ``[leases] bot_lease_seconds``, and keeps asking
for the others at the same pace (a process that holds none of them is a standby). The
invariant it keeps: **a process serves a bot only while it holds the bot's lease under a fence
nobody moved**, so two processes never poll one bot at once:

- a renewal refused (another process took the lease: its fence moved) ends the serving at once;
- a renewal that fails (the database is unreachable) keeps the serving only while the lease
  cannot have run out yet, judged on this process's monotonic clock from the last renewal that
  committed, with one renewal interval to spare; past that the serving ends, though nobody may
  have taken the lease, since nobody could tell us;
- a lease is taken when nobody holds it, when it ran out, or when its holder is a process on
  this host that is gone (a SIGKILLed gateway's bots are taken over at once, without waiting).

What serving means is the runner's (its ``gain`` and ``lose`` callbacks): ``gain`` runs the
bot's share of boot recovery and starts its inbound; ``lose`` stops them. Both run on the
keeper's thread, one at a time, never while holding the keeper's lock.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from oncewire.core.clock import Clock
from oncewire.core.errors import StaleFence
from oncewire.storage import Store

__all__ = ["BotLeases", "bot_lease_name"]

log = logging.getLogger("oncewire.gateway.leases")


def bot_lease_name(platform: str, bot: str) -> str:
    """``bot:{platform}:{bot}``; ``bot`` is the bot's id where its token tells it (Telegram),
    else a short digest of the token (the token itself is never stored)."""
    return f"bot:{platform}:{bot}"


def token_digest(token: str) -> str:
    """A stand-in for a bot's id: 12 hex digits of the token's SHA-256."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()[:12]


@dataclass
class _Held:
    fence: int
    renewed_at: float  # time.monotonic() just before the renewal that committed


class BotLeases:
    """The bot leases of one gateway process: ``names`` maps a platform to its lease's name."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        owner: str,
        names: Mapping[str, str],
        *,
        lease_seconds: float,
        gain: Callable[[str], None],
        lose: Callable[[str], None],
    ) -> None:
        self.store = store
        self.clock = clock
        self.owner = owner
        self.names = dict(names)
        self.lease_seconds = lease_seconds
        self.interval_seconds = lease_seconds / 3
        self._gain = gain
        self._lose = lose
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}

    def held(self) -> set[str]:
        """The platforms this process holds the lease of now."""
        with self._lock:
            return set(self._held)

    def fence(self, platform: str) -> int | None:
        with self._lock:
            held = self._held.get(platform)
        return None if held is None else held.fence

    def acquire(self) -> list[str]:
        """Try for every lease not held; the platforms gained (``gain`` was called for each)."""
        gained = []
        for platform, name in self.names.items():
            if platform in self.held():
                continue
            started = time.monotonic()
            try:
                lease = self.store.acquire_lease(
                    name, owner=self.owner, lease_seconds=self.lease_seconds, now=self.clock.now()
                )
            except Exception as exc:
                log.warning("bot lease %s: cannot ask for it (%s)", name, exc)
                continue
            if lease is None:
                continue
            with self._lock:
                self._held[platform] = _Held(lease.fence, started)
            log.info("bot lease %s taken (fence %s): serving %s", name, lease.fence, platform)
            try:
                self._gain(platform)
            except Exception:
                # Serving it failed to start: give the lease back so another process may.
                log.exception("platform %s: could not start serving it; lease released", platform)
                self._drop(platform)
                self._release(platform, lease.fence)
                continue
            gained.append(platform)
        return gained

    def renew(self) -> list[str]:
        """Renew every lease held; the platforms lost (``lose`` was called for each)."""
        lost = []
        with self._lock:
            held = dict(self._held)
        for platform, item in held.items():
            name = self.names[platform]
            started = time.monotonic()
            try:
                self.store.renew_lease(
                    name,
                    owner=self.owner,
                    fence=item.fence,
                    lease_seconds=self.lease_seconds,
                    now=self.clock.now(),
                )
            except StaleFence:
                log.error(
                    "bot lease %s was taken by another process (fence %s is stale): "
                    "stopped serving %s",
                    name,
                    item.fence,
                    platform,
                )
            except Exception as exc:
                # The lease may still be ours; keep serving only while it cannot have run out.
                left = item.renewed_at + self.lease_seconds - self.interval_seconds
                if time.monotonic() < left:
                    log.warning("bot lease %s: renewal failed (%s); trying again", name, exc)
                    continue
                log.error(
                    "bot lease %s: not renewed for %.1fs (%s): stopped serving %s",
                    name,
                    time.monotonic() - item.renewed_at,
                    exc,
                    platform,
                )
            else:
                with self._lock:
                    if platform in self._held:
                        self._held[platform].renewed_at = started
                continue
            self._drop(platform)
            lost.append(platform)
        return lost

    def run(self, stop: threading.Event) -> None:
        """Renew and ask, every third of the lease, until ``stop``."""
        while not stop.wait(self.interval_seconds):
            self.renew()
            if not stop.is_set():
                self.acquire()

    def release_all(self) -> None:
        """Give back every lease held (at the end of a drain: the next process starts at once)."""
        with self._lock:
            held, self._held = self._held, {}
        for platform, item in held.items():
            self._release(platform, item.fence)

    def _drop(self, platform: str) -> None:
        with self._lock:
            self._held.pop(platform, None)
        try:
            self._lose(platform)
        except Exception:
            log.exception("platform %s: stopping it failed", platform)

    def _release(self, platform: str, fence: int) -> None:
        name = self.names[platform]
        try:
            self.store.release_lease(name, owner=self.owner, fence=fence, now=self.clock.now())
        except Exception as exc:
            log.warning("bot lease %s: not released (%s); it runs out by itself", name, exc)
