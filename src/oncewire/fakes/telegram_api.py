"""A fake Telegram Bot API server, run as its own process, journaled like the fake platform.

``python -m oncewire.fakes.telegram_api --port 0 --journal DIR --token TOKEN [--name fk_tg]
[--fault JSON]... [--host H]`` serves ``/bot<TOKEN>/<method>`` (JSON, form or query
parameters; method names in any case) and prints ``ready port=N`` once it listens:

* ``getMe``; ``getUpdates`` (``offset`` confirms every update below it, unconfirmed updates are
  served again, ``timeout`` long-polls, ``limit``, ``allowed_updates``; a newer poll ends the
  one still waiting with 409 ``Conflict: terminated by other getUpdates request...``);
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
  that is no Bot API URL).

What the chats show lives in ``DIR/chat.jsonl``, written by a
:class:`~oncewire.platforms.fake.FakePlatform` (fsync before the answer), so
:class:`~oncewire.platforms.fake.ChatView` reads it and a restarted fake continues from it.
Inbound updates and confirmed offsets are in ``DIR/updates.jsonl`` (fsync), every call in
``DIR/calls.jsonl``. Bot messages are numbered by the journal, from 1 upwards across chats (so
increasing in each chat); user messages injected without an id are numbered from
:data:`USER_IDS_FROM` in their chat, so the two never collide.

Control routes (``POST /control/<action>``, JSON): ``inject`` a user message (``chat_id``,
``text``, optional ``message_id``, ``thread_id``, ``from``, ``chat_type``; ``edited: true``
sends an ``edited_message`` of an injected ``message_id``) → ``{"update_id", "message_id"}``;
``fault`` arms a :class:`~oncewire.platforms.fake.Fault` (JSON fields; ``conn_error`` is a
listener blackout of ``blackout_seconds``, see :mod:`oncewire.fakes.control`); ``release``
lets parked operations go on; ``state`` reports the confirmed offset, the pending updates, the
long polls waiting now, the webhook's URL and every delivery attempt (``update_id``,
``status``, 0 when the URL could not be reached) and the faults fired.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from oncewire.fakes.control import (
    CallLog,
    ListenerServer,
    TrackedHandler,
    fault_from_json,
    fsynced_append,
)
from oncewire.platforms.base import (
    TELEGRAM_LIKE,
    Delivered,
    MaybeDelivered,
    NotDelivered,
    RejectedForGood,
    WireOutcome,
)
from oncewire.platforms.fake import ChatView, FakePlatform, Fault
from oncewire.replies.splitting import measure
from oncewire.storage.replies import SendRequest

__all__ = ["USER_IDS_FROM", "WEBHOOK_ACTIVE", "TelegramFake", "main", "serve"]

USER_IDS_FROM = 1_000_001
BOT_ID = 7000001
CAP = TELEGRAM_LIKE.cap

NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are "
    "exactly the same as a current content and reply markup of the message"
)
CONFLICT = (
    "Conflict: terminated by other getUpdates request; make sure that only one bot instance "
    "is running"
)
WEBHOOK_ACTIVE = (
    "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete "
    "the webhook first"
)
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
_SECRET_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# Webhook delivery retries: the first wait, doubled after each failure up to the last.
RETRY_FIRST_SECONDS = 0.1
RETRY_MAX_SECONDS = 2.0
DELIVERY_TIMEOUT_SECONDS = 10.0

Reply = tuple[int, Any]  # (HTTP status, body); body None: no answer at all


class ApiError(Exception):
    """A Bot API error answer."""

    def __init__(self, status: int, description: str, **parameters: Any) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "ok": False,
            "error_code": self.status,
            "description": self.description,
        }
        if self.parameters:
            body["parameters"] = self.parameters
        return body


def _bad(description: str) -> ApiError:
    return ApiError(400, f"Bad Request: {description}")


class Updates:
    """Injected updates and the confirmed offset, persisted (fsync) and waited on by pollers."""

    def __init__(self, path: Path) -> None:
        self.updates: list[dict[str, Any]] = []
        self.confirmed = 0  # every update below this offset is confirmed
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    break  # a torn last line: it was never answered
                if "update" in entry:
                    self.updates.append(entry["update"])
                else:
                    self.confirmed = max(self.confirmed, int(entry["confirm"]))
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.cond = threading.Condition()
        self.generation = 0  # of getUpdates calls: a newer one ends the one waiting
        self.waiting = 0  # getUpdates calls waiting for an update now

    def next_id(self) -> int:
        return max((u["update_id"] for u in self.updates), default=0) + 1

    def add(self, update: dict[str, Any]) -> None:
        with self.cond:
            fsynced_append(self._fd, {"update": update})
            self.updates.append(update)
            self.cond.notify_all()

    def confirm(self, offset: int) -> None:
        if offset > self.confirmed:
            fsynced_append(self._fd, {"confirm": offset})
            self.confirmed = offset

    def pending(self, allowed: Sequence[str] | None, limit: int) -> list[dict[str, Any]]:
        ready = [
            u
            for u in self.updates
            if u["update_id"] >= self.confirmed
            and (not allowed or any(kind in u for kind in allowed))
        ]
        return ready[:limit]


class Webhook:
    """Where updates are POSTed while a webhook is set, persisted beside the journal."""

    def __init__(self, url: str, secret_token: str | None, allowed: list[str] | None) -> None:
        self.url = url
        self.secret_token = secret_token
        self.allowed = allowed

    def as_json(self) -> dict[str, Any]:
        return {"url": self.url, "secret_token": self.secret_token, "allowed": self.allowed}

    @classmethod
    def load(cls, path: Path) -> Webhook | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return cls(data["url"], data.get("secret_token"), data.get("allowed"))


class TelegramFake:
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
        directory.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.name = name
        self.bot_username = bot_username
        self.journal = directory / "chat.jsonl"
        self.chats = FakePlatform(self.journal, TELEGRAM_LIKE, name=name, faults=faults)
        self.updates = Updates(directory / "updates.jsonl")
        self.calls = CallLog(directory / "calls.jsonl")
        self._lock = threading.Lock()
        self._webhook_path = directory / "webhook.json"
        self._webhook = Webhook.load(self._webhook_path)  # guarded by updates.cond
        self._deliveries: list[dict[str, int]] = []  # every webhook delivery attempt
        self._fault_names = itertools.count()
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

    def get_updates(self, params: Mapping[str, Any]) -> Reply:
        offset = _int(params, "offset", None)
        timeout = max(0, _int(params, "timeout", 0) or 0)
        limit = min(100, max(1, _int(params, "limit", 100) or 100))
        allowed = _json_param(params, "allowed_updates")
        allowed = allowed if isinstance(allowed, list) else None
        deadline = time.monotonic() + timeout
        updates = self.updates
        with updates.cond:
            updates.generation += 1
            mine = updates.generation
            updates.cond.notify_all()
            if self._webhook is not None:
                raise ApiError(409, WEBHOOK_ACTIVE)
            if offset is not None and offset > 0:
                updates.confirm(offset)
            while True:
                if self._webhook is not None:
                    raise ApiError(409, WEBHOOK_ACTIVE)
                if updates.generation != mine:
                    raise ApiError(409, CONFLICT)
                ready = updates.pending(allowed, limit)
                left = deadline - time.monotonic()
                if ready or left <= 0:
                    return 200, {"ok": True, "result": ready}
                updates.waiting += 1
                try:
                    updates.cond.wait(min(left, 0.5))
                finally:
                    updates.waiting -= 1

    def send_message(self, params: Mapping[str, Any]) -> Reply:
        chat = self._chat(params)
        text = _text(params)
        thread = _int(params, "message_thread_id", None)
        if thread == 1:
            raise _bad("message thread not found")
        reply = _json_param(params, "reply_parameters")
        reply = reply if isinstance(reply, Mapping) else {}
        reply_to = _int(reply, "message_id", _int(params, "reply_to_message_id", None))
        lenient = reply.get("allow_sending_without_reply") is True or _truthy(
            params.get("allow_sending_without_reply")
        )
        if reply_to is not None and not lenient and not self._exists(chat, reply_to):
            raise _bad("message to be replied not found")
        request = self._request(chat, thread, reply_to)
        outcome = self.chats.send(request, text, marked=False)
        if isinstance(outcome, Delivered):
            with self._lock:
                self._shown[(chat, outcome.message_id)] = text
        return self._answer(outcome, lambda mid: self._message(chat, mid, text, thread, reply_to))

    def edit_message_text(self, params: Mapping[str, Any]) -> Reply:
        chat = self._chat(params)
        message_id = str(_int(params, "message_id", None))
        text = _text(params)
        with self._lock:
            shown = self._shown.get((chat, message_id))
        if shown is None:
            raise _bad("message to edit not found")
        if shown == text:
            raise ApiError(400, NOT_MODIFIED)
        outcome = self.chats.edit(self._request(chat, None, None), message_id, text, marked=False)
        if isinstance(outcome, Delivered):
            with self._lock:
                self._shown[(chat, message_id)] = text
        return self._answer(outcome, lambda mid: self._message(chat, mid, text, None, None))

    def delete_message(self, params: Mapping[str, Any]) -> Reply:
        chat = self._chat(params)
        message_id = str(_int(params, "message_id", None))
        with self._lock:
            if (chat, message_id) not in self._shown:
                raise _bad("message to delete not found")
        outcome = self.chats.delete(self._request(chat, None, None), message_id)
        if isinstance(outcome, Delivered):
            with self._lock:
                self._shown.pop((chat, message_id), None)
        return self._answer(outcome, lambda mid: True)

    def send_chat_action(self, params: Mapping[str, Any]) -> Reply:
        self._chat(params)
        if not params.get("action"):
            raise _bad("action is empty")
        return 200, {"ok": True, "result": True}

    def set_webhook(self, params: Mapping[str, Any]) -> Reply:
        url = params.get("url")
        if url in (None, ""):
            return self.delete_webhook(params)  # as Telegram: an empty URL removes the webhook
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise _bad("bad webhook: an HTTP or HTTPS URL must be provided for webhook")
        secret = params.get("secret_token")
        if secret in (None, ""):
            secret = None
        elif (
            not isinstance(secret, str)
            or len(secret) > 256
            or not set(secret) <= _SECRET_TOKEN_CHARS
        ):
            raise _bad("secret token contains unallowed characters")
        allowed = _json_param(params, "allowed_updates")
        hook = Webhook(url, secret, allowed if isinstance(allowed, list) else None)
        with self.updates.cond:
            _write_atomically(self._webhook_path, hook.as_json())
            self._webhook = hook
            if _truthy(params.get("drop_pending_updates")):
                self.updates.confirm(self.updates.next_id())
            self.updates.cond.notify_all()  # a long poll waiting now ends with 409
        return 200, {"ok": True, "result": True, "description": "Webhook was set"}

    def delete_webhook(self, params: Mapping[str, Any]) -> Reply:
        with self.updates.cond:
            had = self._webhook is not None
            self._webhook = None
            self._webhook_path.unlink(missing_ok=True)
            if _truthy(params.get("drop_pending_updates")):
                self.updates.confirm(self.updates.next_id())
        said = "Webhook was deleted" if had else "Webhook is already deleted"
        return 200, {"ok": True, "result": True, "description": said}

    def get_webhook_info(self, params: Mapping[str, Any]) -> Reply:
        with self.updates.cond:
            hook = self._webhook
            pending = len(self.updates.pending(hook.allowed if hook else None, 1 << 30))
            failed = [d for d in self._deliveries if not 200 <= d["status"] < 300]
        info: dict[str, Any] = {
            "url": hook.url if hook else "",
            "has_custom_certificate": False,
            "pending_update_count": pending,
        }
        if hook is not None and hook.allowed is not None:
            info["allowed_updates"] = hook.allowed
        if failed:
            info["last_error_date"] = failed[-1]["date"]
            info["last_error_message"] = f"Wrong response from the webhook: {failed[-1]['status']}"
        return 200, {"ok": True, "result": info}

    METHODS = {
        "getme": get_me,
        "getupdates": get_updates,
        "setwebhook": set_webhook,
        "deletewebhook": delete_webhook,
        "getwebhookinfo": get_webhook_info,
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

    def arm(self, spec: Mapping[str, Any]) -> tuple[Fault, float]:
        fault, blackout = fault_from_json(spec)
        if not fault.name:
            from dataclasses import replace

            # Fired counts are journaled by name: a name of this process never repeats one.
            fault = replace(fault, name=f"ctl-{os.getpid()}-{next(self._fault_names)}")
        if fault.kind != "conn_error":
            self.chats.faults.append(fault)
        return fault, blackout

    def state(self) -> dict[str, Any]:
        view = ChatView([self.journal])
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
            "faults_fired": [(f["fault"], f["kind"], f["op"]) for f in view.faults],
        }

    # -- webhook delivery --------------------------------------------------------------------
    def _deliver_forever(self) -> None:
        """POST the oldest pending update to the webhook until it is answered 2xx (then it is
        confirmed and the next one goes), waiting a little longer after each failure."""
        wait = RETRY_FIRST_SECONDS
        while True:
            with self.updates.cond:
                while True:
                    hook = self._webhook
                    ready = [] if hook is None else self.updates.pending(hook.allowed, 1)
                    if ready:
                        break
                    self.updates.cond.wait(0.5)
            assert hook is not None
            update = ready[0]
            status = _post_update(hook, update)
            with self.updates.cond:
                self._deliveries.append(
                    {"update_id": update["update_id"], "status": status, "date": int(time.time())}
                )
                delivered = 200 <= status < 300
                if delivered and self._webhook is hook:
                    self.updates.confirm(update["update_id"] + 1)
            self.calls.write({"webhook_delivery": update["update_id"], "status": status})
            if delivered:
                wait = RETRY_FIRST_SECONDS
            else:
                time.sleep(wait)
                wait = min(wait * 2, RETRY_MAX_SECONDS)

    # -- pieces ------------------------------------------------------------------------------
    def _chat(self, params: Mapping[str, Any]) -> str:
        if params.get("chat_id") in (None, ""):
            raise _bad("chat_id is empty")
        chat = str(params["chat_id"])
        with self._lock:
            if chat not in self._chat_types:
                raise _bad("chat not found")
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


# Deliveries go straight to the URL, whatever proxy the environment names.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _post_update(hook: Webhook, update: Mapping[str, Any]) -> int:
    """POST one update to the webhook: the HTTP status, 0 when nothing answered."""
    request = urllib.request.Request(hook.url, data=json.dumps(update).encode(), method="POST")
    request.add_header("content-type", "application/json")
    if hook.secret_token is not None:
        request.add_header(SECRET_HEADER, hook.secret_token)
    try:
        with _DIRECT.open(request, timeout=DELIVERY_TIMEOUT_SECONDS) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)
    except OSError:
        return 0


def _write_atomically(path: Path, data: Mapping[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(data, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def _int(params: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = params.get(key)
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        raise _bad(f"{key} must be an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _bad(f"{key} must be an integer") from None


def _json_param(params: Mapping[str, Any], key: str) -> Any:
    value = params.get(key)
    if isinstance(value, str):  # form and query parameters carry objects as JSON text
        try:
            return json.loads(value)
        except ValueError:
            raise _bad(f"can't parse {key} JSON object") from None
    return value


def _truthy(value: Any) -> bool:
    return value is True or value in ("true", "True", "1")


def _text(params: Mapping[str, Any]) -> str:
    text = params.get("text")
    if not isinstance(text, str) or not text.strip():
        raise _bad("message text is empty")
    if measure(text, "utf16") > CAP:
        raise _bad("message is too long")
    return text


def _chat_json(chat: str) -> int | str:
    return int(chat) if chat.lstrip("-").isdigit() else chat


class _Handler(TrackedHandler):
    server: _Server

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
            return self.send_json(400, _bad("can't parse request body").body())
        self._dispatch(params)

    def _dispatch(self, params: dict[str, Any]) -> None:
        fake = self.server.fake
        path = urlsplit(self.path).path
        if path.startswith("/control/"):
            return self._control(path.removeprefix("/control/"), params)
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
            status, body = handler(fake, params)
        except ApiError as exc:
            status, body = exc.status, exc.body()
        fake.calls.write({**log, "status": status, "answered": body is not None})
        if body is None:
            return self.stay_silent()
        self.send_json(status, body)

    def _control(self, action: str, params: dict[str, Any]) -> None:
        fake = self.server.fake
        try:
            if action == "inject":
                return self.send_json(200, {"ok": True, **fake.inject(params)})
            if action == "fault":
                fault, blackout = fake.arm(params)
                if fault.kind == "conn_error":
                    self.send_json(200, {"ok": True, "name": fault.name})
                    self.server.blackout(blackout)  # after the answer: this connection is busy
                    return None
                return self.send_json(200, {"ok": True, "name": fault.name})
            if action == "release":
                fake.chats.release_holds()
                return self.send_json(200, {"ok": True})
            if action == "state":
                return self.send_json(200, {"ok": True, **fake.state()})
        except ValueError as exc:
            return self.send_json(400, {"ok": False, "error": str(exc)})
        self.send_json(404, {"ok": False, "error": f"no control action {action!r}"})


class _Server(ListenerServer):
    def __init__(self, address: tuple[str, int], fake: TelegramFake) -> None:
        self.fake = fake
        super().__init__(address, _Handler, fake.name)


def serve(host: str, port: int, fake: TelegramFake) -> _Server:
    """Bind the server (not serving yet: call ``serve()`` on it)."""
    return _Server((host, port), fake)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oncewire.fakes.telegram_api")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--journal", type=Path, required=True, help="a directory")
    parser.add_argument("--token", required=True, help="the only bot token the fake accepts")
    parser.add_argument("--name", default="telegram", help="the platform name in the journal")
    parser.add_argument("--fault", action="append", default=[], help="a JSON Fault, armed")
    args = parser.parse_args(argv)
    faults = []
    for spec in args.fault:
        try:
            fault, _ = fault_from_json(json.loads(spec))
        except ValueError as exc:
            print(f"error: --fault {spec}: {exc}", file=sys.stderr)
            return 2
        if fault.kind == "conn_error":
            print(
                "error: conn_error is a listener blackout; arm it through /control/fault when "
                "the next new connection is the one to refuse",
                file=sys.stderr,
            )
            return 2
        faults.append(fault)
    fake = TelegramFake(args.journal, token=args.token, name=args.name, faults=faults)
    server = serve(args.host, args.port, fake)
    print(f"ready port={server.port}", flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
