"""A sink that performs an effect with one HTTP request, keyed by the effect.

Each attempt sends the effect's payload as JSON (canonical, ``Content-Type: application/json``)
with ``Idempotency-Key: <effect key>`` and ``Oncewire-Attempt: <n>``, plus
``Oncewire-Redelivery: 1`` when an earlier attempt may have reached the server (the headers of
:meth:`Attempt.headers`). A receiver that honours the key (``oncewire.asgi``, Stripe-style APIs)
turns every redelivery into one effect.

What happened becomes a typed outcome here, where it is known whether bytes left. The rule that
decides every row: ``NotSent`` only when the request provably did nothing (it never left, or the
server said it did not process it), ``Rejected`` only when the server refused it for good,
``MaybeSent`` whenever it may have been applied.

============================================  ================================================
what happened                                 outcome
============================================  ================================================
connect refused, DNS failure, connect         ``NotSent``: no byte of the request was written
timeout, no pooled connection in time
429, or 503 with ``Retry-After``              ``NotSent(retry_after=...)``: the server says it
                                              did not process it and when to come back
                                              (seconds or an HTTP date, at most a day; 429
                                              without the header: ``NotSent``, the backoff
                                              decides)
408 Request Timeout                           ``NotSent``: the server gave up reading the request
                                              before processing it
425 Too Early                                 ``NotSent``: the server refused to process it yet
409 Conflict                                  ``MaybeSent``: under the Idempotency-Key draft,
                                              an earlier attempt with this key is still being
                                              processed, so the effect may yet happen; the next
                                              attempt is flagged and replays its result
any other 4xx                                 ``Rejected``: sending it again as is will be
                                              refused again
2xx                                           ``Done``: a JSON body (``application/json`` or
                                              ``+json``) parsed, any other body as its text, an
                                              empty body as ``None``
a timeout after the request started going     ``MaybeSent``: the server may have read, applied
out, the connection dropped mid-request or    and answered it
mid-response, a 5xx (503 without
``Retry-After`` included), a 3xx (redirects
are not followed), any other status
============================================  ================================================

The sink never retries (the dispatcher owns retries, backoff and the redelivery flag) and never
follows redirects (a redirected POST could be applied twice). Requests share one pooled client,
made at the first attempt and closed by :meth:`HttpSink.close`, which the dispatcher calls when
its ``run`` ends (a later attempt makes a new one). It needs ``httpx2``:
``pip install 'oncewire[http]'``.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from oncewire.core.canonical import canonical_json, loads
from oncewire.core.errors import ConfigurationError
from oncewire.core.extras import refusal
from oncewire.core.limits import MAX_RETRY_SECONDS
from oncewire.effects.attempt import Attempt
from oncewire.effects.outcomes import Done, EffectOutcome, MaybeSent, NotSent, Rejected

if TYPE_CHECKING:
    import httpx2

__all__ = ["HttpSink", "outcome_of_response", "parse_retry_after"]

# An HTTP method is a token (RFC 9110 §5.6.2).
_METHOD = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")

# Statuses that say the request was not processed (see the module's table).
_NOT_PROCESSED = {408: "request timeout", 425: "too early"}


def _httpx2() -> Any:
    try:
        import httpx2
    except ImportError as exc:
        raise refusal("http", "HttpSink", exc) from exc
    return httpx2


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta-seconds or an HTTP date), or
    ``None`` when it is absent or unreadable. A date in the past is 0; a wait longer than
    :data:`~oncewire.core.limits.MAX_RETRY_SECONDS` (a day) is that long: the server said
    "later", not "never"."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():  # delta-seconds: ASCII digits, as many as it likes
        if len(text.lstrip("0")) > 15:  # past any limit, and int() refuses 4,300 digits
            return float(MAX_RETRY_SECONDS)
        return min(float(int(text)), float(MAX_RETRY_SECONDS))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT; a naive one is read as such
        when = when.replace(tzinfo=datetime.UTC)
    current = time.time() if now is None else now
    return min(max(0.0, when.timestamp() - current), float(MAX_RETRY_SECONDS))


def _body(response: httpx2.Response) -> Any:
    content = response.content
    if not content:
        return None
    media = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        try:
            return loads(content)
        except ValueError:
            pass  # declared JSON, is not: keep what the server said, as text
    return response.text


def _snippet(response: httpx2.Response) -> str:
    text = response.text.strip().replace("\n", " ")
    return f": {text[:200]}" if text else ""


def outcome_of_response(response: httpx2.Response, *, now: float | None = None) -> EffectOutcome:
    """The outcome of a response that arrived whole (the module's table, status rows)."""
    status = response.status_code
    where = f"HTTP {status}"
    if 200 <= status < 300:
        return Done(_body(response))
    if status in (429, 503):
        wait = parse_retry_after(response.headers.get("retry-after"), now=now)
        if status == 429:
            return NotSent(f"{where} too many requests{_snippet(response)}", retry_after=wait)
        if wait is not None:
            return NotSent(f"{where} unavailable{_snippet(response)}", retry_after=wait)
        return MaybeSent(f"{where} without Retry-After{_snippet(response)}")
    if status in _NOT_PROCESSED:
        return NotSent(f"{where} {_NOT_PROCESSED[status]}{_snippet(response)}")
    if status == 409:
        return MaybeSent(
            f"{where} conflict (a request with this key may still be in progress)"
            f"{_snippet(response)}"
        )
    if 400 <= status < 500:
        return Rejected(f"{where}{_snippet(response)}")
    if 300 <= status < 400:
        location = response.headers.get("location", "")
        return MaybeSent(
            f"{where} redirect{f' to {location}' if location else ''}: HttpSink does not follow "
            "redirects (the request may have been applied); point it at the final URL"
        )
    return MaybeSent(f"{where}{_snippet(response)}")


class HttpSink:
    """Send each attempt's payload as JSON to ``url`` with the effect key as
    ``Idempotency-Key``; the outcome follows the module's table.

    ``url`` is a URL or a function of the attempt returning one (``lambda a:
    f"https://api.example.com/orders/{a.payload['order']}/charge"``). ``headers`` are sent with
    every request (the attempt's own headers win over them). ``timeout_seconds`` bounds each
    wait for the server while writing the request and reading the response;
    ``connect_timeout_seconds`` the connection's making (and the wait for a pooled one).
    ``max_connections`` bounds the pool (a dispatcher's ``concurrency`` above it waits for a
    connection, which is ``NotSent`` after ``connect_timeout_seconds``).
    """

    def __init__(
        self,
        url: str | Callable[[Attempt], str],
        *,
        method: str = "POST",
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float = 30.0,
        connect_timeout_seconds: float = 5.0,
        max_connections: int = 32,
    ) -> None:
        if not callable(url) and (not isinstance(url, str) or not url.strip()):
            raise ConfigurationError("url must be a non-empty string or a function")
        if not isinstance(method, str) or not _METHOD.fullmatch(method.strip()):
            # An invalid method would fail inside the attempt, after the claim: refused here.
            raise ConfigurationError(
                f"method must be an HTTP method, such as 'POST', not {method!r}"
            )
        if headers is not None and (
            not isinstance(headers, Mapping)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        ):
            raise ConfigurationError("headers must be a mapping of header names to string values")
        for name, value in (
            ("timeout_seconds", timeout_seconds),
            ("connect_timeout_seconds", connect_timeout_seconds),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"{name} must be a number of seconds > 0")
            if not 0 < value < math.inf:
                raise ConfigurationError(f"{name} must be a number of seconds > 0")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int):
            raise ConfigurationError("max_connections must be an integer >= 1")
        if max_connections < 1:
            raise ConfigurationError("max_connections must be an integer >= 1")
        self.url = url
        self.method = method.strip().upper()
        self.headers = dict(headers or {})
        self.timeout_seconds = float(timeout_seconds)
        self.connect_timeout_seconds = float(connect_timeout_seconds)
        self.max_connections = max_connections
        self._httpx2 = _httpx2()  # fail where the sink is built, not at its first attempt
        self._client: httpx2.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"HttpSink({self.method} {self.url!r})"

    def _pooled(self) -> httpx2.AsyncClient:
        """The client of the running loop, made at its first attempt (again after a close, or
        for a sink given to a second dispatcher, whose loop is another)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            h = self._httpx2
            self._loop = loop
            self._client = h.AsyncClient(
                timeout=h.Timeout(
                    connect=self.connect_timeout_seconds,
                    read=self.timeout_seconds,
                    write=self.timeout_seconds,
                    pool=self.connect_timeout_seconds,
                ),
                limits=h.Limits(
                    max_connections=self.max_connections,
                    max_keepalive_connections=self.max_connections,
                ),
                # No hidden retries (the transport's connect retries stay at 0), no redirects,
                # and no proxy or .netrc from the environment by surprise.
                follow_redirects=False,
                trust_env=False,
            )
        return self._client

    async def __call__(self, attempt: Attempt) -> EffectOutcome:
        h = self._httpx2
        url = self.url(attempt) if callable(self.url) else self.url
        headers = {**self.headers, "Content-Type": "application/json", **attempt.headers()}
        body = canonical_json(attempt.payload).encode()
        try:
            response = await self._pooled().request(self.method, url, content=body, headers=headers)
        except (h.ConnectError, h.ConnectTimeout, h.PoolTimeout) as exc:
            # Raised only while setting up the connection: no byte of the request was written.
            return NotSent(f"could not connect to {url} ({type(exc).__name__}: {exc})")
        except (h.UnsupportedProtocol, h.InvalidURL) as exc:
            return Rejected(f"cannot send to {url!r}: {exc}")
        except h.TimeoutException as exc:
            return MaybeSent(f"timed out after the request started ({type(exc).__name__})")
        except h.TransportError as exc:
            # Written (or partly written), then the connection failed: it may have arrived.
            return MaybeSent(f"the connection failed during the exchange ({type(exc).__name__})")
        return outcome_of_response(response)

    async def aclose(self) -> None:
        """Close the pooled connections (the dispatcher awaits this when it stops)."""
        client, self._client, self._loop = self._client, None, None
        if client is not None:
            await client.aclose()
