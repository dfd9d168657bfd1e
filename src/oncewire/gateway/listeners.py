"""The threads that take a bot's messages in, each started and stopped on its own.

A :class:`TelegramListener` long-polls one bot (``inbound = "polling"``): each update is
admitted (T1) and only then confirmed to Telegram. A :class:`DiscordListener` keeps one bot's
Gateway connection: each message is admitted before its dispatch's ``seq`` is trusted, and a
fresh session backfills what the channels active in the last
:data:`DISCORD_BACKFILL_MAX_AGE_SECONDS` got since their last admitted message.

The runner starts a bot's listener once it holds the bot's lease and stops it the moment the
lease is lost or the process drains: :meth:`stop` ends a long poll or the Gateway connection at
once and returns when the thread has ended (bounded), so a bot is never polled by a listener
whose lease is gone while a new one starts. An update not yet admitted stays with the
platform, which serves it to the next listener.
"""

from __future__ import annotations

import logging
import threading

from oncewire.gateway.admission import Admitter, last_admitted
from oncewire.gateway.config import PlatformConfig
from oncewire.gateway.outage import StoreOutage, store_away
from oncewire.gateway.platforms.discord import DiscordApi
from oncewire.gateway.platforms.telegram import BotUnauthorized, PollConflict, TelegramUnavailable
from oncewire.gateway.platforms.telegram_updates import UpdatePoller
from oncewire.ledger import Ledger

__all__ = [
    "DISCORD_BACKFILL_MAX_AGE_SECONDS",
    "DiscordListener",
    "Listener",
    "TelegramListener",
]

log = logging.getLogger("oncewire.gateway.runner")

POLL_BACKOFF_SECONDS = (1.0, 30.0)  # a failing poller's first and longest wait
DISCORD_BACKFILL_MAX_AGE_SECONDS = 24 * 3600.0  # a channel quiet longer is not backfilled
STOP_JOIN_SECONDS = 30.0  # how long stop() waits for the thread (an admission in progress)


class Listener:
    """One bot's inbound thread; subclasses say what the thread does and how it is ended."""

    def __init__(self, platform: PlatformConfig) -> None:
        self.platform = platform
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, prefix: str) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"{prefix}-{self.platform.name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """End the inbound now; return once the thread has (or after STOP_JOIN_SECONDS)."""
        self._stop.set()
        self._interrupt()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(STOP_JOIN_SECONDS)
        self._close()

    def _run(self) -> None:
        raise NotImplementedError

    def _interrupt(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        pass


class TelegramListener(Listener):
    """Long-polls one Telegram bot."""

    def __init__(
        self,
        platform: PlatformConfig,
        token: str,
        bot: str,
        admitter: Admitter,
        *,
        poll_timeout_seconds: int,
    ) -> None:
        super().__init__(platform)
        assert platform.api_base is not None
        self.bot = bot
        self.admitter = admitter
        self.poller = UpdatePoller(
            token, api_base=platform.api_base, poll_timeout_seconds=poll_timeout_seconds
        )

    def _interrupt(self) -> None:
        self.poller.stop()  # shuts the long poll's socket: poll() returns at once

    def _close(self) -> None:
        self.poller.close()

    def _run(self) -> None:
        platform, poller = self.platform, self.poller
        backoff = POLL_BACKOFF_SECONDS[0]
        outage = StoreOutage(log, f"platform {platform.name}: admission")
        while not self._stop.is_set():
            try:
                for message in poller.poll():
                    self.admitter.admit_telegram(platform, self.bot, message)
                    poller.confirm(message.update_id)  # only after the admission committed
                    outage.answered()
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
            except Exception as exc:
                # An admission that failed is not confirmed: the next poll serves it again.
                wait = backoff
                if store_away(exc):  # one line per outage, not a traceback per poll
                    outage.failed(exc)
                else:
                    log.exception(
                        "platform %s: admission failed; again in %.1fs", platform.name, wait
                    )
            backoff = min(POLL_BACKOFF_SECONDS[1], backoff * 2)
            self._stop.wait(wait)


class DiscordListener(Listener):
    """Keeps one Discord bot's Gateway connection."""

    def __init__(
        self, platform: PlatformConfig, token: str, admitter: Admitter, ledger: Ledger
    ) -> None:
        super().__init__(platform)
        # Imported here: it needs websockets, which a gateway without Discord does without.
        from oncewire.gateway.platforms.discord_gateway import GatewayClient

        assert platform.api_base is not None
        self.api = DiscordApi(token, api_base=platform.api_base)
        self.client = GatewayClient(
            token,
            self.api,
            lambda message: admitter.admit_discord(platform, message),
            since=lambda: last_admitted(
                ledger, platform.name, max_age_seconds=DISCORD_BACKFILL_MAX_AGE_SECONDS
            ),
        )

    def _interrupt(self) -> None:
        self.client.stop()

    def _close(self) -> None:
        self.api.close()

    def _run(self) -> None:
        from oncewire.gateway.platforms.discord_gateway import GatewayRefused

        name = self.platform.name
        try:
            self.client.run()
        except GatewayRefused as exc:
            log.error("platform %s: the Discord Gateway refused: %s", name, exc)
        except Exception:
            log.exception("platform %s: the Discord Gateway client failed", name)
