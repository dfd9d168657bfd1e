"""The gateway's supervisor: which platforms this process serves, and what changes hands.

A platform is served while this process holds its bot lease (:mod:`oncewire.gateway.leases`)
and has run its recovery. When a lease is gained (at boot, or later from the lease thread:
its owner's lease ran out, or its owner is a dead process on this host) the supervisor runs,
in the boot's order, the platform's recovery (:mod:`oncewire.gateway.takeover`: committed
replies delivered, operations a dead process left in flight ``ambiguous``, turns whose owner is
gone ended or resumed), then starts its listener (:mod:`oncewire.gateway.listeners`), then lets
the scheduler and the reply thread serve it. When a lease is lost (another process took it, or
it could not be renewed before it ran out) the platform's listener stops at once and nothing new
of it is scheduled or delivered here; its turns already running go on under their own turn
leases (renewed, fenced), or stop where they stand if those are lost too.

The lease thread (:meth:`Supervisor.keep`) renews and asks for the bot leases, and takes over
the turns of the platforms served whose turn lease ran out (their owner lost it without dying
here).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from oncewire.gateway.config import PlatformConfig
from oncewire.gateway.leases import BotLeases
from oncewire.gateway.listeners import Listener
from oncewire.gateway.outage import StoreOutage
from oncewire.gateway.scheduler import Scheduler
from oncewire.gateway.takeover import deliver_committed, sweep_turns
from oncewire.ledger import Ledger
from oncewire.replies import ReplyEngine

__all__ = ["Supervisor"]

# The runner's logger: an operator reads one gateway log (docs/deploy.md quotes its lines).
log = logging.getLogger("oncewire.gateway.runner")


class Supervisor:
    """The platforms this process serves: their bot leases, recoveries and listeners."""

    def __init__(
        self,
        platforms: tuple[PlatformConfig, ...],
        ledger: Ledger,
        engine: ReplyEngine,
        scheduler: Scheduler,
        *,
        owner: str,
        listen: Callable[[PlatformConfig], Listener | None],
        replies_wake: threading.Event,
        stop: threading.Event,
        say: Callable[[str], None],
    ) -> None:
        self.platforms = platforms
        self.ledger = ledger
        self.engine = engine
        self.scheduler = scheduler
        self.owner = owner
        self.announce = False  # after "ready": say on stdout when a platform changes hands
        self._listen = listen
        self._replies_wake = replies_wake
        self._stop = stop
        self._say = say
        self._lock = threading.Lock()
        self._listeners: dict[str, Listener] = {}  # platform -> its inbound, while served
        self._serving: set[str] = set()  # platforms whose lease is held and recovery done

    def served(self) -> list[str]:
        """The platforms served now, sorted."""
        with self._lock:
            return sorted(self._serving)

    # -- bot leases: taking platforms over and losing them -------------------------------------
    def gain(self, name: str) -> None:
        """The lease of platform ``name`` is ours: its recovery, then its listener, then the
        scheduler and the reply thread serve it (the boot's order, for this platform)."""
        deliver_committed(self.ledger, self.engine, {name})
        skip = self.scheduler.held()
        resumes = sweep_turns(self.ledger, self.engine, self.owner, {name}, skip=skip)
        platform = next(p for p in self.platforms if p.name == name)
        listener = self._listen(platform)
        self.scheduler.resume(resumes)
        with self._lock:
            self._serving.add(name)
            if listener is not None:
                self._listeners[name] = listener
        if listener is not None:
            listener.start("discord" if platform.kind == "discord" else "poller")
        if self.announce:
            self._say(f"serving {name}")
        self.scheduler.wake()
        self._replies_wake.set()

    def lose(self, name: str) -> None:
        """The lease of platform ``name`` is gone: its inbound stops now, nothing new of it is
        scheduled or delivered here; its running turns go on under their own turn leases."""
        with self._lock:
            self._serving.discard(name)
            listener = self._listeners.pop(name, None)
        if listener is not None:
            listener.stop()
        if self.announce and not self._stop.is_set():
            self._say(f"standby {name}")

    def keep(self, leases: BotLeases) -> None:
        """The lease thread: renew and ask for the bot leases; take over the turns of the
        platforms served whose turn lease ran out (their owner lost it without dying here)."""
        sweeping = StoreOutage(log, "looking for turns to take over")
        while not self._stop.wait(leases.interval_seconds):
            leases.renew()
            if self._stop.is_set():
                return
            leases.acquire()
            serving = set(self.served())
            skip = self.scheduler.held()
            try:
                found = sweep_turns(
                    self.ledger, self.engine, self.owner, serving, skip=skip, quiet=True
                )
            except Exception as exc:
                sweeping.failed(exc)
                continue
            sweeping.answered()
            if found:
                self.scheduler.resume(found)
                self.scheduler.wake()

    # -- the drain and the end -------------------------------------------------------------
    def stop_serving(self) -> None:
        """The drain: every platform's inbound stops now, nothing new is scheduled."""
        with self._lock:
            self._serving.clear()
            listeners = list(self._listeners.values())
            self._listeners.clear()
        for listener in listeners:
            listener.stop()

    def stop_listeners(self) -> None:
        """Stop the listeners still running (the end of a run the drain did not reach)."""
        with self._lock:
            listeners = list(self._listeners.values())
        for listener in listeners:
            listener.stop()
