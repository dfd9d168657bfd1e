"""A fake Telegram Bot API server, run as its own process, journaled like the fake platform.

``python -m oncewire.testing.telegram_api --port 0 --journal DIR --token TOKEN [--name fk_tg]
[--fault JSON]... [--host H]`` serves ``/bot<TOKEN>/<method>`` (JSON, form or query
parameters; method names in any case) and prints ``ready port=N`` once it listens:

* ``getMe``; ``getUpdates`` (``offset`` confirms every update below it, unconfirmed updates are
  served again, ``timeout`` long-polls, ``limit``, ``allowed_updates``; a newer poll ends the
  one still waiting with 409 ``Conflict: terminated by other getUpdates request...``; a poll
  whose client closed its connection ends unanswered, journaled with status 499);
* ``setWebhook`` (``url``, ``secret_token``, ``allowed_updates``, ``drop_pending_updates``),
  ``deleteWebhook`` (``drop_pending_updates``), ``getWebhookInfo``. With a webhook set, the fake
  POSTs each pending update, oldest first, to the URL (with ``X-Telegram-Bot-Api-Secret-Token``
  when a secret token was given) and retries it with a short backoff until it is answered 2xx,
  which confirms it; ``getUpdates`` then answers 409 :data:`WEBHOOK_ACTIVE`. The webhook is
  kept in ``DIR/webhook.json``, so a restarted fake goes on delivering;
* ``sendMessage`` (``chat_id``, ``text``, ``message_thread_id``, ``reply_parameters`` with
  ``allow_sending_without_reply``, or ``reply_to_message_id``), ``editMessageText``,
  ``deleteMessage``, ``sendChatAction``;
* a chat exists once a user message was injected into it (before that: "chat not found");
* errors as Telegram words them: ``{"ok": false, "error_code", "description", "parameters":
  {"retry_after"}}`` (chat not found, message is too long, not modified, message to edit /
  delete / be replied not found, 401 for another token, 404 for an unknown method or a path
  that is no Bot API URL); the ``gone`` fault deletes the target as its user would, then
  answers the edit or delete "message to edit / delete not found".

What the chats show lives in ``DIR/chat.jsonl``, written by a
:class:`~oncewire.testing.FakePlatform` (fsync before the answer), so
:class:`~oncewire.testing.ChatView` reads it and a restarted fake continues from it.
Inbound updates and confirmed offsets are in ``DIR/updates.jsonl`` (fsync), every call in
``DIR/calls.jsonl``. Bot messages are numbered by the journal, from 1 upwards across chats (so
increasing in each chat); user messages injected without an id are numbered from
:data:`USER_IDS_FROM` in their chat, so the two never collide.

Control routes (``POST /control/<action>``, JSON): ``inject`` a user message (``chat_id``,
``text``, optional ``message_id``, ``thread_id``, ``from``, ``chat_type``; ``edited: true``
sends an ``edited_message`` of an injected ``message_id``) → ``{"update_id", "message_id"}``;
``fault`` arms a :class:`~oncewire.testing.Fault` (JSON fields; ``conn_error`` is a
listener blackout of ``blackout_seconds``, see :mod:`oncewire.testing.control`); ``release``
lets parked operations go on; ``state`` reports the confirmed offset, the pending updates, the
long polls waiting now, the webhook's URL and every delivery attempt (``update_id``,
``status``, 0 when the URL could not be reached) and the faults fired.

The update side (``getUpdates`` and the webhook) is :mod:`oncewire.testing.telegram_api_updates`,
how a call's parameters are read and its errors worded :mod:`oncewire.testing.telegram_calls`.
"""

from __future__ import annotations

import json
import math
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from oncewire.replies.splitting import measure
from oncewire.replies.wire import (
    TELEGRAM_LIKE,
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
    print_error,
    startup_faults,
)
from oncewire.testing.fake_platform import ChatView, Fault
from oncewire.testing.telegram_api_updates import (
    CLIENT,
    WEBHOOK_ACTIVE,
    UpdateMethods,
    Updates,
    Webhook,
)
from oncewire.testing.telegram_api_updates import CONFLICT as CONFLICT
from oncewire.testing.telegram_api_updates import (
    DELIVERY_TIMEOUT_SECONDS as DELIVERY_TIMEOUT_SECONDS,
)
from oncewire.testing.telegram_api_updates import RETRY_FIRST_SECONDS as RETRY_FIRST_SECONDS
from oncewire.testing.telegram_api_updates import RETRY_MAX_SECONDS as RETRY_MAX_SECONDS
from oncewire.testing.telegram_api_updates import SECRET_HEADER as SECRET_HEADER
from oncewire.testing.telegram_calls import ApiError, Reply, bad, int_param, json_param, truthy

