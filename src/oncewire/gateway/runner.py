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

Not yet: the busy modes steer and reject.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from oncewire.core.errors import ConfigurationError, OncewireError
from oncewire.core.ids import this_process_owner
from oncewire.dispatch import Dispatcher
from oncewire.gateway.admission import WEBHOOK_BOT, Admitted, Admitter, telegram_bot_id
from oncewire.gateway.config import GatewayConfig, PlatformConfig
from oncewire.gateway.deliveries import OUTAGE_LOOK_SECONDS, SAFETY_LOOK_SECONDS, DueDeliveries
from oncewire.gateway.http import Timeouts
from oncewire.gateway.leases import BotLeases, bot_lease_name, token_digest
from oncewire.gateway.listeners import DiscordListener, Listener, TelegramListener
from oncewire.gateway.model import OpenAIChatClient
from oncewire.gateway.model_results import Interrupt, ModelClient
from oncewire.gateway.outage import StoreOutage, store_away
from oncewire.gateway.platforms.discord import DiscordBot
from oncewire.gateway.platforms.telegram import TelegramBot
from oncewire.gateway.platforms.telegram_updates import TelegramInbound
from oncewire.gateway.platforms.webhook import WebhookInbound, WebhookPlatform
from oncewire.gateway.ratelimit import RateLimiter, RateLimits
from oncewire.gateway.takeover import deliver_committed, sweep_turns
from oncewire.gateway.tools import ToolRegistry
from oncewire.gateway.turn import TurnResult, TurnSettings, TurnWorker
from oncewire.ledger import Ledger
from oncewire.replies import Platform, ReplyEngine

if TYPE_CHECKING:  # the server needs the gateway extra's starlette and uvicorn
    from oncewire.gateway.webhooks import WebhookServer

__all__ = ["Runner", "SessionKey"]

log = logging.getLogger("oncewire.gateway.runner")

SessionKey = tuple[str, str, str, str]  # platform, bot, chat, thread


