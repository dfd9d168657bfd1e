"""Discord inbound over the Gateway (a WebSocket), each message admitted before its ``seq`` is
trusted, and a REST backfill of what arrived while no session was there.

:class:`GatewayClient` keeps one connection (``websockets``' sync client, one thread):

1. the Gateway's URL comes from ``GET {api_base}/gateway/bot``, as Discord intends;
2. on Hello (op 10) it sends Identify (op 2, with the MESSAGE_CONTENT intent: without it a
   guild message arrives without its text) or, when it holds a session, Resume (op 6, the
   session id and the last trusted ``seq``) to the session's ``resume_gateway_url``;
3. it heartbeats (op 1, the last trusted ``seq``) every ``heartbeat_interval``; a heartbeat
   that was not acknowledged (op 11) by the next one means a dead connection: it closes it and
   resumes on a new one. Reconnect (op 7) and a resumable Invalid Session (op 9, ``d`` true)
   resume too; a non-resumable one drops the session and identifies afresh;
4. each ``MESSAGE_CREATE`` is handed to ``on_message`` (the admission, T1), and only once that
   returns does the dispatch's ``s`` become the trusted ``seq``. When it raises (the store
   failed), the connection is closed and the session resumed from the last trusted ``seq``:
   Discord replays the dispatch, and admission dedups whatever it had admitted.

After a fresh Identify (a new process, or a session Discord no longer resumes), events missed
meanwhile are not replayed by Discord. The client then reads each active channel's messages
since the last one admitted (``since()``: channel id → message id, from the store, bounded in
age by the caller, merged with what this client admitted) over REST, oldest first, and hands
them to ``on_message`` like dispatches. Admission keys messages by their id, so a message seen
both ways is admitted once.

Messages from bots (the bot's own included) are handed on like any other, marked
``author_is_bot``: the admission refuses them. A message in a thread names the thread's parent
channel as its chat (one ``GET /channels/{id}`` per channel, cached), so a thread is a session
of its own inside the chat.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from oncewire.core.extras import refusal

try:
    from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
    from websockets.sync.client import connect
    from websockets.sync.connection import Connection
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("gateway", "oncewire's Discord gateway", exc) from exc

from oncewire.gateway.platforms.discord import DiscordApi, DiscordUnavailable, raise_for

__all__ = [
    "DEFAULT_INTENTS",
    "MESSAGE_CONTENT",
    "DiscordInbound",
    "GatewayClient",
    "GatewayRefused",
    "parse_message",
]

log = logging.getLogger("oncewire.gateway.discord")

GUILD_MESSAGES = 1 << 9
DIRECT_MESSAGES = 1 << 12
MESSAGE_CONTENT = 1 << 15
DEFAULT_INTENTS = GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT
THREAD_TYPES = (10, 11, 12)  # announcement, public and private threads
# Close codes after which identifying again cannot help: the configuration must change.
FATAL_CLOSE_CODES = {
    4004: "authentication failed (the token)",
    4010: "invalid shard",
    4011: "sharding required",
    4012: "invalid API version",
    4013: "invalid intents",
    4014: "disallowed intents (enable the message content intent for the application)",
}
# Close codes after which the session cannot be resumed: identify afresh (and backfill).
SESSION_ENDED_CLOSE_CODES = (4007, 4009)  # invalid seq, session timed out
# A close code of ours that is not 1000/1001, so Discord keeps the session for a resume.
RESUME_CLOSE = 4900
RECONNECT_WAIT_SECONDS = (1.0, 30.0)  # first and longest wait between failed connections
BACKFILL_PAGE = 100


class GatewayRefused(Exception):
    """Discord closed the Gateway for a reason identifying again cannot fix."""


@dataclass(frozen=True, slots=True)
class DiscordInbound:
    """One message; ``message_id`` (a snowflake, unique across Discord) is its key. ``chat`` is
    the channel, or a thread's parent channel (``thread`` then names the thread)."""

    message_id: str
    chat: str
    thread: str  # "" outside threads
    guild_id: str | None
    author_id: str
    author_is_bot: bool
    author_username: str
    text: str
    timestamp: str
    bot_id: str  # the receiving bot's user id (the inbox keys messages by it)
    seq: int | None  # the dispatch's s; None for a message read by a backfill

    @property
    def channel(self) -> str:
        """The channel it was posted in (the thread, when in one)."""
        return self.thread or self.chat


