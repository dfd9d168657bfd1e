"""A fake Discord (REST API and Gateway), run as its own process, journaled like the fake platform.

``python -m oncewire.testing.discord_api --port 0 --journal DIR --token TOKEN [--name fk_dc]
[--nonce-window-seconds S] [--heartbeat-ms MS] [--resume-window-seconds S]
[--allowed-intents N] [--bucket-limit N] [--bucket-seconds S] [--fault JSON]... [--host H]``
prints ``ready port=N`` once it listens. Every REST call needs ``Authorization: Bot TOKEN``
(else 401 ``{"message": "401: Unauthorized", "code": 0}``); under ``/api/v10``:

* ``GET /gateway/bot`` → ``{"url": "ws://...", "shards": 1, "session_start_limit": ...}``: the
  Gateway (:mod:`oncewire.testing.discord_api_gateway`), on a port of its own; ``GET /users/@me``;
  ``GET /channels/{id}`` (``type`` 0, a thread 11 with its ``parent_id``, a DM 1);
* ``POST /channels/{id}/messages`` (``content``, ``nonce``, ``enforce_nonce``,
  ``message_reference``, ``allowed_mentions``) → the Message (``id`` a snowflake string,
  ``channel_id``, ``content``, ``author`` with ``bot: true``, ``timestamp``, ``nonce``). With
  ``enforce_nonce``, a nonce the bot sent within ``--nonce-window-seconds`` (default 300)
  answers the message that first send made, and nothing new appears. Content over 2000
  characters, or a nonce over 25, is 400 ``{"code": 50035, "message": "Invalid Form Body",
  "errors": {...}}``; empty content 400 50006; an unknown channel 404 10003;
* ``PATCH /channels/{id}/messages/{mid}`` (the same content again is a 200) and ``DELETE`` (204);
  a message that is not there is 404 ``{"message": "Unknown Message", "code": 10008}``;
* ``GET /channels/{id}/messages?after=ID&limit=N``: the channel's messages after ``ID``
  (the oldest ``N``, at most 100), newest first, as Discord lists them; without ``after``, the
  newest ``N``;
* 429: ``{"message": "You are being rate limited.", "retry_after": seconds (float), "global":
  false}`` with ``Retry-After``, ``X-RateLimit-Limit``, ``-Remaining``, ``-Reset``,
  ``-Reset-After``, ``-Bucket``, ``-Scope: user`` and ``Via``. Every answer to a message route
  carries the ``X-RateLimit-*`` headers of its bucket (the route and its channel): a bucket
  allows ``--bucket-limit`` calls (default 50) per ``--bucket-seconds`` (default 1) and answers
  429 past that; the ``rate_limit`` fault answers the same 429 without counting.

Channels: a chat is a channel (its id is the inject's ``channel_id``); a thread is a channel of
its own whose ``parent_id`` is the chat. Messages sent to a thread are journaled with ``chat``
= the parent and ``thread`` = the thread, as the gateway's replies are keyed. A channel exists
once a user message was injected into it (before that: Unknown Channel).

Ids: users' messages get snowflakes (milliseconds since the Discord epoch, shifted 22 bits, so
they sort by time); the bot's messages are numbered by the journal from 1 upwards (as every
fake platform's are), so a backfill ``after`` a user's message never lists them.

What the chats show is ``DIR/chat.jsonl``, written by a
:class:`~oncewire.testing.FakePlatform` (fsync before the answer), read by
:class:`~oncewire.testing.ChatView`; users' messages are ``DIR/messages.jsonl`` (fsync),
every call ``DIR/calls.jsonl``. A restarted fake continues from them (Gateway sessions do not
survive it: a client then identifies afresh and backfills).

Control routes (``POST /control/<action>``, JSON), as on the other fakes:

* ``inject``: a user's message (``channel_id``, ``text``; optional ``thread_id`` (a thread of
  that channel, made on first use), ``message_id``, ``author`` (``{"id", "username", "bot"}``),
  ``bot: true`` (sent by another bot), ``dm: true`` (no guild), ``dispatch: false`` (stored for
  a backfill, never dispatched)) → ``{"message_id", "channel_id"}``; the message is dispatched
  as ``MESSAGE_CREATE`` to every live Gateway session;
* ``fault``: a :class:`~oncewire.testing.Fault` (``conn_error`` blacks out the REST
  listener; the Gateway's socket is another listener and is not touched); ``rejected`` answers
  403 50013 Missing Permissions, ``gone`` deletes the target as a user would and answers 404
  10008; ``release`` lets parked operations go;
* ``reconnect`` (``how``: ``op7`` (default), ``invalid_session``, ``invalid_session_resumable``,
  ``close`` with ``code`` (default 4000), ``zombie``; ``rewind``: the next Resume replays that
  many message dispatches already handled, a re-delivery; ``rewind_to``: a message id, the next
  Resume replays from its dispatch on) and ``expire_sessions``: see
  :mod:`oncewire.testing.discord_api_gateway`;
* ``redeliver`` (``message_id``): a user's message already injected is dispatched again as a
  new ``MESSAGE_CREATE`` to every live session (a duplicate delivery, into whichever session is
  there now: a fresh process's included);
* ``state``: the Gateway's sessions (``session_id``, ``seq``, ``connected``, ``resumable``,
  ``resumes``), its identify and heartbeat counts and the faults fired.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from oncewire.core.errors import MissingExtra
from oncewire.replies.wire import (
    DISCORD_LIKE,
    Delivered,
    Gone,
    MaybeDelivered,
    NotDelivered,
    RejectedForGood,
    WireOutcome,
)
from oncewire.storage.replies import SendRequest
from oncewire.testing.control import (
    ControlHandler,
    FakeServer,
    PlatformFake,
    announce_and_serve,
    fake_parser,
    faults_fired,
    fsynced_append,
    print_error,
    startup_faults,
)
from oncewire.testing.discord_calls import (
    DISCORD_EPOCH_MS,
    Buckets,
    DiscordError,
    Reply,
    form_error,
    iso,
    rate_limited,
    snowflake,
    unknown_message,
)
from oncewire.testing.fake_platform import ChatView, Fault

if TYPE_CHECKING:  # the Gateway needs websockets (the gateway extra): imported by main()
    from oncewire.testing.discord_api_gateway import GatewayHub

__all__ = ["BOT_ID", "DISCORD_EPOCH_MS", "DiscordFake", "main", "snowflake"]

BOT_ID = "900000000000000001"
USER_ID = "900000000000000100"
GUILD_ID = "900000000000000999"
CAP = DISCORD_LIKE.cap
API = "/api/v10"


def _content(body: Mapping[str, Any]) -> str:
    """The text a message create or edit carries, refused as Discord refuses it."""
    content = body.get("content")
    if not isinstance(content, str) or not content:
        raise DiscordError(400, 50006, "Cannot send an empty message")
    if len(content) > CAP:
        raise form_error("content", "BASE_TYPE_MAX_LENGTH", f"Must be {CAP} or fewer in length.")
    return content


class DiscordFake(PlatformFake):
    """The fake's state: channels, users' messages, the bot's messages (a journaled
    FakePlatform) and the Gateway's sessions."""

    def __init__(
        self,
        directory: Path,
        *,
        token: str,
        name: str = "discord",
        faults: Sequence[Fault] = (),
        nonce_window_seconds: float = 300.0,
        bucket_limit: int = 50,
        bucket_seconds: float = 1.0,
        hub: GatewayHub,
    ) -> None:
        super().__init__(directory, DISCORD_LIKE, name=name, faults=faults)
        self.chats.honour_keys = True  # enforce_nonce: a repeated nonce is dropped
        self.chats.key_window_seconds = nonce_window_seconds
        self.token = token
        self.user = dict(hub.user)
        self.hub = hub
        self.buckets = Buckets(bucket_limit, bucket_seconds)
        self._lock = threading.Lock()
        self._parents: dict[str, str | None] = {}  # channel id -> its parent (a thread's chat)
        self._guilds: dict[str, str | None] = {}  # channel id -> guild id (None: a DM)
        self._users: list[dict[str, Any]] = []  # users' messages, in order
        self._shown: dict[tuple[str, str], dict[str, Any]] = {}  # (channel, id) -> bot message
        self._last_id = 0
        self._messages_path = directory / "messages.jsonl"
        if self._messages_path.exists():
            for line in self._messages_path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    self._remember(json.loads(line))
        self._messages_fd = os.open(
            self._messages_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
        )
        for shown in ChatView([self.journal]).visible(name):
            channel = shown.thread or shown.chat
            self._shown[(channel, shown.message_id)] = self._bot_message(
                channel, shown.message_id, shown.text, None, time.time()
            )

    # -- REST --------------------------------------------------------------------------------
    def create(self, channel: str, body: Mapping[str, Any]) -> Reply:
        parent = self._channel(channel)
        content = _content(body)
        nonce = body.get("nonce")
        if nonce is not None and (not isinstance(nonce, str | int) or len(str(nonce)) > 25):
            raise form_error("nonce", "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
        enforce = body.get("enforce_nonce") is True and nonce is not None
        reference = body.get("message_reference")
        reply_to = reference.get("message_id") if isinstance(reference, Mapping) else None
        request = self._request(channel, parent, None if reply_to is None else str(reply_to))
        if enforce:
            request = replace(request, idempotency_key=str(nonce))
        outcome = self.chats.send(request, content, marked=False)
        if isinstance(outcome, Delivered):
            key = (channel, outcome.message_id)
            with self._lock:
                known = self._shown.get(key)
                if known is None:  # a new message (not the one a repeated nonce made)
                    known = self._bot_message(
                        channel, outcome.message_id, content, nonce, time.time()
                    )
                    self._shown[key] = known
                    fresh = True
                else:
                    fresh = False
            if fresh:
                self.hub.dispatch("MESSAGE_CREATE", known, content_intent=False)
            return 200, known, {}
        return self._failed(outcome)

    def edit(self, channel: str, message_id: str, body: Mapping[str, Any]) -> Reply:
        parent = self._channel(channel)
        content = _content(body)
        with self._lock:
            shown = self._shown.get((channel, message_id))
        if shown is None:
            raise unknown_message()
        if shown["content"] == content:
            return 200, shown, {}  # Discord answers an edit to the same content like any other
        outcome = self.chats.edit(
            self._request(channel, parent, None), message_id, content, marked=False
        )
        if isinstance(outcome, Delivered):
            with self._lock:
                shown = {**shown, "content": content, "edited_timestamp": iso(time.time())}
                self._shown[(channel, message_id)] = shown
            return 200, shown, {}
        return self._failed(outcome, (channel, message_id))

    def delete(self, channel: str, message_id: str) -> Reply:
        parent = self._channel(channel)
        with self._lock:
            if (channel, message_id) not in self._shown:
                raise unknown_message()
        outcome = self.chats.delete(self._request(channel, parent, None), message_id)
        if isinstance(outcome, Delivered):
            with self._lock:
                self._shown.pop((channel, message_id), None)
            return 204, b"", {}
        return self._failed(outcome, (channel, message_id))

    def history(self, channel: str, query: Mapping[str, str]) -> Reply:
        self._channel(channel)
        try:
            limit = int(query.get("limit", "50"))
            after = int(query["after"]) if "after" in query else None
        except ValueError:
            raise form_error("after", "NUMBER_TYPE_COERCE", "Value is not snowflake.") from None
        if not 1 <= limit <= 100:
            raise form_error("limit", "NUMBER_TYPE_MAX", "int value should be 1-100")
        with self._lock:
            messages = [_listed(m) for m in self._users if m["channel_id"] == channel]
            messages += [m for (c, _), m in self._shown.items() if c == channel]
        messages.sort(key=lambda m: int(m["id"]))
        if after is not None:
            picked = [m for m in messages if int(m["id"]) > after][:limit]
        else:
            picked = messages[-limit:]
        return 200, list(reversed(picked)), {}

    def channel_info(self, channel: str) -> dict[str, Any]:
        """``GET /channels/{id}``: a thread (type 11) names its parent channel."""
        parent = self._channel(channel)
        with self._lock:
            guild = self._guilds.get(channel)
        info: dict[str, Any] = {"id": channel, "type": 11 if parent else 0, "parent_id": parent}
        if guild is None:
            info["type"] = 1  # a DM
        else:
            info["guild_id"] = guild
        return info

    # -- control -----------------------------------------------------------------------------
    def inject(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A user's message (or another bot's) arrives: stored, then dispatched."""
        channel = params.get("channel_id", params.get("chat_id"))
        text = params.get("text", params.get("content", ""))
        if not isinstance(channel, str | int) or not str(channel) or not isinstance(text, str):
            raise ValueError("inject needs channel_id and a text string")
        thread = params.get("thread_id")
        author = params.get("author")
        if author is None:
            bot = params.get("bot") is True
            author = {
                "id": "900000000000000200" if bot else USER_ID,
                "username": "another-bot" if bot else "user",
                "bot": bot,
            }
        if not isinstance(author, Mapping) or "id" not in author:
            raise ValueError("author must be an object with an id")
        guild = None if params.get("dm") is True else GUILD_ID
        with self._lock:
            wanted = params.get("message_id")
            if wanted is not None:
                if not str(wanted).isdigit():
                    raise ValueError("message_id must be a snowflake (digits)")
                message_id = int(wanted)
                if any(int(m["id"]) == message_id for m in self._users):
                    raise ValueError(f"message {message_id} exists")
            else:
                message_id = max(snowflake(time.time() * 1000), self._last_id + 1)
            now = time.time()
            message: dict[str, Any] = {
                "id": str(message_id),
                "type": 0,
                "channel_id": str(thread) if thread is not None else str(channel),
                "parent_id": str(channel) if thread is not None else None,
                "guild_id": guild,
                "author": dict(author),
                "content": text,
                "timestamp": iso(now),
                "edited_timestamp": None,
                "tts": False,
                "mention_everyone": False,
                "mentions": [],
                "attachments": [],
                "embeds": [],
                "pinned": False,
            }
            fsynced_append(self._messages_fd, message)
            self._remember(message)
        if params.get("dispatch", True) is not False:
            self.hub.dispatch("MESSAGE_CREATE", _listed(message), content_intent=guild is not None)
        return {"message_id": message["id"], "channel_id": message["channel_id"]}

    def reconnect(self, params: Mapping[str, Any]) -> dict[str, Any]:
        code = params.get("code", 4000)
        if type(code) is not int:
            raise ValueError("code must be an integer")
        rewind = params.get("rewind", 0)
        if type(rewind) is not int:
            raise ValueError("rewind must be an integer")
        rewind_to = params.get("rewind_to")
        if rewind_to is not None and not str(rewind_to).isdigit():
            raise ValueError("rewind_to must be a message id (a snowflake)")
        how = str(params.get("how", "op7"))
        return {
            "connections": self.hub.reconnect(
                how,
                code=code,
                rewind=rewind,
                rewind_to=None if rewind_to is None else str(rewind_to),
            )
        }

    def redeliver(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A user's message dispatched again (``message_id``), as it was first dispatched."""
        wanted = str(params.get("message_id"))
        with self._lock:
            found = [m for m in self._users if m["id"] == wanted]
        if not found:
            raise ValueError(f"no user message {wanted}")
        message = found[-1]
        guild = message.get("guild_id")
        self.hub.dispatch("MESSAGE_CREATE", _listed(message), content_intent=guild is not None)
        return {"message_id": wanted, "channel_id": message["channel_id"]}

    def expire_sessions(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {"expired": self.hub.expire_sessions()}

    def state(self) -> dict[str, Any]:
        return {**self.hub.state(), "faults_fired": faults_fired(self.journal)}

    # -- pieces ------------------------------------------------------------------------------
    def _remember(self, message: Mapping[str, Any]) -> None:
        channel, parent = message["channel_id"], message.get("parent_id")
        if parent is not None:
            self._parents.setdefault(parent, None)
            self._guilds.setdefault(parent, message.get("guild_id"))
        self._parents.setdefault(channel, parent)
        self._guilds.setdefault(channel, message.get("guild_id"))
        self._users.append(dict(message))
        self._last_id = max(self._last_id, int(message["id"]))

    def _channel(self, channel: str) -> str | None:
        """The channel's parent (None: the channel is a chat); Unknown Channel if none."""
        with self._lock:
            if channel not in self._parents:
                raise DiscordError(404, 10003, "Unknown Channel")
            return self._parents[channel]

    def _request(self, channel: str, parent: str | None, reply_to: str | None) -> SendRequest:
        chat, thread = (parent, channel) if parent is not None else (channel, "")
        return SendRequest(
            platform=self.name, bot=BOT_ID, chat=chat, thread=thread, reply_to=reply_to
        )

    def _bot_message(
        self, channel: str, message_id: str, content: str, nonce: Any, at: float
    ) -> dict[str, Any]:
        message: dict[str, Any] = {
            "id": message_id,
            "type": 0,
            "channel_id": channel,
            "author": self.user,
            "content": content,
            "timestamp": iso(at),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "attachments": [],
            "embeds": [],
            "pinned": False,
        }
        guild = self._guilds.get(channel)
        if guild is not None:
            message["guild_id"] = guild
        if nonce is not None:
            message["nonce"] = nonce
        return message

    def _failed(self, outcome: WireOutcome, target: tuple[str, str] | None = None) -> Reply:
        if isinstance(outcome, NotDelivered):  # the rate_limit fault
            return rate_limited(outcome.retry_after or 1.0, {})
        if isinstance(outcome, RejectedForGood):
            raise DiscordError(403, 50013, "Missing Permissions")
        if isinstance(outcome, Gone):  # deleted by its user first (the gone fault)
            if target is not None:
                with self._lock:
                    self._shown.pop(target, None)
            raise unknown_message()
        assert isinstance(outcome, MaybeDelivered)
        return 0, None, {}  # timeout, ack_lost, a parked hold: no answer


def _listed(message: Mapping[str, Any]) -> dict[str, Any]:
    """A user's message as Discord lists it (no parent, no empty guild)."""
    return {k: v for k, v in message.items() if k != "parent_id" and v is not None}


class _Handler(ControlHandler):
    server: FakeServer[DiscordFake]

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PATCH(self) -> None:
        self._route("PATCH")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def _route(self, method: str) -> None:
        fake = self.server.fake
        url = urlsplit(self.path)
        raw = self.read_body()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = None
        if url.path.startswith("/control/"):
            params = body if isinstance(body, dict) else {}
            return self.control(
                url.path.removeprefix("/control/"),
                params,
                {
                    "reconnect": fake.reconnect,
                    "expire_sessions": fake.expire_sessions,
                    "redeliver": fake.redeliver,
                },
            )
        parts = url.path.removeprefix(API).strip("/").split("/")
        bucket = None
        try:
            if not url.path.startswith(API + "/"):
                raise DiscordError(404, 0, "404: Not Found")
            if self.headers.get("authorization") != f"Bot {fake.token}":
                raise DiscordError(401, 0, "401: Unauthorized")
            if not isinstance(body, dict):
                raise DiscordError(400, 50109, "The request body contains invalid JSON.")
            if method == "GET" and parts == ["gateway", "bot"]:
                reply: Reply = (200, self._gateway_bot(), {})
            elif method == "GET" and parts == ["users", "@me"]:
                reply = (200, fake.user, {})
            elif method == "GET" and len(parts) == 2 and parts[0] == "channels":
                reply = (200, fake.channel_info(parts[1]), {})
            elif len(parts) in (3, 4) and parts[0] == "channels" and parts[2] == "messages":
                bucket = (
                    f"{method} /channels/{parts[1]}/messages{'/:id' if len(parts) == 4 else ''}"
                )
                allowed, limits = fake.buckets.take(bucket)
                if not allowed:
                    reply = rate_limited(float(limits["X-RateLimit-Reset-After"]), limits)
                else:
                    reply = self._message_route(method, parts, body, url.query)
                    reply = (reply[0], reply[1], {**limits, **reply[2]})
            else:
                raise DiscordError(404, 0, "404: Not Found")
        except DiscordError as exc:
            reply = (exc.status, exc.body, {})
        status, answer, headers = reply
        fake.calls.write(
            {
                "method": method,
                "path": url.path,
                "query": url.query,
                "body": body,
                "status": status,
                "answered": answer is not None,
            }
        )
        if answer is None:
            return self.stay_silent()
        if status == 204:
            return self._no_content(headers)
        self.send_json(status, answer, headers)

    def _message_route(
        self, method: str, parts: list[str], body: Mapping[str, Any], query: str
    ) -> Reply:
        fake = self.server.fake
        channel = parts[1]
        if len(parts) == 3 and method == "POST":
            return fake.create(channel, body)
        if len(parts) == 3 and method == "GET":
            return fake.history(channel, dict(parse_qsl(query)))
        if len(parts) == 4 and method == "PATCH":
            return fake.edit(channel, parts[3], body)
        if len(parts) == 4 and method == "DELETE":
            return fake.delete(channel, parts[3])
        raise DiscordError(405, 0, "405: Method Not Allowed")

    def _gateway_bot(self) -> dict[str, Any]:
        return {
            "url": self.server.fake.hub.url,
            "shards": 1,
            "session_start_limit": {
                "total": 1000,
                "remaining": 999,
                "reset_after": 86_400_000,
                "max_concurrency": 1,
            },
        }

    def _no_content(self, headers: Mapping[str, str]) -> None:
        try:
            self.send_response(204)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.flush()
        except OSError:
            self.close_connection = True


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from oncewire.testing.discord_api_gateway import ALL_INTENTS, GatewayHub, serve_gateway
    except MissingExtra as exc:
        return print_error(str(exc))
    parser = fake_parser("oncewire.testing.discord_api", name="discord")
    parser.add_argument("--token", required=True, help="the only bot token the fake accepts")
    parser.add_argument("--nonce-window-seconds", type=float, default=300.0)
    parser.add_argument("--heartbeat-ms", type=int, default=41250)
    parser.add_argument("--resume-window-seconds", type=float, default=120.0)
    parser.add_argument("--allowed-intents", type=int, default=ALL_INTENTS)
    parser.add_argument("--bucket-limit", type=int, default=50)
    parser.add_argument("--bucket-seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    try:
        faults = startup_faults(args.fault)
    except ValueError as exc:
        return print_error(str(exc))
    if args.heartbeat_ms < 1 or args.bucket_limit < 1 or args.bucket_seconds <= 0:
        return print_error("--heartbeat-ms, --bucket-limit and --bucket-seconds must be > 0")
    hub = GatewayHub(
        args.token,
        {"id": BOT_ID, "username": "oncewire-fake", "bot": True, "discriminator": "0"},
        heartbeat_ms=args.heartbeat_ms,
        allowed_intents=args.allowed_intents,
        resume_window_seconds=args.resume_window_seconds,
    )
    fake = DiscordFake(
        args.journal,
        token=args.token,
        name=args.name,
        faults=faults,
        nonce_window_seconds=args.nonce_window_seconds,
        bucket_limit=args.bucket_limit,
        bucket_seconds=args.bucket_seconds,
        hub=hub,
    )
    _server, serve_gateway_forever = serve_gateway(args.host, hub)
    threading.Thread(target=serve_gateway_forever, name="gateway", daemon=True).start()
    server = FakeServer((args.host, args.port), _Handler, fake)
    return announce_and_serve(server.port, server.serve)


if __name__ == "__main__":
    sys.exit(main())
