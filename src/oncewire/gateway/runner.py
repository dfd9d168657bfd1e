"""``oncewire gateway run``: one process owning one store, its pollers, turns and deliveries.

Boot, in order, driven only by rows (nothing is read from a transcript, nothing is guessed):

1. open the store (``[store] db``; migrations run);
2. with ``[[tools]]``, a :class:`~oncewire.Dispatcher` thread that runs the tools' effects
   (:mod:`oncewire.gateway.tools`; a resumed turn's unfinished calls included: an effect a dead
   process left claimed is redelivered, flagged);
3. the bot leases (:mod:`oncewire.gateway.leases`): for each platform whose lease this process
   takes, the platform's recovery (:mod:`oncewire.gateway.takeover`: committed replies
   delivered, operations a dead process left in flight ``ambiguous``, turns whose owner is gone
   ended or resumed), then its listener (:mod:`oncewire.gateway.listeners`: a poller thread
   per Telegram platform with ``inbound = "polling"``, each update admitted (T1,
   :mod:`oncewire.gateway.admission`) and only then confirmed; a Gateway thread per Discord
   platform). A platform whose lease another process holds is **stood by**: nothing of it is
   polled, scheduled or delivered here until a lease thread takes it over (its owner's lease
   ran out, or its owner is a dead process on this host), which runs the same recovery first;
4. ``received`` messages of the platforms served are scheduled, per session in id order;
5. when a platform takes its messages by webhook (a Telegram platform with ``inbound =
   "webhook"``, a ``kind = "webhook"`` platform), the webhook server
   (:mod:`oncewire.gateway.webhooks`) on ``[webhooks] bind``: each POST is admitted by the
   same T1 and answered 2xx only once that committed (in a standby too: admission is
   idempotent, and the process serving the platform answers); then the line ``ready`` is
   printed on stdout (``ready port=N`` with the webhook server, N the port it listens on, so
   ``bind`` may ask for port 0), followed by `` standby=a,b`` naming the platforms stood by.
   Later, ``serving NAME`` and ``standby NAME`` lines say when a platform is taken over or
   lost.

Replies go out through each platform's adapter: the Telegram Bot API or Discord's REST API
(editable, previews when ``streaming``; on Discord every create carries a nonce), or the
generic webhook platform's ``send_url`` (non-editable: one message per chunk, no preview).

A scheduler thread starts turns (:mod:`oncewire.gateway.turn`) on a pool of ``[turns]
max_concurrent`` worker threads, one turn per session at a time (the run ledger's
one-active-run-per-branch index holds it; the scheduler only avoids asking twice), and a reply
thread delivers the replies whose retry time has come and that nobody holds. Both wait on the
store's commits, not on a timer: the scheduler looks when the inbox changes (an admission, a
turn answered or superseded, an interrupt recorded, by this process or another) or one of its
turns ends, and reads only each free session's first waiting message (``inbound.queued``);
the reply thread looks when a reply is given back or committed for anyone to deliver, else at
the next one's retry time. At each look the scheduler also reads the status of the turns it
runs: one whose interrupt was recorded (at a
newer message's admission, or ``/stop``: :mod:`oncewire.gateway.sessions`) has its worker
signalled (its model stream or tool wait ends), and the worker ends it ``interrupted``.

:meth:`Runner.stop` (SIGTERM or SIGINT) drains: the webhook server stops accepting and answers
the POSTs it is admitting, the pollers stop at once (an update not yet admitted stays with
Telegram; a POST not answered 2xx is delivered again by its platform), no new turn starts,
running turns get ``grace_seconds`` to finish and deliver; a turn still running then is
interrupted where it stands and left to the next process, which resumes it. The dispatcher
stops last (its tool calls in flight get its own grace period; one still running then stays
claimed for the next process). The bot leases are then given back, so a standby takes the bots
over at once, and the process exits 0.

A bot lease lost while running (another process took it, or it could not be renewed before it
ran out) stops that platform's listener at once and its scheduling and deliveries; its turns
already running go on under their own turn leases (renewed, fenced), or stop where they stand
if those are lost too.

When the store is away (a database restart or crash, the network cut) nothing exits: each
loop logs the outage once and when the store answers again (:mod:`oncewire.gateway.outage`),
and a turn stopped by it (its commit failed, so nothing of it is recorded) is taken over again
by this process as soon as its run can be read, under a new fence.

The parts are made by :mod:`oncewire.gateway.assembly`, turns are started and followed by
:mod:`oncewire.gateway.scheduler`, the platforms served (bot leases, recoveries, listeners) are
held by :mod:`oncewire.gateway.supervisor`; this module wires them in the boot's order above and
drains them.

Not yet: the busy modes steer and reject.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from oncewire.core.errors import ConfigurationError
from oncewire.core.ids import this_process_owner
from oncewire.dispatch import Dispatcher
from oncewire.gateway import assembly
from oncewire.gateway.admission import Admitted, Admitter
from oncewire.gateway.assembly import Adapter, Credentials
from oncewire.gateway.config import GatewayConfig, PlatformConfig
from oncewire.gateway.deliveries import SAFETY_LOOK_SECONDS, DueDeliveries
from oncewire.gateway.leases import BotLeases
from oncewire.gateway.model import OpenAIChatClient
from oncewire.gateway.model_results import ModelClient
from oncewire.gateway.platforms.telegram_updates import TelegramInbound
from oncewire.gateway.platforms.webhook import WebhookInbound
from oncewire.gateway.scheduler import Scheduler, SessionKey
from oncewire.gateway.supervisor import Supervisor
from oncewire.gateway.tools import ToolRegistry
from oncewire.ledger import Ledger
from oncewire.replies import ReplyEngine

if TYPE_CHECKING:  # the server needs the gateway extra's starlette and uvicorn
    from oncewire.gateway.webhooks import WebhookServer

__all__ = ["Runner", "SessionKey"]

log = logging.getLogger("oncewire.gateway.runner")


@dataclass
class _Opened:
    """What one run has opened so far: :meth:`Runner._close` closes it, however far the start
    got."""

    model: ModelClient
    server: WebhookServer | None
    ledger: Ledger
    adapters: dict[str, Adapter] = field(default_factory=dict)
    dispatcher: Dispatcher | None = None
    dispatching: threading.Thread | None = None
    leases: BotLeases | None = None


class Runner:
    """The gateway process: ``Runner(config).run()`` blocks until :meth:`stop`, then drains."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        grace_seconds: float = 30.0,
        poll_timeout_seconds: int = 25,
        out: TextIO | None = None,
        model: ModelClient | None = None,
    ) -> None:
        if grace_seconds < 0:
            raise ConfigurationError("grace_seconds must be >= 0")
        self.config = config
        self.grace_seconds = grace_seconds
        self.poll_timeout_seconds = poll_timeout_seconds
        self.out = out
        self.owner = this_process_owner()
        self._model = model
        self._stop = threading.Event()
        self._wake = threading.Event()  # the scheduler's: look again now
        self._replies_wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._admitter: Admitter | None = None
        self._scheduler: Scheduler | None = None
        self._supervisor: Supervisor | None = None

    def stop(self) -> None:
        """Begin the drain (safe from a signal handler: it only sets a flag)."""
        self._stop.set()
        self._wake.set()
        self._replies_wake.set()

    # -- the whole life --------------------------------------------------------------------
    def run(self) -> int:
        config = self.config
        credentials = Credentials.read(config)
        prompt = assembly.read_system_prompt(config)
        tools = ToolRegistry.from_config(config.tools, origin=f"{config.path}: [[tools]]")
        # Made before the store opens: a secret it needs that is not set stops the start here.
        server = assembly.make_webhook_server(
            config, self._admit_pushed, grace_seconds=self.grace_seconds
        )
        model = self._model or OpenAIChatClient.from_config(config.model)
        opened = _Opened(model, server, Ledger(config.store.db))
        try:
            engine = self._assemble(opened, credentials, prompt, tools)
            standby = self._take_leases(opened, credentials)
            self._start_threads(opened, engine)
            self._ready(server, standby)
            # Waited in steps: the kernel hands SIGTERM to any thread of the process, and its
            # Python handler (stop) runs only once the main thread runs bytecode again, which
            # an untimed wait may never do: the gateway then ignored SIGTERM.
            while not self._stop.wait(0.5):
                pass
            self._drain(server)
        finally:
            self._close(opened)
        log.info("gateway stopped")
        return 0

    def _assemble(
        self, opened: _Opened, credentials: Credentials, prompt: str | None, tools: ToolRegistry
    ) -> ReplyEngine:
        """Make the adapters, the reply engine, the dispatcher (started on its own thread),
        the turn worker, the scheduler, the admitter and the supervisor."""
        config, ledger = self.config, opened.ledger
        assembly.make_adapters(config, credentials, opened.adapters)
        engine = ReplyEngine(ledger, dict(opened.adapters), owner=self.owner)
        opened.dispatcher = assembly.make_dispatcher(
            config, ledger, tools, owner=self.owner, grace_seconds=self.grace_seconds
        )
        worker = assembly.make_turn_worker(
            config,
            ledger,
            engine,
            opened.model,
            prompt=prompt,
            owner=self.owner,
            tools=tools,
            dispatcher=opened.dispatcher,
        )
        if opened.dispatcher is not None:
            # Its own thread, outside self._threads: it stops after the turns have.
            opened.dispatching = threading.Thread(
                target=functools.partial(opened.dispatcher.run, handle_signals=False),
                name="dispatcher",
                daemon=True,
            )
            opened.dispatching.start()
        self._admitter = assembly.make_admitter(
            config, ledger, credentials, on_new=lambda _id: self._wake.set()
        )
        self._scheduler = Scheduler(
            ledger,
            worker,
            owner=self.owner,
            max_concurrent=config.turns.max_concurrent,
            served=self._served,
            wake=self._wake,
            stop=self._stop,
            safety_look_seconds=SAFETY_LOOK_SECONDS,
        )
        self._supervisor = Supervisor(
            config.platforms,
            ledger,
            engine,
            self._scheduler,
            owner=self.owner,
            listen=functools.partial(
                assembly.make_listener,
                credentials=credentials,
                admitter=self._admitter,
                ledger=ledger,
                poll_timeout_seconds=self.poll_timeout_seconds,
            ),
            replies_wake=self._replies_wake,
            stop=self._stop,
            say=self._say,
        )
        return engine

    def _take_leases(self, opened: _Opened, credentials: Credentials) -> list[str]:
        """Ask for every platform's bot lease (each one gained is recovered and served at
        once); the platforms stood by, whose lease another process holds."""
        assert self._supervisor is not None
        names = assembly.lease_names(self.config, credentials)
        opened.leases = BotLeases(
            opened.ledger.store,
            opened.ledger.clock,
            self.owner,
            names,
            lease_seconds=self.config.leases.bot_seconds,
            gain=self._supervisor.gain,
            lose=self._supervisor.lose,
        )
        opened.leases.acquire()
        standby = sorted(set(names) - opened.leases.held())
        for name in standby:
            log.warning(
                "standing by for %s: its bot lease %s is held by another process",
                name,
                names[name],
            )
        return standby

    def _start_threads(self, opened: _Opened, engine: ReplyEngine) -> None:
        """The scheduler, the reply thread and the lease thread."""
        assert self._scheduler is not None and self._supervisor is not None
        assert opened.leases is not None
        self._spawn("scheduler", self._scheduler.run)
        deliveries = DueDeliveries(opened.ledger, engine, self._served, self._replies_wake)
        self._spawn("replies", lambda: deliveries.run(self._stop))
        self._spawn("leases", functools.partial(self._supervisor.keep, opened.leases))

    def _ready(self, server: WebhookServer | None, standby: list[str]) -> None:
        """Start the webhook server and say ``ready`` (with its port and the platforms stood
        by); from now on a platform changing hands is said too."""
        assert self._supervisor is not None
        ready = "ready"
        if server is not None:
            ready = f"ready port={server.start()}"
        if standby:
            ready += f" standby={','.join(standby)}"
        self._say(ready)
        self._supervisor.announce = True
        log.info(
            "gateway ready: serving %s, standing by for %s, webhook server %s, owner %s",
            ", ".join(self._served()) or "nothing",
            ", ".join(standby) or "nothing",
            "off" if server is None else server.url,
            self.owner,
        )

    def _close(self, opened: _Opened) -> None:
        """Close what the run opened, in order: the dispatcher last of the threads, the bot
        leases given back once the turns have ended or stopped, the store last of all."""
        if opened.server is not None:
            opened.server.stop()  # at once when the drain stopped it already
        if opened.dispatcher is not None and opened.dispatching is not None:
            opened.dispatcher.stop()
            opened.dispatching.join()
        if self._supervisor is not None:
            self._supervisor.stop_listeners()
        if opened.leases is not None:
            opened.leases.release_all()  # the turns have ended or stopped: a standby may start
        for adapter in opened.adapters.values():
            adapter.close()
        if self._model is None and isinstance(opened.model, OpenAIChatClient):
            opened.model.close()
        opened.ledger.close()

    # -- what the parts ask of the process -------------------------------------------------
    def _admit_pushed(
        self, platform: PlatformConfig, message: TelegramInbound | WebhookInbound
    ) -> Admitted:
        assert self._admitter is not None  # the server starts after the admitter is made
        return self._admitter.admit_pushed(platform, message)

    def _served(self) -> list[str]:
        return [] if self._supervisor is None else self._supervisor.served()

    def _say(self, line: str) -> None:
        if self.out is not None:
            self.out.write(line + "\n")
            self.out.flush()

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- the drain -------------------------------------------------------------------------
    def _drain(self, server: WebhookServer | None) -> None:
        assert self._scheduler is not None and self._supervisor is not None
        log.info("draining: inbound stops, running turns get %.1fs", self.grace_seconds)
        if server is not None:
            # No new POST is taken; the ones being admitted are answered (2xx once committed).
            server.stop()
        self._supervisor.stop_serving()
        deadline = time.monotonic() + self.grace_seconds
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._scheduler.drain(deadline)
