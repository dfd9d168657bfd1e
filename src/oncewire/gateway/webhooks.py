"""The gateway's inbound webhook server: Telegram webhook mode and the generic webhook platform.

A platform that pushes its messages retries a POST until it gets a 2xx, so the server answers
200 only once the admission callback it was given has *returned*: the callback's commit is what
makes the message the gateway's, and what it returns says whether it admitted the message
(``admitted``; a message it chose not to admit is confirmed too, with its ``reason``: serving
it again would change nothing). Everything else is an answer that makes the platform deliver
again (500: the admission failed) or that tells a sender it was refused (401, 400, 413); a
message the inbox refuses for what it is (an id with a control character, over 512
characters, a text UTF-8 cannot encode) can never be admitted, so it is a 400, never a 500
that would have it delivered for ever:

====================================================  =========================================
what arrived                                          answer
====================================================  =========================================
``GET /healthz``                                       200 ``{"ok": true}``
Telegram: a wrong or missing                           401, nothing admitted
``X-Telegram-Bot-Api-Secret-Token``
webhook platform: a wrong or missing signature         401, nothing admitted
a body over ``max_body_bytes`` (1 MiB)                 413, nothing admitted
a body that is no JSON object, a webhook message       400, nothing admitted
without its fields
a Telegram update that carries nothing to admit        200 ``{"admitted": false, "reason":
(another update type)                                  "nothing_to_admit"}``
the admission callback admitted it (new or again)      200 ``{"admitted": true}``
the admission callback chose not to admit it (from a   200 ``{"admitted": false, "reason"}``,
bot, a sender not allowed, an edit)                    nothing admitted
the admission callback refused the message itself      400, nothing admitted
(``InvalidPayload`` or ``ConfigurationError``)
the admission callback raised anything else            500 (the platform delivers it again)
====================================================  =========================================

No answer carries a traceback. Routes, for each platform of the config:

* ``POST /telegram/<name>/<suffix>`` for each Telegram platform with ``inbound = "webhook"``.
  The suffix is derived from the platform's webhook secret (:func:`telegram_webhook_path`), so
  the path is unguessable without it and never holds the bot token; ``oncewire gateway webhook
  set`` registers the same URL with Telegram. The update is read by the long poller's own
  parser (:func:`~oncewire.gateway.platforms.telegram_updates.parse_update`).
* ``POST /webhook/<name>`` for each generic webhook platform: the body is signed with the
  platform's ``secret_env`` (:func:`~oncewire.gateway.platforms.webhook.verify`), so a webhook
  platform without one is refused when the server is made.

Handlers run in a thread pool (admission is a blocking commit), so the callback may be called
from several threads at once. uvicorn serves the app in a thread of its own:
:meth:`WebhookServer.start` returns once the port listens, :meth:`WebhookServer.stop` stops
accepting and waits (up to ``drain_seconds``) for the requests in progress to be answered.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from oncewire.core.errors import ConfigurationError, InvalidPayload, OncewireError
from oncewire.core.extras import refusal
from oncewire.gateway.admission import Admitted
from oncewire.gateway.config import GatewayConfig, PlatformConfig
from oncewire.gateway.platforms.telegram_updates import TelegramInbound, parse_update
from oncewire.gateway.platforms.webhook import (
    SIGNATURE_HEADER,
    WebhookInbound,
    parse_inbound,
    verify,
)

try:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("gateway", "oncewire's webhook server", exc) from exc

__all__ = [
    "MAX_BODY_BYTES",
    "TELEGRAM_SECRET_HEADER",
    "Admit",
    "InboundMessage",
    "WebhookServer",
    "WebhookServerError",
    "telegram_webhook_path",
    "webhook_path",
]

log = logging.getLogger("oncewire.gateway.webhooks")

TELEGRAM_SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
MAX_BODY_BYTES = 1 << 20
# A body over the limit is read to its end (and dropped) up to this size, so that the sender
# reads the 413 instead of a connection reset; past it the connection is closed.
_DRAIN_BYTES = 16 << 20
START_TIMEOUT_SECONDS = 10.0

InboundMessage = TelegramInbound | WebhookInbound
# The admission: commit the message (platform, message) and say what it did, or raise:
# InvalidPayload or ConfigurationError for a message that can never be admitted (the inbox's
# rules for its ids and payload), anything else for a failure the platform's retry may pass.
Admit = Callable[[PlatformConfig, InboundMessage], Admitted]


class WebhookServerError(OncewireError):
    """The webhook server could not start (its address is taken or not this host's)."""

    code = "webhook_server_error"


def telegram_webhook_path(platform_name: str, secret: str) -> str:
    """The URL path of a Telegram platform's webhook: its name and a suffix that only a holder
    of the webhook secret can compute (the same secret always gives the same path)."""
    mac = hmac.new(
        secret.encode(), f"oncewire telegram webhook\0{platform_name}".encode(), hashlib.sha256
    )
    return f"/telegram/{quote(platform_name, safe='')}/{mac.hexdigest()[:32]}"


def webhook_path(platform_name: str) -> str:
    """The URL path the generic webhook platform ``platform_name`` POSTs its messages to."""
    return f"/webhook/{quote(platform_name, safe='')}"


@dataclass(frozen=True)
class _Answer:
    status: int
    body: Mapping[str, Any]


@dataclass(frozen=True)
class _Route:
    platform: PlatformConfig
    secret: str  # the Telegram secret token or the webhook platform's HMAC secret
    handle: Callable[[_Route, Mapping[str, str], bytes], _Answer]


class WebhookServer:
    """The inbound webhook server of one gateway config; ``admit`` is the admission callback.

    Secrets are read from ``environ`` (default: the process environment) when the server is
    made: a missing one is a :class:`ConfigurationError`, as is a webhook platform without
    ``secret_env``. ``config.webhooks`` gives the address (port 0: any free port).
    """

    def __init__(
        self,
        config: GatewayConfig,
        admit: Admit,
        *,
        environ: Mapping[str, str] | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        drain_seconds: int = 30,
    ) -> None:
        if type(max_body_bytes) is not int or max_body_bytes < 1:
            raise ValueError("max_body_bytes must be a whole number of bytes >= 1")
        if type(drain_seconds) is not int or drain_seconds < 0:
            raise ValueError("drain_seconds must be a whole number of seconds >= 0")
        self.host = config.webhooks.host
        self._port = config.webhooks.port
        self._admit = admit
        self._max_body_bytes = max_body_bytes
        self._drain_seconds = drain_seconds
        self._paths: dict[str, str] = {}  # platform name -> its route's path, as in a URL
        self._routes: dict[str, _Route] = {}  # the same path, percent-decoded as served
        for platform in config.platforms:
            if platform.kind == "telegram" and platform.inbound == "webhook":
                assert platform.webhook_secret_env is not None  # the config gives a default
                secret = config.secret(platform.webhook_secret_env, environ)
                path = telegram_webhook_path(platform.name, secret)
                self._add(path, _Route(platform, secret, self._telegram))
            elif platform.kind == "webhook":
                if platform.secret_env is None:
                    raise ConfigurationError(
                        f"{config.path}: platform {platform.name}: its inbound route needs "
                        "secret_env (the platform signs what it POSTs with that secret)",
                        file=str(config.path),
                        key="secret_env",
                    )
                secret = config.secret(platform.secret_env, environ)
                self._add(webhook_path(platform.name), _Route(platform, secret, self._webhook))
        self.app = Starlette(
            routes=[
                Route("/healthz", self._healthz, methods=["GET"]),
                Route("/{path:path}", self._post, methods=["POST"]),
            ],
            exception_handlers={HTTPException: _http_error, Exception: _internal_error},
        )
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def __repr__(self) -> str:
        return f"WebhookServer(host={self.host!r}, port={self._port}, routes={len(self._routes)})"

    @property
    def port(self) -> int:
        """The port it listens on (the one bound, once started)."""
        return self._port

    @property
    def url(self) -> str:
        """The server's base URL as this host reaches it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._port}"

    def paths(self) -> dict[str, str]:
        """Each platform's route path, by platform name (the Telegram ones carry a secret
        suffix: do not log them)."""
        return dict(self._paths)

    def _add(self, path: str, route: _Route) -> None:
        self._paths[route.platform.name] = path
        self._routes[unquote(path)] = route

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> int:
        """Listen and serve in a thread of its own; return once the port accepts, with it."""
        with self._lock:
            if self._thread is not None:
                raise WebhookServerError("the webhook server was started already")
            sock = self._bind()
            self._port = int(sock.getsockname()[1])
            config = uvicorn.Config(
                self.app,
                log_config=None,  # the host application configures logging, not the server
                access_log=False,
                lifespan="off",
                http="h11",
                ws="none",
                loop="asyncio",
                server_header=False,
                timeout_graceful_shutdown=self._drain_seconds,
            )
            server = uvicorn.Server(config)
            thread = threading.Thread(
                target=self._serve, args=(server, sock), name="oncewire-webhooks", daemon=True
            )
            self._server, self._thread = server, thread
            thread.start()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise WebhookServerError(
                    f"the webhook server did not start on {self.url}: {self._failure!r}"
                )
            time.sleep(0.01)
        if self.host not in ("127.0.0.1", "::1", "localhost"):
            log.warning("webhook server listening beyond loopback", extra={"url": self.url})
        return self._port

    def stop(self) -> None:
        """Stop accepting, answer the requests in progress (up to ``drain_seconds``), return
        once the server's thread has ended. Stopping twice is harmless."""
        with self._lock:
            server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.should_exit = True
        thread.join()

    def __enter__(self) -> WebhookServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _bind(self) -> socket.socket:
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                self.host, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            raise WebhookServerError(f"cannot listen on {self.url}: {exc}") from exc
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(128)
        except OSError as exc:
            sock.close()
            raise WebhookServerError(f"cannot listen on {self.url}: {exc}") from exc
        return sock

    def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # SystemExit too: uvicorn exits on a failed startup
            self._failure = exc
            log.error("webhook server ended", exc_info=exc)
        finally:
            sock.close()

    # -- handlers ----------------------------------------------------------------------------
    def _healthz(self, request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def _post(self, request: Request) -> Response:
        route = self._routes.get(request.scope["path"])
        if route is None:
            return _json(404, {"ok": False, "error": "no such route"})
        try:
            body = await self._read_body(request)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is left to read it
        if body is None:
            return _json(
                413, {"ok": False, "error": f"the body is over {self._max_body_bytes} bytes"}
            )
        headers = dict(request.headers)
        # The blocking part (the admission's commit) runs in the thread pool.
        answer = await run_in_threadpool(route.handle, route, headers, body)
        return _json(answer.status, answer.body)

    async def _read_body(self, request: Request) -> bytes | None:
        """The body, or None when it is over the limit."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > _DRAIN_BYTES:
            return None  # not worth reading: the connection will be closed
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > _DRAIN_BYTES:
                return None
            if size <= self._max_body_bytes:
                chunks.append(chunk)
        return None if size > self._max_body_bytes else b"".join(chunks)

    def _telegram(self, route: _Route, headers: Mapping[str, str], body: bytes) -> _Answer:
        given = headers.get(TELEGRAM_SECRET_HEADER.lower())
        if given is None or not hmac.compare_digest(given.encode(), route.secret.encode()):
            log.warning(
                "telegram webhook: wrong secret token", extra={"platform": route.platform.name}
            )
            return _Answer(401, {"ok": False, "error": "missing or wrong secret token"})
        try:
            update = _json_object(body)
        except ValueError as exc:
            return _Answer(400, {"ok": False, "error": str(exc)})
        message = parse_update(update)
        if message is None:
            return _Answer(200, {"ok": True, "admitted": False, "reason": "nothing_to_admit"})
        return self._admission(route.platform, message)

    def _webhook(self, route: _Route, headers: Mapping[str, str], body: bytes) -> _Answer:
        if not verify(route.secret, body, headers.get(SIGNATURE_HEADER.lower())):
            log.warning("webhook: wrong signature", extra={"platform": route.platform.name})
            return _Answer(401, {"ok": False, "error": "missing or wrong signature"})
        try:
            message = parse_inbound(body)
        except ValueError as exc:
            return _Answer(400, {"ok": False, "error": str(exc)})
        return self._admission(route.platform, message)

    def _admission(self, platform: PlatformConfig, message: InboundMessage) -> _Answer:
        try:
            admitted = self._admit(platform, message)
        except (InvalidPayload, ConfigurationError) as exc:
            # The message itself is refused: delivered again, it would be refused again.
            log.warning(
                "message refused: %s", exc, extra={"platform": platform.name, "code": exc.code}
            )
            return _Answer(400, {"ok": False, "error": f"the message can never be admitted: {exc}"})
        except Exception:
            # Not answered 2xx, so the platform delivers the message again.
            log.exception("admission failed", extra={"platform": platform.name})
            return _Answer(500, {"ok": False, "error": "admission failed; deliver it again"})
        if admitted.admission is None:
            return _Answer(200, {"ok": True, "admitted": False, "reason": admitted.reason})
        return _Answer(200, {"ok": True, "admitted": True})


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body)
    except ValueError:
        raise ValueError("the body is not JSON") from None
    if not isinstance(payload, dict):
        raise ValueError("the body is not a JSON object")
    return payload


def _json(status: int, body: Mapping[str, Any]) -> Response:
    return JSONResponse(dict(body), status_code=status)


def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return _json(status, {"ok": False, "error": detail})


def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("webhook server: unexpected error", exc_info=exc)
    return _json(500, {"ok": False, "error": "internal error"})
