"""The fake Telegram Bot API's "Getting updates" methods: where an update waits until it is
confirmed, and the two ways it leaves.

:class:`Updates` holds the injected updates and the confirmed offset (``DIR/updates.jsonl``,
fsync). ``getUpdates`` long-polls it; ``setWebhook`` makes the fake POST each pending update,
oldest first, to a URL until a 2xx answer confirms it (the webhook is kept in
``DIR/webhook.json``, so a restarted fake goes on delivering); while a webhook is set,
``getUpdates`` answers 409 :data:`WEBHOOK_ACTIVE`. The webhook is set, removed and read under
the store's condition, so a long poll never serves an update while a webhook is set.

Separate from the chats' methods (:mod:`oncewire.testing.telegram_api`), which only add updates:
:class:`UpdateMethods` is mixed into :class:`~oncewire.testing.telegram_api.TelegramFake`.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from oncewire.testing.control import CallLog, fsynced_append
from oncewire.testing.telegram_calls import ApiError, Reply, bad, int_param, json_param, truthy

__all__ = [
    "CLIENT",
    "CLIENT_GONE",
    "CONFLICT",
    "DELIVERY_TIMEOUT_SECONDS",
    "RETRY_FIRST_SECONDS",
    "RETRY_MAX_SECONDS",
    "SECRET_HEADER",
    "SECRET_TOKEN_CHARS",
    "WEBHOOK_ACTIVE",
    "UpdateMethods",
    "Updates",
    "Webhook",
    "post_update",
    "write_atomically",
]

# The request this thread serves: ``CLIENT.gone()``, when set, says whether its client closed
# the connection. A long poll whose client hung up (a process killed, a poller stopped) ends
# there, journaled as CLIENT_GONE and answered to nobody, so it never draws the 409 of a newer
# poll: a 409 in the journal always went to a poller that was still there to read it.
CLIENT = threading.local()
CLIENT_GONE = 499

CONFLICT = (
    "Conflict: terminated by other getUpdates request; make sure that only one bot instance "
    "is running"
)
WEBHOOK_ACTIVE = (
    "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete "
    "the webhook first"
)
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
SECRET_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# Webhook delivery retries: the first wait, doubled after each failure up to the last.
RETRY_FIRST_SECONDS = 0.1
RETRY_MAX_SECONDS = 2.0
DELIVERY_TIMEOUT_SECONDS = 10.0


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


class UpdateMethods:
    """getUpdates, setWebhook, deleteWebhook, getWebhookInfo and the thread delivering to the
    webhook, on the fake's update store (the fake starts the thread)."""

    updates: Updates
    calls: CallLog
    _webhook: Webhook | None  # guarded by updates.cond
    _webhook_path: Path
    _deliveries: list[dict[str, int]]  # every webhook delivery attempt

    def get_updates(self, params: Mapping[str, Any]) -> Reply:
        offset = int_param(params, "offset", None)
        timeout = max(0, int_param(params, "timeout", 0) or 0)
        limit = min(100, max(1, int_param(params, "limit", 100) or 100))
        allowed = json_param(params, "allowed_updates")
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
                gone = getattr(CLIENT, "gone", None)
                if gone is not None and gone():
                    return CLIENT_GONE, None
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

    def set_webhook(self, params: Mapping[str, Any]) -> Reply:
        url = params.get("url")
        if url in (None, ""):
            return self.delete_webhook(params)  # as Telegram: an empty URL removes the webhook
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise bad("bad webhook: an HTTP or HTTPS URL must be provided for webhook")
        secret = params.get("secret_token")
        if secret in (None, ""):
            secret = None
        elif (
            not isinstance(secret, str)
            or len(secret) > 256
            or not set(secret) <= SECRET_TOKEN_CHARS
        ):
            raise bad("secret token contains unallowed characters")
        allowed = json_param(params, "allowed_updates")
        hook = Webhook(url, secret, allowed if isinstance(allowed, list) else None)
        with self.updates.cond:
            write_atomically(self._webhook_path, hook.as_json())
            self._webhook = hook
            if truthy(params.get("drop_pending_updates")):
                self.updates.confirm(self.updates.next_id())
            self.updates.cond.notify_all()  # a long poll waiting now ends with 409
        return 200, {"ok": True, "result": True, "description": "Webhook was set"}

    def delete_webhook(self, params: Mapping[str, Any]) -> Reply:
        with self.updates.cond:
            had = self._webhook is not None
            self._webhook = None
            self._webhook_path.unlink(missing_ok=True)
            if truthy(params.get("drop_pending_updates")):
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
            status = post_update(hook, update)
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


# Deliveries go straight to the URL, whatever proxy the environment names.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post_update(hook: Webhook, update: Mapping[str, Any]) -> int:
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


def write_atomically(path: Path, data: Mapping[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(data, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
