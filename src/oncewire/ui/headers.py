"""The headers every response of the dashboard carries, whatever answered: a page, a fragment,
a static file, a refusal, a redirect, a 404.

- ``Content-Security-Policy``: scripts and styles only from the dashboard's own files
  (``/static/...``), never inline, so a stored value that reached a page as markup could not
  run; fetches and form posts only to the dashboard itself; nothing else loaded from
  anywhere; and no page may frame it (``frame-ancestors 'none'``).
- ``X-Frame-Options: DENY``: the same refusal to be framed, for browsers that predate
  ``frame-ancestors``. A page elsewhere cannot put the dashboard under a visitor's clicks.
- ``X-Content-Type-Options: nosniff``: a response is only what its type says.
- ``Referrer-Policy: no-referrer``: a dashboard address (effect keys, run ids, a token on the
  first visit) is never sent to another site.
"""

from __future__ import annotations

from oncewire.core.extras import refusal

try:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("ui", "oncewire ui", exc) from exc

__all__ = ["CONTENT_SECURITY_POLICY", "HEADERS", "SecurityHeaders"]

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    ]
)
HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}
_RAW = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in HEADERS.items()]
_NAMES = {name for name, _ in _RAW}


class SecurityHeaders:
    """ASGI middleware: sets :data:`HEADERS` on every HTTP response of ``app`` (replacing any
    of the same name). It wraps the whole application, error handling included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _NAMES]
                message = {**message, "headers": kept + _RAW}
            await send(message)

        await self.app(scope, receive, send_with_headers)
