"""``oncewire gateway run``: one process owning one store, its pollers, turns and deliveries.

Boot, in order, driven only by rows (nothing is read from a transcript, nothing is guessed):

1. open the store (``[store] db``; migrations run);
2. ``engine.recover()``: operations a dead process left in flight become ``ambiguous`` and
   every committed reply is delivered (or scheduled, as its record says);
3. turns whose owner is gone (a process on this host that died, or a lease that ran out) are
   taken over: ended ``answered`` when their reply is committed (a guard: T5 commits both at
   once), ended ``interrupted`` when an interrupt was recorded (their message ``superseded``
   and their reply withdrawn in the same transaction, then delivered: the previews deleted)
   or their message was superseded, resumed otherwise (the model is asked again, with
   ``[turns] resume_note``);
4. ``received`` messages are scheduled, per session in id order;
5. with ``[[tools]]``, a :class:`~oncewire.Dispatcher` thread that runs the tools' effects
   (:mod:`oncewire.gateway.tools`; a resumed turn's unfinished calls included: an effect a dead
   process left claimed is redelivered, flagged);
6. a poller thread per Telegram platform with ``inbound = "polling"``: each update is admitted
   (T1, :mod:`oncewire.gateway.admission`) and only then confirmed to Telegram; a Gateway
   thread per Discord platform
   (:class:`~oncewire.gateway.platforms.discord_gateway.GatewayClient`): each message is
   admitted before its dispatch's ``seq`` is trusted, and a fresh session backfills over REST
   what the channels active in the last :data:`DISCORD_BACKFILL_MAX_AGE_SECONDS` got since
   their last admitted message;
7. when a platform takes its messages by webhook (a Telegram platform with ``inbound =
   "webhook"``, a ``kind = "webhook"`` platform), the webhook server
   (:mod:`oncewire.gateway.webhooks`) on ``[webhooks] bind``: each POST is admitted by the
   same T1 and answered 2xx only once that committed; then the line ``ready`` is printed on
   stdout (``ready port=N`` with the webhook server, N the port it listens on, so ``bind``
   may ask for port 0).

Replies go out through each platform's adapter: the Telegram Bot API or Discord's REST API
(editable, previews when ``streaming``; on Discord every create carries a nonce), or the
generic webhook platform's ``send_url`` (non-editable: one message per chunk, no preview).

A scheduler thread starts turns (:mod:`oncewire.gateway.turn`) on a pool of ``[turns]
max_concurrent`` worker threads, one turn per session at a time (the run ledger's
one-active-run-per-branch index holds it; the scheduler only avoids asking twice), and a reply
thread delivers replies whose retry time has come (``engine.run_due``). At each look the
scheduler also reads the status of the turns it runs: one whose interrupt was recorded (at a
newer message's admission, or ``/stop``: :mod:`oncewire.gateway.sessions`) has its worker
signalled (its model stream or tool wait ends), and the worker ends it ``interrupted``.

:meth:`Runner.stop` (SIGTERM or SIGINT) drains: the webhook server stops accepting and answers
the POSTs it is admitting, the pollers stop at once (an update not yet admitted stays with
Telegram; a POST not answered 2xx is delivered again by its platform), no new turn starts,
running turns get ``grace_seconds`` to finish and deliver; a turn still running then is
interrupted where it stands and left to the next process, which resumes it. The dispatcher
stops last (its tool calls in flight get its own grace period; one still running then stays
claimed for the next process). The process then exits 0.

Not yet: the busy modes steer and reject, a bot lease that refuses a second gateway
on the same store, renewal of long turns' leases.
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
from oncewire.core.ids import owner_is_dead_locally, this_process_owner
from oncewire.dispatch import Dispatcher
from oncewire.gateway.admission import Admitter, last_admitted, telegram_bot_id
from oncewire.gateway.config import GatewayConfig, PlatformConfig
from oncewire.gateway.http import Timeouts
from oncewire.gateway.model import OpenAIChatClient
from oncewire.gateway.model_results import Interrupt, ModelClient
from oncewire.gateway.platforms.discord import DiscordApi, DiscordBot
from oncewire.gateway.platforms.telegram import (
    BotUnauthorized,
    PollConflict,
    TelegramBot,
    TelegramUnavailable,
)
from oncewire.gateway.platforms.telegram_updates import TelegramInbound, UpdatePoller
from oncewire.gateway.platforms.webhook import WebhookInbound, WebhookPlatform
from oncewire.gateway.ratelimit import RateLimiter, RateLimits
from oncewire.gateway.tools import ToolRegistry
from oncewire.gateway.turn import (
    TurnResult,
    TurnSettings,
    TurnWorker,
    end_interrupted_in_tx,
)
from oncewire.inbound import InboundState
from oncewire.ledger import Ledger
from oncewire.replies import Platform, ReplyEngine, ReplyState

if TYPE_CHECKING:  # the server needs the gateway extra's starlette and uvicorn
    from oncewire.gateway.webhooks import WebhookServer

__all__ = ["Runner", "SessionKey"]

log = logging.getLogger("oncewire.gateway.runner")

SessionKey = tuple[str, str, str, str]  # platform, bot, chat, thread
TURN_STATUSES = ("running", "interrupting")  # a turn run that is still active
IDLE_POLL_SECONDS = 1.0  # the scheduler looks at the store at least this often
POLL_BACKOFF_SECONDS = (1.0, 30.0)  # a failing poller's first and longest wait
DISCORD_BACKFILL_MAX_AGE_SECONDS = 24 * 3600.0  # a channel quiet longer is not backfilled


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
        self._lock = threading.Lock()
        self._running: dict[SessionKey, _Running] = {}
        self._resumes: dict[int, int] = {}  # inbound id -> the fence its dead owner held
        self._threads: list[threading.Thread] = []
        self._pollers: list[UpdatePoller] = []
        self._stoppers: list[Callable[[], None]] = []  # Discord Gateway clients' stop()
        self._server: WebhookServer | None = None
        self._ledger: Ledger | None = None

    def stop(self) -> None:
        """Begin the drain (safe from a signal handler: it only sets a flag)."""
        self._stop.set()
        self._wake.set()

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
        ) -> None:
            assert admitter is not None  # the server starts after the admitter is made
            admitter.admit_pushed(platform, message)

        # Made before the store opens: a secret it needs that is not set stops the start here.
        server = self._webhook_server(admit_pushed)
        model = self._model or OpenAIChatClient.from_config(config.model)
        adapters: dict[str, TelegramBot | WebhookPlatform | DiscordBot] = {}
        ledger = Ledger(config.store.db)
        dispatcher: Dispatcher | None = None
        dispatching: threading.Thread | None = None
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
                    max_steps=config.turns.max_steps,
                ),
                owner=self.owner,
                tools=tools,
                wake_tools=None if dispatcher is None else dispatcher.wake,
            )
            self._boot(ledger, engine)
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
            self._spawn("scheduler", lambda: self._schedule(ledger, worker, pool))
            self._spawn("replies", lambda: self._deliver_due(engine))
            for p in telegram:
                if p.inbound == "polling":
                    self._start_poller(p, tokens[p.name], bots[p.name], admitter)
            for p in discord:
                self._start_discord(p, tokens[p.name], admitter, ledger)
            ready = "ready"
            if server is not None:
                self._server = server
                ready = f"ready port={server.start()}"
            if self.out is not None:
                self.out.write(ready + "\n")
                self.out.flush()
            log.info(
                "gateway ready: %s poller(s), webhook server %s, owner %s",
                len(self._pollers),
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
            for poller in self._pollers:
                poller.close()
            for stop in self._stoppers:
                stop()
            for adapter in adapters.values():
                adapter.close()
            if self._model is None and isinstance(model, OpenAIChatClient):
                model.close()
            ledger.close()
        log.info("gateway stopped")
        return 0

    # -- boot ------------------------------------------------------------------------------
    def _boot(self, ledger: Ledger, engine: ReplyEngine) -> None:
        report = engine.recover()
        log.info(
            "recovery: %s delivered, %s scheduled, %s dead, %s withdrawn, %s unanswered",
            len(report.delivered),
            len(report.scheduled),
            len(report.dead),
            len(report.withdrawn),
            len(report.unanswered),
        )
        now = ledger.clock.now()
        after = ""
        while True:
            rows = ledger.runs.list(status=TURN_STATUSES, limit=500, after_run_id=after)
            for row in rows:
                if row.workflow != "turn" or row.turn is None or not row.turn.isdigit():
                    continue
                inbound_id = int(row.turn)
                gone = row.owner is None or owner_is_dead_locally(row.owner)
                expired = row.lease_expires_at is not None and row.lease_expires_at <= now
                if not (gone or expired):
                    log.warning(
                        "turn %s is held by %s, which may be alive; left to it",
                        row.run_id,
                        row.owner,
                    )
                    continue
                self._take_over(ledger, engine, inbound_id, row.fence)
            if len(rows) < 500:
                break
            after = rows[-1].run_id

    def _take_over(self, ledger: Ledger, engine: ReplyEngine, inbound_id: int, fence: int) -> None:
        inbound = ledger.inbound.get(inbound_id)
        reply = ledger.replies.for_inbound(inbound_id)
        turn = ledger.runs.turn
        ending: tuple[str, str, str | None] | None = None
        run = ledger.runs.get(f"turn:{inbound_id}")
        if reply is not None and reply.state is not ReplyState.OPEN and not reply.withdrawal:
            ending = ("answered", "final_answer", reply.final_text)
        elif run.status == "interrupting" and inbound.platform in engine.platforms:
            # Its interrupt was recorded: never resumed; ended as its worker would have.
            with ledger.transaction() as tx:
                taken = turn.resume_in_tx(
                    tx, inbound_id, owner=self.owner, from_fence=fence, lease_seconds=60.0
                )
                profile = engine.platform(inbound.platform).profile
                end_interrupted_in_tx(ledger, tx, taken.run, profile)
            withdrawn = ledger.replies.for_inbound(inbound_id)
            if withdrawn is not None:
                engine.deliver(withdrawn.id)
            log.info("turn:%s taken over and ended interrupted", inbound_id)
            return
        elif inbound.status is InboundState.SUPERSEDED:
            ending = ("interrupted", "superseded", None)
        if ending is None:
            if inbound.platform not in engine.platforms:
                log.warning(
                    "turn:%s is on platform %s, not served here", inbound_id, inbound.platform
                )
                return
            log.info("turn:%s will be resumed (its owner is gone)", inbound_id)
            self._resumes[inbound_id] = fence
            return
        status, reason, text = ending
        with ledger.transaction() as tx:
            taken = turn.resume_in_tx(
                tx, inbound_id, owner=self.owner, from_fence=fence, lease_seconds=60.0
            )
            turn.terminate_in_tx(
                tx, inbound_id, status, reason=reason, reply_text=text, fence=taken.run.fence
            )
        log.info("turn:%s taken over and ended %s", inbound_id, status)

    def _webhook_server(
        self, admit: Callable[[PlatformConfig, TelegramInbound | WebhookInbound], None]
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

    def _start_poller(
        self, platform: PlatformConfig, token: str, bot: str, admitter: Admitter
    ) -> None:
        assert platform.api_base is not None
        poller = UpdatePoller(
            token, api_base=platform.api_base, poll_timeout_seconds=self.poll_timeout_seconds
        )
        self._pollers.append(poller)

        def loop() -> None:
            backoff = POLL_BACKOFF_SECONDS[0]
            while not self._stop.is_set():
                try:
                    for message in poller.poll():
                        admitter.admit_telegram(platform, bot, message)
                        poller.confirm(message.update_id)  # only after the admission committed
                    backoff = POLL_BACKOFF_SECONDS[0]
                    continue
                except BotUnauthorized as exc:
                    log.error("platform %s: the Bot API refused the token: %s", platform.name, exc)
                    return
                except TelegramUnavailable as exc:
                    wait = exc.retry_after if exc.retry_after is not None else backoff
                    log.warning(
                        "platform %s: polling failed (%s); again in %.1fs", platform.name, exc, wait
                    )
                except PollConflict as exc:
                    wait = backoff
                    log.warning("platform %s: %s; again in %.1fs", platform.name, exc, wait)
                except Exception:
                    # An admission that failed is not confirmed: the next poll serves it again.
                    wait = backoff
                    log.exception(
                        "platform %s: admission failed; again in %.1fs", platform.name, wait
                    )
                backoff = min(POLL_BACKOFF_SECONDS[1], backoff * 2)
                self._stop.wait(wait)

        self._spawn(f"poller-{platform.name}", loop)

    def _start_discord(
        self, platform: PlatformConfig, token: str, admitter: Admitter, ledger: Ledger
    ) -> None:
        # Imported here: it needs websockets, which a gateway without Discord does without.
        from oncewire.gateway.platforms.discord_gateway import GatewayClient, GatewayRefused

        assert platform.api_base is not None
        api = DiscordApi(token, api_base=platform.api_base)
        client = GatewayClient(
            token,
            api,
            lambda message: admitter.admit_discord(platform, message),
            since=lambda: last_admitted(
                ledger, platform.name, max_age_seconds=DISCORD_BACKFILL_MAX_AGE_SECONDS
            ),
        )
        self._stoppers += [client.stop, api.close]

        def loop() -> None:
            try:
                client.run()
            except GatewayRefused as exc:
                log.error("platform %s: the Discord Gateway refused: %s", platform.name, exc)
            except Exception:
                log.exception("platform %s: the Discord Gateway client failed", platform.name)

        self._spawn(f"discord-{platform.name}", loop)

    def _schedule(self, ledger: Ledger, worker: TurnWorker, pool: ThreadPoolExecutor) -> None:
        limit = self.config.turns.max_concurrent
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self._signal_interrupts(ledger)
                for inbound_id, session, fence in self._candidates(ledger, worker):
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
            except Exception:
                log.exception("scheduling failed; trying again")
            self._wake.wait(IDLE_POLL_SECONDS)

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

    def _candidates(
        self, ledger: Ledger, worker: TurnWorker
    ) -> list[tuple[int, SessionKey, int | None]]:
        """Turns to start now, oldest first: the resumes, then each session's first message."""
        seen: set[SessionKey] = set()
        found: list[tuple[int, SessionKey, int | None]] = []
        with self._lock:
            resumes = sorted(self._resumes.items())
        for inbound_id, fence in resumes:
            inbound = ledger.inbound.get(inbound_id)
            key = (inbound.platform, inbound.bot, inbound.chat, inbound.thread)
            seen.add(key)
            found.append((inbound_id, key, fence))
        after = 0
        while True:
            page = ledger.inbound.list(InboundState.RECEIVED, limit=500, after_id=after)
            for inbound in page:
                key = (inbound.platform, inbound.bot, inbound.chat, inbound.thread)
                if key in seen or inbound.platform not in worker.platforms:
                    continue
                seen.add(key)
                found.append((inbound.id, key, None))
            if len(page) < 500:
                return found
            after = page[-1].id

    def _finished(self, session: SessionKey, done: Future[TurnResult]) -> None:
        with self._lock:
            running = self._running.pop(session, None)
        try:
            result = done.result()
        except BaseException:
            log.exception("a turn failed unexpectedly")
            if running is not None and not self._stop.is_set():
                self._retry(running.inbound_id)
        else:
            if result.status == "quarantined":
                log.warning("inbound %s: quarantined after too many starts", result.inbound_id)
            elif result.status == "busy":
                # Another process's turn holds the session; asked again at the next look.
                log.debug("inbound %s: its session is busy", result.inbound_id)
        self._wake.set()

    def _retry(self, inbound_id: int) -> None:
        """A turn that raised is still active under this process: take it over again (one
        more start: past max_starts its message is quarantined, so a message that keeps
        failing cannot hold its session for ever)."""
        try:
            assert self._ledger is not None
            run = self._ledger.runs.get(f"turn:{inbound_id}")
        except Exception:
            log.exception("inbound %s: its turn cannot be read; left to the next start", inbound_id)
            return
        if run.active and run.owner == self.owner:
            with self._lock:
                self._resumes[inbound_id] = run.fence

    def _deliver_due(self, engine: ReplyEngine) -> None:
        while not self._stop.is_set():
            try:
                engine.run_due()
            except Exception:
                log.exception("delivering due replies failed; trying again")
            self._stop.wait(IDLE_POLL_SECONDS)

    # -- the drain -------------------------------------------------------------------------
    def _drain(self, pool: ThreadPoolExecutor) -> None:
        log.info("draining: inbound stops, running turns get %.1fs", self.grace_seconds)
        if self._server is not None:
            # No new POST is taken; the ones being admitted are answered (2xx once committed).
            self._server.stop()
        for poller in self._pollers:
            poller.stop()
        for stop in self._stoppers:
            stop()
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