@dataclass
class _Running:
    inbound_id: int
    interrupt: Interrupt
    future: Future[TurnResult]


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
        self._wake = threading.Event()
        self._store_changed = threading.Event()  # a commit the scheduler waits for
        self._replies_wake = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[SessionKey, _Running] = {}
        # Sessions whose turn is another process's (a start was refused busy): not asked again
        # before a commit that may have ended it.
        self._busy: set[SessionKey] = set()
        self._resumes: dict[int, int] = {}  # inbound id -> the fence its dead owner held
        # Turns of this process that stopped on an error while their run could not be read
        # (the store was away): read again at each look until it answers.
        self._unread: set[int] = set()
        self._threads: list[threading.Thread] = []
        self._listeners: dict[str, Listener] = {}  # platform -> its inbound, while served
        self._serving: set[str] = set()  # platforms whose lease is held and recovery done
        self._server: WebhookServer | None = None
        self._ledger: Ledger | None = None
        self._announce = False  # after "ready": say on stdout when a platform changes hands

    def stop(self) -> None:
        """Begin the drain (safe from a signal handler: it only sets a flag)."""
        self._stop.set()
        self._wake.set()
        self._replies_wake.set()

    # -- the whole life --------------------------------------------------------------------
    def run(self) -> int:
        config = self.config
        telegram = [p for p in config.platforms if p.kind == "telegram"]
        hooks = [p for p in config.platforms if p.kind == "webhook"]
        discord = [p for p in config.platforms if p.kind == "discord"]
        tokens = {p.name: config.secret(p.token_env or "") for p in (*telegram, *discord)}
        hook_secrets = {p.name: config.secret(p.secret_env) for p in hooks if p.secret_env}
        try:
            bots = {p.name: telegram_bot_id(tokens[p.name]) for p in telegram}
        except ValueError as exc:
            raise ConfigurationError(f"{config.path}: a token_env variable: {exc}") from exc
        system_prompt = None
        if config.model.system_prompt_file is not None:
            try:
                system_prompt = config.model.system_prompt_file.read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigurationError(
                    f"{config.path}: system_prompt_file: cannot read "
                    f"{config.model.system_prompt_file}: {exc.strerror or exc}"
                ) from exc
        tools = ToolRegistry.from_config(config.tools, origin=f"{config.path}: [[tools]]")
        admitter: Admitter | None = None

        def admit_pushed(
            platform: PlatformConfig, message: TelegramInbound | WebhookInbound
        ) -> Admitted:
            assert admitter is not None  # the server starts after the admitter is made
            return admitter.admit_pushed(platform, message)

        # Made before the store opens: a secret it needs that is not set stops the start here.
        server = self._webhook_server(admit_pushed)
        model = self._model or OpenAIChatClient.from_config(config.model)
        adapters: dict[str, TelegramBot | WebhookPlatform | DiscordBot] = {}
        ledger = Ledger(config.store.db)
        dispatcher: Dispatcher | None = None
        dispatching: threading.Thread | None = None
        leases: BotLeases | None = None
        try:
            for p in telegram:
                assert p.api_base is not None
                adapters[p.name] = TelegramBot(
                    tokens[p.name],
                    api_base=p.api_base,
                    limiter=RateLimiter(RateLimits.of(p)),
                    timeouts=Timeouts(read_seconds=p.read_timeout_seconds),
                )
            for p in discord:
                assert p.api_base is not None
                adapters[p.name] = DiscordBot(
                    tokens[p.name],
                    api_base=p.api_base,
                    timeouts=Timeouts(read_seconds=p.read_timeout_seconds),
                )
            for p in hooks:
                assert p.send_url is not None
                adapters[p.name] = WebhookPlatform(
                    p.send_url,
                    secret=hook_secrets.get(p.name),
                    timeouts=Timeouts(read_seconds=p.read_timeout_seconds),
                )
            platforms: dict[str, Platform] = dict(adapters)
            engine = ReplyEngine(ledger, platforms, owner=self.owner)
            if tools:
                dispatcher = Dispatcher(
                    ledger,
                    tools.sinks(),
                    attempt_timeouts=tools.attempt_timeouts(),
                    concurrency=config.turns.max_concurrent,
                    owner=self.owner,
                    grace_seconds=self.grace_seconds,
                )
            worker = TurnWorker(
                ledger,
                engine,
                model,
                {p.name: p for p in (*telegram, *hooks, *discord)},
                TurnSettings(
                    max_retries=config.model.max_retries,
                    max_starts=config.turns.max_starts,
                    resume_note=config.turns.resume_note,
                    system_prompt=system_prompt,
                    history_messages=config.turns.history_messages,
                    history_chars=config.turns.history_chars,
                    max_steps=config.turns.max_steps,
                    lease_seconds=config.leases.turn_seconds,
                ),
                owner=self.owner,
                tools=tools,
                wake_tools=None if dispatcher is None else dispatcher.wake,
            )
            if dispatcher is not None:
                # Its own thread, outside self._threads: it stops after the turns have.
                dispatching = threading.Thread(
                    target=functools.partial(dispatcher.run, handle_signals=False),
                    name="dispatcher",
                    daemon=True,
                )
                dispatching.start()
            admitter = Admitter(
                ledger,
                on_new=lambda _id: self._wake.set(),
                busy_mode=config.turns.busy_mode,
                bots=bots,
            )
            pool = ThreadPoolExecutor(config.turns.max_concurrent, thread_name_prefix="turn")
            self._ledger = ledger
            listen = functools.partial(self._listener, tokens=tokens, bots=bots, admitter=admitter)
            names = {
                p.name: bot_lease_name(
                    p.name,
                    bots[p.name]
                    if p.kind == "telegram"
                    else WEBHOOK_BOT
                    if p.kind == "webhook"
                    else token_digest(tokens[p.name]),
                )
                for p in config.platforms
            }
            leases = BotLeases(
                ledger.store,
                ledger.clock,
                self.owner,
                names,
                lease_seconds=config.leases.bot_seconds,
                gain=lambda name: self._gain(name, ledger, engine, listen),
                lose=self._lose,
            )
            leases.acquire()
            standby = sorted(set(names) - leases.held())
            for name in standby:
                log.warning(
                    "standing by for %s: its bot lease %s is held by another process",
                    name,
                    names[name],
                )
            self._spawn("scheduler", lambda: self._schedule(ledger, worker, pool))
            deliveries = DueDeliveries(ledger, engine, self._served, self._replies_wake)
            self._spawn("replies", lambda: deliveries.run(self._stop))
            self._spawn("leases", functools.partial(self._keep, leases, ledger, engine))
            ready = "ready"
            if server is not None:
                self._server = server
                ready = f"ready port={server.start()}"
            if standby:
                ready += f" standby={','.join(standby)}"
            self._say(ready)
            self._announce = True
            log.info(
                "gateway ready: serving %s, standing by for %s, webhook server %s, owner %s",
                ", ".join(sorted(self._serving)) or "nothing",
                ", ".join(standby) or "nothing",
                "off" if server is None else server.url,
                self.owner,
            )
            self._stop.wait()
            self._drain(pool)
        finally:
            if server is not None:
                server.stop()  # at once when the drain stopped it already
            if dispatcher is not None and dispatching is not None:
                dispatcher.stop()
                dispatching.join()
            for listener in list(self._listeners.values()):
                listener.stop()
            if leases is not None:
                leases.release_all()  # the turns have ended or stopped: a standby may start
            for adapter in adapters.values():
                adapter.close()
            if self._model is None and isinstance(model, OpenAIChatClient):
                model.close()
            ledger.close()
        log.info("gateway stopped")
        return 0

    # -- bot leases: taking platforms over and losing them -------------------------------------
    def _gain(
        self,
        name: str,
        ledger: Ledger,
        engine: ReplyEngine,
        listen: Callable[[PlatformConfig], Listener | None],
    ) -> None:
        """The lease of platform ``name`` is ours: its recovery, then its listener, then the
        scheduler and the reply thread serve it (the boot's order, for this platform)."""
        deliver_committed(ledger, engine, {name})
        with self._lock:
            skip = set(self._resumes) | {item.inbound_id for item in self._running.values()}
        resumes = sweep_turns(ledger, engine, self.owner, {name}, skip=skip)
        platform = next(p for p in self.config.platforms if p.name == name)
        listener = listen(platform)
        with self._lock:
            self._resumes.update(resumes)
            self._serving.add(name)
            if listener is not None:
                self._listeners[name] = listener
        if listener is not None:
            listener.start("discord" if platform.kind == "discord" else "poller")
        if self._announce:
            self._say(f"serving {name}")
        self._wake.set()
        self._replies_wake.set()

    def _lose(self, name: str) -> None:
        """The lease of platform ``name`` is gone: its inbound stops now, nothing new of it is
        scheduled or delivered here; its running turns go on under their own turn leases."""
        with self._lock:
            self._serving.discard(name)
            listener = self._listeners.pop(name, None)
        if listener is not None:
            listener.stop()
        if self._announce and not self._stop.is_set():
            self._say(f"standby {name}")

    def _keep(self, leases: BotLeases, ledger: Ledger, engine: ReplyEngine) -> None:
        """The lease thread: renew and ask for the bot leases; take over the turns of the
        platforms served whose turn lease ran out (their owner lost it without dying here)."""
        sweeping = StoreOutage(log, "looking for turns to take over")
        while not self._stop.wait(leases.interval_seconds):
            leases.renew()
            if self._stop.is_set():
                return
            leases.acquire()
            with self._lock:
                serving = set(self._serving)
                skip = set(self._resumes) | {item.inbound_id for item in self._running.values()}
            try:
                found = sweep_turns(ledger, engine, self.owner, serving, skip=skip, quiet=True)
            except Exception as exc:
                sweeping.failed(exc)
                continue
            sweeping.answered()
            if found:
                with self._lock:
                    self._resumes.update(found)
                self._wake.set()

    def _listener(
        self,
        platform: PlatformConfig,
        *,
        tokens: dict[str, str],
        bots: dict[str, str],
        admitter: Admitter,
    ) -> Listener | None:
        """A new listener for ``platform``, or None when its messages are pushed to us."""
        assert self._ledger is not None
        if platform.kind == "telegram" and platform.inbound == "polling":
            return TelegramListener(
                platform,
                tokens[platform.name],
                bots[platform.name],
                admitter,
                poll_timeout_seconds=self.poll_timeout_seconds,
            )
        if platform.kind == "discord":
            return DiscordListener(platform, tokens[platform.name], admitter, self._ledger)
        return None

    def _served(self) -> list[str]:
        with self._lock:
            return sorted(self._serving)

    def _say(self, line: str) -> None:
        if self.out is not None:
            self.out.write(line + "\n")
            self.out.flush()

    def _webhook_server(
        self, admit: Callable[[PlatformConfig, TelegramInbound | WebhookInbound], Admitted]
    ) -> WebhookServer | None:
        """The inbound webhook server, when a platform takes its messages by webhook."""
        pushed = [
            p
            for p in self.config.platforms
            if p.kind == "webhook" or (p.kind == "telegram" and p.inbound == "webhook")
        ]
        if not pushed:
            return None
        from oncewire.gateway.webhooks import WebhookServer

        # The server's own drain (requests being admitted) fits in the process's grace period.
        return WebhookServer(self.config, admit, drain_seconds=math.ceil(self.grace_seconds))

    # -- threads ---------------------------------------------------------------------------
    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _schedule(self, ledger: Ledger, worker: TurnWorker, pool: ThreadPoolExecutor) -> None:
        """Start turns as slots and sessions free up: woken by the inbox's commits (an
        admission, a turn answered or superseded, an interrupt recorded, in any process) and by
        this process's turns ending; see :data:`SAFETY_LOOK_SECONDS` for the looks without."""

        def changed() -> None:
            self._store_changed.set()
            self._wake.set()

        unsubscribe = ledger.store.subscribe_inbound(changed)
        try:
            self._schedule_loop(ledger, worker, pool)
        finally:
            unsubscribe()

    def _schedule_loop(self, ledger: Ledger, worker: TurnWorker, pool: ThreadPoolExecutor) -> None:
        limit = self.config.turns.max_concurrent
        scheduling = StoreOutage(log, "scheduling")
        while not self._stop.is_set():
            self._wake.clear()
            if self._store_changed.is_set():
                self._store_changed.clear()
                with self._lock:
                    self._busy.clear()  # the commit may have ended their turns: ask again
            away = False
            try:
                self._read_unread()
                self._signal_interrupts(ledger)
                for inbound_id, session, fence in self._candidates(ledger, limit):
                    with self._lock:
                        if self._stop.is_set() or len(self._running) >= limit:
                            break
                        if session in self._running:
                            continue
                        interrupt = Interrupt()
                        future = pool.submit(worker.run, inbound_id, interrupt, resume_fence=fence)
                        self._running[session] = _Running(inbound_id, interrupt, future)
                        if fence is not None:
                            self._resumes.pop(inbound_id, None)
                    future.add_done_callback(functools.partial(self._finished, session))
            except Exception as exc:
                scheduling.failed(exc)
                away = True
            else:
                scheduling.answered()
            with self._lock:
                away = away or bool(self._unread)
            if not self._wake.wait(OUTAGE_LOOK_SECONDS if away else SAFETY_LOOK_SECONDS):
                self._store_changed.set()  # a look without a wake-up asks every session again

    def _signal_interrupts(self, ledger: Ledger) -> None:
        """Signal the workers whose turn has an interrupt recorded (the store is the truth)."""
        with self._lock:
            running = list(self._running.values())
        for item in running:
            if item.interrupt.is_set():
                continue
            try:
                status = ledger.runs.get(f"turn:{item.inbound_id}").status
            except OncewireError:
                continue  # not started yet (or a /stop, which has no turn)
            if status == "interrupting":
                log.info("inbound %s: its turn's interrupt is recorded; signalled", item.inbound_id)
                item.interrupt.interrupt()

    def _candidates(self, ledger: Ledger, limit: int) -> list[tuple[int, SessionKey, int | None]]:
        """Turns to start now, oldest first: the resumes, then each free session's first
        message, as many as there are free slots (one indexed read: the sessions this process
        runs, or found busy, are asked for on top and left out here)."""
        found: list[tuple[int, SessionKey, int | None]] = []
        with self._lock:
            resumes = sorted(self._resumes.items())
            serving = sorted(self._serving)
            taken = set(self._running) | self._busy
            free = limit - len(self._running)
        for inbound_id, fence in resumes:
            inbound = ledger.inbound.get(inbound_id)
            if inbound.platform not in serving:
                continue  # its lease was lost: the process holding it now resumes it
            key = (inbound.platform, inbound.bot, inbound.chat, inbound.thread)
            taken.add(key)
            found.append((inbound_id, key, fence))
        if free <= len(found) or not serving:
            return found
        # Each session offers one message, so at most len(taken) of these are left out.
        for inbound in ledger.inbound.queued(serving, limit=free - len(found) + len(taken)):
            key = (inbound.platform, inbound.bot, inbound.chat, inbound.thread)
            if key not in taken:
                found.append((inbound.id, key, None))
        return found

    def _finished(self, session: SessionKey, done: Future[TurnResult]) -> None:
        with self._lock:
            running = self._running.pop(session, None)
        try:
            result = done.result()
        except BaseException as exc:
            if store_away(exc):
                # Nothing of the turn is recorded that did not happen (its commit failed); it
                # is still this process's, and is taken over again once the store answers.
                log.warning(
                    "inbound %s: its turn stopped: the store is unavailable (%s)",
                    running.inbound_id if running is not None else "?",
                    exc,
                )
            else:
                log.exception("a turn failed unexpectedly")
            if running is not None and not self._stop.is_set():
                self._retry(running.inbound_id)
        else:
            if result.status == "quarantined":
                log.warning("inbound %s: quarantined after too many starts", result.inbound_id)
            elif result.status == "busy":
                # Another process's turn holds the session: asked again after a commit that
                # may have ended it (not at once: that would only be refused again).
                log.debug("inbound %s: its session is busy", result.inbound_id)
                with self._lock:
                    self._busy.add(session)
        self._wake.set()  # a slot is free

    def _retry(self, inbound_id: int) -> None:
        """A turn that raised is still active under this process: take it over again (one
        more start: past max_starts its message is quarantined, so a message that keeps
        failing cannot hold its session for ever)."""
        try:
            assert self._ledger is not None
            run = self._ledger.runs.get(f"turn:{inbound_id}")
        except Exception as exc:
            if store_away(exc):
                # Read again at the scheduler's next looks: the turn is resumed as soon as the
                # store answers, not only once its turn lease has run out.
                with self._lock:
                    self._unread.add(inbound_id)
                return
            log.exception("inbound %s: its turn cannot be read; left to the next start", inbound_id)
            return
        with self._lock:
            self._unread.discard(inbound_id)
        if run.active and run.owner == self.owner:
            with self._lock:
                self._resumes[inbound_id] = run.fence

    def _read_unread(self) -> None:
        """Read again the turns that stopped while the store was away (see :meth:`_retry`)."""
        with self._lock:
            unread = sorted(self._unread)
        for inbound_id in unread:
            self._retry(inbound_id)

    # -- the drain -------------------------------------------------------------------------
    def _drain(self, pool: ThreadPoolExecutor) -> None:
        log.info("draining: inbound stops, running turns get %.1fs", self.grace_seconds)
        if self._server is not None:
            # No new POST is taken; the ones being admitted are answered (2xx once committed).
            self._server.stop()
        with self._lock:
            self._serving.clear()
            listeners = list(self._listeners.values())
            self._listeners.clear()
        for listener in listeners:
            listener.stop()
        deadline = time.monotonic() + self.grace_seconds
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            running = list(self._running.values())
        for item in running:
            try:
                item.future.result(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
            except BaseException:
                continue  # logged by _finished
        with self._lock:
            left = list(self._running.values())
        for item in left:
            log.info(
                "inbound %s still running after the grace period: interrupted", item.inbound_id
            )
            item.interrupt.interrupt()
        pool.shutdown(wait=True, cancel_futures=True)
