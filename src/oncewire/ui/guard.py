"""Who may see the dashboard and who may act through it.

Three checks, each one refusing with a page that says what to do:

- **Token.** Bound beyond loopback the server refuses to start without one (anyone who can
  reach the port could read every payload). With a token, every request carries it: an
  ``Authorization: Bearer`` header, or the cookie set when a browser first opens the URL with
  ``?token=...`` (the token is then dropped from the address bar by a redirect).
- **Host.** Bound to loopback without a token, a request must name a loopback host, so a page
  on another site cannot reach the dashboard through a DNS name rebound to 127.0.0.1.
- **Actions.** Retry and cancel are refused unless the server was started with
  ``--allow-actions``, and then each POST must carry the server's CSRF token (a random value
  of this process, embedded in the forms it renders; another site cannot read it) and, when the
  browser says where it came from (``Origin``, ``Sec-Fetch-Site``), come from this server's own
  origin.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from oncewire.core.errors import ConfigurationError

__all__ = [
    "COOKIE",
    "MIN_TOKEN_LENGTH",
    "Guard",
    "Refusal",
    "check_binding",
    "is_loopback",
]

COOKIE = "oncewire_ui_token"
MIN_TOKEN_LENGTH = 16
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class Refusal(Exception):
    """A request refused: ``status`` and a sentence saying why and what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is loopback."""
    name = host.strip().strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_binding(host: str, token: str | None) -> None:
    """Refuse, before anything listens, a binding that would expose the store unprotected."""
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"--token must be at least {MIN_TOKEN_LENGTH} characters "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))')"
        )
    if token is None and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to listen on {host} without --token: anyone who can reach that address "
            "could read the store. Bind to 127.0.0.1, or pass --token (or ONCEWIRE_UI_TOKEN)"
        )


def _host_name(header: str) -> str:
    """The name part of a Host header (``[::1]:8765`` -> ``::1``)."""
    return urlsplit(f"//{header}").hostname or ""


@dataclass
class Guard:
    """The checks of one server process."""

    token: str | None
    allow_actions: bool
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    def authorized(self, bearer: str | None, cookie: str | None) -> bool:
        if self.token is None:
            return True
        offered = bearer or cookie or ""
        return hmac.compare_digest(offered.encode(), self.token.encode())

    def token_matches(self, offered: str) -> bool:
        return self.token is not None and hmac.compare_digest(offered.encode(), self.token.encode())

    def check_request(self, host_header: str, bearer: str | None, cookie: str | None) -> None:
        if self.token is None and not is_loopback(_host_name(host_header)):
            raise Refusal(
                403,
                f"this dashboard answers only loopback host names, not {host_header!r}: "
                "open it as http://127.0.0.1:PORT/",
            )
        if not self.authorized(bearer, cookie):
            raise Refusal(
                401,
                "this dashboard needs its token: open the address with ?token=... once, or "
                "send Authorization: Bearer ...",
            )

    def check_action(
        self,
        host_header: str,
        origin: str | None,
        offered_csrf: str,
        fetch_site: str | None = None,
    ) -> None:
        """Refuse an action unless actions are on and the POST comes from this server's page.

        ``origin`` and ``fetch_site`` are the ``Origin`` and ``Sec-Fetch-Site`` headers. The
        dashboard's pages send no referrer (``Referrer-Policy: no-referrer``), so a browser
        sends ``Origin: null`` from them; ``Sec-Fetch-Site`` still says whether the request
        came from this origin, and a browser that sends neither still needs the CSRF token.
        """
        if not self.allow_actions:
            raise Refusal(
                403,
                "actions are off: this dashboard is read-only. Start oncewire ui with "
                "--allow-actions to retry and cancel from it (nothing was changed)",
            )
        elsewhere = fetch_site is not None and fetch_site != "same-origin"
        if origin not in (None, "null") and urlsplit(origin).netloc != host_header:
            elsewhere = True
        if elsewhere:
            shown = origin if origin not in (None, "null") else f"Sec-Fetch-Site: {fetch_site}"
            raise Refusal(
                403, f"refused a request from another origin ({shown}); nothing was changed"
            )
        if not offered_csrf or not hmac.compare_digest(offered_csrf.encode(), self.csrf.encode()):
            raise Refusal(
                403,
                "missing or wrong CSRF token: reload the page and use its buttons "
                "(nothing was changed)",
            )