def parse_message(
    data: Mapping[str, Any], *, parent: str | None, bot_id: str, seq: int | None
) -> DiscordInbound | None:
    """The message a ``MESSAGE_CREATE`` (or a listed message) carries; ``parent`` is its
    channel's parent when that channel is a thread. None when it carries nothing to admit."""
    message_id, channel = data.get("id"), data.get("channel_id")
    author = data.get("author")
    if not isinstance(message_id, str) or not isinstance(channel, str):
        return None
    if not isinstance(author, Mapping) or not isinstance(author.get("id"), str):
        return None
    if data.get("type", 0) not in (0, 19):  # a default message or a reply; not system ones
        return None
    content = data.get("content")
    guild = data.get("guild_id")
    return DiscordInbound(
        message_id=message_id,
        chat=parent if parent is not None else channel,
        thread=channel if parent is not None else "",
        guild_id=guild if isinstance(guild, str) else None,
        author_id=author["id"],
        author_is_bot=author.get("bot") is True or author["id"] == bot_id,
        author_username=str(author.get("username", "")),
        text=content if isinstance(content, str) else "",
        timestamp=str(data.get("timestamp", "")),
        bot_id=bot_id,
        seq=seq,
    )


class _Reconnect(Exception):
    """End this connection and open another (resuming when the session allows)."""