__all__ = ["USER_IDS_FROM", "WEBHOOK_ACTIVE", "TelegramFake", "main", "serve"]

USER_IDS_FROM = 1_000_001
BOT_ID = 7000001
CAP = TELEGRAM_LIKE.cap

NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are "
    "exactly the same as a current content and reply markup of the message"
)


class TelegramFake(PlatformFake, UpdateMethods):
    """The fake's state: chats (a journaled FakePlatform), users' messages, updates."""

    def __init__(
        self,
        directory: Path,
        *,
        token: str,
        name: str = "telegram",
        bot_username: str = "oncewire_fake_bot",
        faults: Sequence[Fault] = (),
    ) -> None:
        super().__init__(directory, TELEGRAM_LIKE, name=name, faults=faults)
        self.token = token
        self.bot_username = bot_username
        self.updates = Updates(directory / "updates.jsonl")
        self._lock = threading.Lock()
        self._webhook_path = directory / "webhook.json"
        self._webhook = Webhook.load(self._webhook_path)  # guarded by updates.cond
        self._deliveries = []  # every webhook delivery attempt
        self._shown: dict[tuple[str, str], str] = {}  # (chat, bot message id) -> text shown
        self._user_ids: dict[str, set[int]] = {}  # chat -> ids of users' messages
        self._chat_types: dict[str, str] = {}
        for shown in ChatView([self.journal]).visible(name):
            self._shown[(shown.chat, shown.message_id)] = shown.text
            self._chat_types.setdefault(shown.chat, "private")
        for update in self.updates.updates:
            message = update.get("message") or update.get("edited_message") or {}
            chat = str(message["chat"]["id"])
            self._chat_types[chat] = message["chat"]["type"]
            self._user_ids.setdefault(chat, set()).add(int(message["message_id"]))
        threading.Thread(target=self._deliver_forever, name="webhook", daemon=True).start()

    # -- Bot API methods ---------------------------------------------------------------------
    def get_me(self, params: Mapping[str, Any]) -> Reply:
        me = {
            "id": BOT_ID,
            "is_bot": True,
            "first_name": "oncewire fake",
            "username": self.bot_username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }
        return 200, {"ok": True, "result": me}

    def send_message(self, params: Mapping[str, Any]) -> Reply:
        chat = self._chat(params)
        text = _text(params)
        thread = int_param(params, "message_thread_id", None)
        if thread == 1:
            raise bad("message thread not found")
        reply = json_param(params, "reply_parameters")
        reply = reply if isinstance(reply, Mapping) else {}
        reply_to = int_param(reply, "message_id", int_param(params, "reply_to_message_id", None))
        lenient = reply.get("allow_sending_without_reply") is True or truthy(
            params.get("allow_sending_without_reply")
        )
        if reply_to is not None and not lenient and not self._exists(chat, reply_to):
            raise bad("message to be replied not found")
        request = self._request(chat, thread, reply_to)
        outcome = self.chats.send(request, text, marked=False)
        if isinstance(outcome, Delivered):
            with self._lock:
                self._shown[(chat, outcome.message_id)] = text
        return self._answer(outcome, lambda mid: self._message(chat, mid, text, thread, reply_to))

    def edit_message_text(self, params: Mapping[str, Any]) -> Reply:
        chat = self._chat(params)
        message_id = str(int_param(params, "message_id", None))
        text = _text(params)
        with self._lock:
            shown = self._shown.get((chat, message_id))
        if shown is None:
            raise bad("message to edit not found")
        if shown == text:
            raise ApiError(400, NOT_MODIFIED)
        outcome = self.chats.edit(self._request(chat, None, None), message_id, text, marked=False)
        if isinstance(outcome, Gone):  # the user deleted it (the "gone" fault): Telegram's 400
            with self._lock:
                self._shown.pop((chat, message_id), None)
            raise bad("message to edit not found")
        if isinstance(outcome, Delivered):
            with self._lock:
                self._shown[(chat, message_id)] = text
        return self._answer(outcome, lambda mid: self._message(chat, mid, text, None, None))

    def delete_message(self, params: Mapping[str, Any]) -> Reply:
        chat = self._chat(params)
        message_id = str(int_param(params, "message_id", None))
        with self._lock:
            if (chat, message_id) not in self._shown:
                raise bad("message to delete not found")
        outcome = self.chats.delete(self._request(chat, None, None), message_id)
        if isinstance(outcome, Gone):  # deleted by the user first (the "gone" fault)
            with self._lock:
                self._shown.pop((chat, message_id), None)
            raise bad("message to delete not found")
        if isinstance(outcome, Delivered):
            with self._lock:
                self._shown.pop((chat, message_id), None)
        return self._answer(outcome, lambda mid: True)

    def send_chat_action(self, params: Mapping[str, Any]) -> Reply:
        self._chat(params)
        if not params.get("action"):
            raise bad("action is empty")
        return 200, {"ok": True, "result": True}

    METHODS: dict[str, Callable[[TelegramFake, Mapping[str, Any]], Reply]] = {
        "getme": get_me,
        "getupdates": UpdateMethods.get_updates,
        "setwebhook": UpdateMethods.set_webhook,
        "deletewebhook": UpdateMethods.delete_webhook,
        "getwebhookinfo": UpdateMethods.get_webhook_info,
        "sendmessage": send_message,
        "editmessagetext": edit_message_text,
        "deletemessage": delete_message,
        "sendchataction": send_chat_action,
    }

    # -- control -----------------------------------------------------------------------------
    def inject(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A user's message (or an edit of one) becomes an update for the pollers."""
        if "chat_id" not in params or not isinstance(params.get("text", ""), str):
            raise ValueError("inject needs chat_id and a text string")
        chat = str(params["chat_id"])
        edited = params.get("edited") is True
        with self._lock:
            ids = self._user_ids.setdefault(chat, set())
            message_id = params.get("message_id")
            if message_id is None:
                if edited:
                    raise ValueError("an edit names the message_id it edits")
                message_id = max(ids, default=USER_IDS_FROM - 1) + 1
            if type(message_id) is not int:
                raise ValueError("message_id must be an integer")
            if edited and message_id not in ids:
                raise ValueError(f"no user message {message_id} in chat {chat} to edit")
            ids.add(message_id)
            chat_type = str(params.get("chat_type") or self._chat_types.get(chat, "private"))
            self._chat_types[chat] = chat_type
        sender = params.get("from") or {"id": 1001, "is_bot": False, "first_name": "User"}
        message: dict[str, Any] = {
            "message_id": message_id,
            "date": int(time.time()),
            "chat": {"id": _chat_json(chat), "type": chat_type},
            "from": sender,
            "text": params.get("text", ""),
        }
        if params.get("thread_id") is not None:
            message["message_thread_id"] = int(params["thread_id"])
            message["is_topic_message"] = True
        if edited:
            message["edit_date"] = int(time.time())
        with self.updates.cond:
            update: dict[str, Any] = {"update_id": self.updates.next_id()}
            update["edited_message" if edited else "message"] = message
            self.updates.add(update)
        return {"update_id": update["update_id"], "message_id": message_id}

    def state(self) -> dict[str, Any]:
        with self.updates.cond:
            pending = [u["update_id"] for u in self.updates.pending(None, 1 << 30)]
            confirmed = self.updates.confirmed
            waiting = self.updates.waiting
            webhook = None if self._webhook is None else self._webhook.url
            deliveries = [
                {"update_id": d["update_id"], "status": d["status"]} for d in self._deliveries
            ]
        return {
            "confirmed_offset": confirmed,
            "polls_waiting": waiting,
            "pending_updates": pending,
            "webhook": webhook,
            "deliveries": deliveries,
            "faults_fired": faults_fired(self.journal),
        }

    # -- pieces ------------------------------------------------------------------------------
    def _chat(self, params: Mapping[str, Any]) -> str:
        if params.get("chat_id") in (None, ""):
            raise bad("chat_id is empty")
        chat = str(params["chat_id"])
        with self._lock:
            if chat not in self._chat_types:
                raise bad("chat not found")
        return chat

    def _exists(self, chat: str, message_id: int) -> bool:
        with self._lock:
            return message_id in self._user_ids.get(chat, set()) or (
                (chat, str(message_id)) in self._shown
            )

    def _request(self, chat: str, thread: int | None, reply_to: int | None) -> SendRequest:
        return SendRequest(
            platform=self.name,
            bot=self.bot_username,
            chat=chat,
            thread="" if thread is None else str(thread),
            reply_to=None if reply_to is None else str(reply_to),
        )

    def _message(
        self, chat: str, message_id: str, text: str, thread: int | None, reply_to: int | None
    ) -> dict[str, Any]:
        with self._lock:
            chat_type = self._chat_types.get(chat, "private")
        message: dict[str, Any] = {
            "message_id": int(message_id),
            "date": int(time.time()),
            "chat": {"id": _chat_json(chat), "type": chat_type},
            "from": {
                "id": BOT_ID,
                "is_bot": True,
                "first_name": "oncewire fake",
                "username": self.bot_username,
            },
            "text": text,
        }
        if thread is not None:
            message["message_thread_id"] = thread
            message["is_topic_message"] = True
        if reply_to is not None and self._exists(chat, reply_to):
            message["reply_to_message"] = {"message_id": reply_to, "chat": message["chat"]}
        return message

    def _answer(self, outcome: WireOutcome, result: Any) -> Reply:
        if isinstance(outcome, Delivered):
            return 200, {"ok": True, "result": result(outcome.message_id)}
        if isinstance(outcome, NotDelivered):
            after = max(1, math.ceil(outcome.retry_after or 1))
            raise ApiError(429, f"Too Many Requests: retry after {after}", retry_after=after)
        if isinstance(outcome, RejectedForGood):
            raise ApiError(403, "Forbidden: bot was blocked by the user")
        assert isinstance(outcome, MaybeDelivered)
        return 0, None  # timeout, ack_lost, a parked hold: no answer


def _text(params: Mapping[str, Any]) -> str:
    text = params.get("text")
    if not isinstance(text, str) or not text.strip():
        raise bad("message text is empty")
    if measure(text, "utf16") > CAP:
        raise bad("message is too long")
    return text


def _chat_json(chat: str) -> int | str:
    return int(chat) if chat.lstrip("-").isdigit() else chat


class _Handler(ControlHandler):
    server: FakeServer[TelegramFake]

    def do_GET(self) -> None:
        self._dispatch(dict(parse_qsl(urlsplit(self.path).query)))

    def do_POST(self) -> None:
        raw = self.read_body()
        params: dict[str, Any] = dict(parse_qsl(urlsplit(self.path).query))
        content_type = self.headers.get("content-type", "")
        try:
            if "json" in content_type and raw:
                body = json.loads(raw)
                if not isinstance(body, dict):
                    raise ValueError("not an object")
                params.update(body)
            elif raw:
                params.update(parse_qsl(raw.decode()))
        except ValueError:
            return self.send_json(400, bad("can't parse request body").body())
        self._dispatch(params)

    def _dispatch(self, params: dict[str, Any]) -> None:
        fake = self.server.fake
        path = urlsplit(self.path).path
        if path.startswith("/control/"):
            return self.control(path.removeprefix("/control/"), params)
        token, _, method = path.removeprefix("/bot").partition("/")
        log = {"method": method, "params": params}
        try:
            if not path.startswith("/bot") or not method:
                raise ApiError(404, "Not Found")
            if token != fake.token:
                raise ApiError(401, "Unauthorized")
            handler = TelegramFake.METHODS.get(method.lower())
            if handler is None:
                raise ApiError(404, "Not Found")
            CLIENT.gone = self._client_gone
            status, body = handler(fake, params)
        except ApiError as exc:
            status, body = exc.status, exc.body()
        fake.calls.write({**log, "status": status, "answered": body is not None})
        if body is None:
            return self.stay_silent()
        self.send_json(status, body)

    def _client_gone(self) -> bool:
        """Whether the client closed its end (a long poll's client sends nothing meanwhile)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True


def serve(host: str, port: int, fake: TelegramFake) -> FakeServer[TelegramFake]:
    """Bind the server (not serving yet: call ``serve()`` on it)."""
    return FakeServer((host, port), _Handler, fake)


def main(argv: Sequence[str] | None = None) -> int:
    parser = fake_parser("oncewire.testing.telegram_api", name="telegram")
    parser.add_argument("--token", required=True, help="the only bot token the fake accepts")
    args = parser.parse_args(argv)
    try:
        faults = startup_faults(args.fault)
    except ValueError as exc:
        return print_error(str(exc))
    fake = TelegramFake(args.journal, token=args.token, name=args.name, faults=faults)
    server = serve(args.host, args.port, fake)
    return announce_and_serve(server.port, server.serve)


if __name__ == "__main__":
    sys.exit(main())