class GatewayClient:
    """One bot's Gateway connection, kept up by :meth:`run` until :meth:`stop`.

    ``on_message`` admits one message (T1) and raises when it did not commit. ``since()``
    names, per active channel, the last message admitted (the store's word, bounded in age).
    """

    def __init__(
        self,
        token: str,
        api: DiscordApi,
        on_message: Callable[[DiscordInbound], object],
        *,
        since: Callable[[], Mapping[str, str]] = dict,
        intents: int = DEFAULT_INTENTS,
        open_timeout_seconds: float = 10.0,
    ) -> None:
        self._token = token
        self.api = api
        self.on_message = on_message
        self.since = since
        self.intents = intents
        self.open_timeout_seconds = open_timeout_seconds
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._ws: Connection | None = None
        self._session_id: str | None = None
        self._resume_url: str | None = None
        self._seq: int | None = None  # the last dispatch whose handling committed
        self.bot_id: str | None = None
        self._parents: dict[str, str | None] = {}  # channel -> its parent when it is a thread
        self._admitted: dict[str, int] = {}  # channel -> the newest message admitted here
        self.identifies = 0
        self.resumes = 0

    def __repr__(self) -> str:
        return f"GatewayClient(api={self.api!r}, session={self._session_id is not None})"

    @property
    def seq(self) -> int | None:
        return self._seq

    def stop(self) -> None:
        """End :meth:`run` promptly: the connection is closed (the session stays resumable)."""
        self._stopped.set()
        with self._lock:
            ws = self._ws
        if ws is not None:
            threading.Thread(target=ws.close, args=(RESUME_CLOSE, "stopping"), daemon=True).start()

    def run(self) -> None:
        """Connect, serve, reconnect, until :meth:`stop`. Raises :class:`GatewayRefused` when
        Discord refuses the token or the intents (no reconnect can help)."""
        wait = RECONNECT_WAIT_SECONDS[0]
        while not self._stopped.is_set():
            try:
                url = self._resume_url if self._session_id else self._gateway_url()
                with connect(
                    f"{url}/?v=10&encoding=json",
                    open_timeout=self.open_timeout_seconds,
                    close_timeout=2,
                    proxy=None,
                    compression=None,
                    ping_interval=None,
                    max_size=None,
                ) as ws:
                    with self._lock:
                        self._ws = ws
                    if self._stopped.is_set():
                        break
                    self._serve(ws)
                    wait = RECONNECT_WAIT_SECONDS[0]
                    continue
            except _Reconnect as exc:
                log.info("discord gateway: %s; connecting again", exc)
                wait = RECONNECT_WAIT_SECONDS[0]
                continue
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                if code in FATAL_CLOSE_CODES:
                    raise GatewayRefused(f"close {code}: {FATAL_CLOSE_CODES[code]}") from None
                if code in SESSION_ENDED_CLOSE_CODES:
                    self._session_id = self._resume_url = None
                    self._seq = None
                log.warning("discord gateway closed (%s); connecting again", code)
                wait = RECONNECT_WAIT_SECONDS[0]
                if self._stopped.is_set():
                    break
                continue  # a closed session resumes at once, as Discord asks
            except (OSError, TimeoutError, InvalidHandshake, InvalidURI, DiscordUnavailable) as exc:
                log.warning(
                    "discord gateway unreachable (%s); again in %.1fs",
                    self.api.redact(str(exc)),
                    wait,
                )
            finally:
                with self._lock:
                    self._ws = None
            self._stopped.wait(wait)
            wait = min(RECONNECT_WAIT_SECONDS[1], wait * 2)

    # -- one connection -------------------------------------------------------------------
    def _gateway_url(self) -> str:
        answer = self.api.call("GET", "/gateway/bot")
        raise_for(self.api, "GET /gateway/bot", answer)
        url = answer.body.get("url") if isinstance(answer.body, Mapping) else None
        if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
            raise DiscordUnavailable("GET /gateway/bot: the answer names no Gateway URL")
        return url.rstrip("/")

    def _serve(self, ws: Connection) -> None:
        hello = self._receive(ws, 30.0)
        if hello is None or hello.get("op") != 10:
            raise _Reconnect("no Hello")
        interval = float(hello["d"]["heartbeat_interval"]) / 1000.0
        if self._session_id is not None:
            self.resumes += 1
            self._send(
                ws,
                {
                    "op": 6,
                    "d": {"token": self._token, "session_id": self._session_id, "seq": self._seq},
                },
            )
        else:
            self.identifies += 1
            self._send(
                ws,
                {
                    "op": 2,
                    "d": {
                        "token": self._token,
                        "intents": self.intents,
                        "properties": {"os": "linux", "browser": "oncewire", "device": "oncewire"},
                    },
                },
            )
        next_beat = time.monotonic() + interval * random.random()
        acked = True
        while not self._stopped.is_set():
            frame = self._receive(ws, max(0.0, next_beat - time.monotonic()))
            if frame is None:  # time for a heartbeat
                if not acked:
                    ws.close(RESUME_CLOSE, "heartbeat not acknowledged")
                    raise _Reconnect("a heartbeat was not acknowledged")
                self._send(ws, {"op": 1, "d": self._seq})
                acked, next_beat = False, time.monotonic() + interval
                continue
            op = frame.get("op")
            if op == 11:
                acked = True
            elif op == 1:
                self._send(ws, {"op": 1, "d": self._seq})
            elif op == 7:
                ws.close(RESUME_CLOSE, "reconnect asked")
                raise _Reconnect("Discord asked for a reconnect")
            elif op == 9:
                if frame.get("d") is not True:
                    self._session_id = self._resume_url = None
                    self._seq = None
                    self._stopped.wait(1.0 + random.random())  # Discord asks for 1-5 s
                ws.close(RESUME_CLOSE, "invalid session")
                raise _Reconnect("invalid session")
            elif op == 0:
                self._dispatch(ws, frame)

    def _dispatch(self, ws: Connection, frame: Mapping[str, Any]) -> None:
        event, data, seq = frame.get("t"), frame.get("d"), frame.get("s")
        if event == "READY" and isinstance(data, Mapping):
            self._session_id = str(data["session_id"])
            self._resume_url = str(data.get("resume_gateway_url") or "").rstrip("/") or None
            self.bot_id = str(data["user"]["id"])
            log.info("discord gateway ready: session started, bot %s", self.bot_id)
            threading.Thread(target=self._backfill, name="discord-backfill", daemon=True).start()
        elif event == "MESSAGE_CREATE" and isinstance(data, Mapping) and self.bot_id:
            try:
                message = parse_message(
                    data, parent=self._parent(data), bot_id=self.bot_id, seq=seq
                )
                if message is not None:
                    self._admit(message)
            except Exception:
                log.exception("discord message not admitted; resuming to have it replayed")
                ws.close(RESUME_CLOSE, "admission failed")
                raise _Reconnect("a message was not admitted") from None
        if type(seq) is int:
            self._seq = seq  # only now: everything up to it is handled

    def _admit(self, message: DiscordInbound) -> None:
        self.on_message(message)
        with self._lock:
            newest = self._admitted.get(message.channel, 0)
            self._admitted[message.channel] = max(newest, int(message.message_id))

    def _parent(self, data: Mapping[str, Any]) -> str | None:
        """The parent of the message's channel when that channel is a thread, else None."""
        channel = str(data.get("channel_id"))
        if data.get("guild_id") is None:
            return None  # a DM channel has no threads
        with self._lock:
            if channel in self._parents:
                return self._parents[channel]
        answer = self.api.call("GET", f"/channels/{channel}")
        raise_for(self.api, "GET /channels/{id}", answer)
        info = answer.body if isinstance(answer.body, Mapping) else {}
        parent = info.get("parent_id") if info.get("type") in THREAD_TYPES else None
        parent = parent if isinstance(parent, str) else None
        with self._lock:
            self._parents[channel] = parent
        return parent

    # -- backfill -------------------------------------------------------------------------
    def _backfill(self) -> None:
        """Read, over REST, what each active channel got since its last admitted message."""
        try:
            channels = dict(self.since())
        except Exception:
            log.exception("discord backfill: the active channels could not be read")
            return
        with self._lock:
            for channel, newest in self._admitted.items():
                if int(channels.get(channel, "0")) < newest:
                    channels[channel] = str(newest)
        for channel, after in sorted(channels.items()):
            if self._stopped.is_set():
                return
            try:
                count = self._backfill_channel(channel, after)
            except Exception:
                log.exception("discord backfill of channel %s failed", channel)
                continue
            if count:
                log.info("discord backfill: %s message(s) in channel %s", count, channel)

    def _backfill_channel(self, channel: str, after: str) -> int:
        assert self.bot_id is not None
        count = 0
        while True:
            answer = self.api.call(
                "GET",
                f"/channels/{channel}/messages",
                params={"after": after, "limit": str(BACKFILL_PAGE)},
            )
            raise_for(self.api, "GET /channels/{id}/messages", answer)
            listed = answer.body if isinstance(answer.body, list) else []
            page = sorted(
                (m for m in listed if isinstance(m, Mapping) and str(m.get("id", "")).isdigit()),
                key=lambda m: int(m["id"]),
            )
            for data in page:
                message = parse_message(
                    {**data, "channel_id": channel},
                    parent=self._parent(data),
                    bot_id=self.bot_id,
                    seq=None,
                )
                if message is not None:
                    self._admit(message)
                    count += 1
                after = str(data["id"])
            if len(listed) < BACKFILL_PAGE:
                return count

    # -- pieces ---------------------------------------------------------------------------
    def _receive(self, ws: Connection, timeout: float) -> dict[str, Any] | None:
        try:
            raw = ws.recv(timeout=timeout)
        except TimeoutError:
            return None
        try:
            frame = json.loads(raw)
        except ValueError:
            raise _Reconnect("a frame that is not JSON") from None
        if not isinstance(frame, dict):
            raise _Reconnect("a frame that is not an object")
        return frame

    def _send(self, ws: Connection, frame: Mapping[str, Any]) -> None:
        ws.send(json.dumps(frame))
