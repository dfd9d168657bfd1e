"""The gateway's one door to HTTP: httpx2 is imported here and nowhere else.

Three things every adapter and the model client need from the transport:

* a client with a timeout per phase (connect, read, write, pool) and no hidden retries;
* :func:`reach`: whether a failed request could have reached the server. Only a failure while
  setting up the connection (or waiting for one from the pool) proves that no byte of the
  request was written; every other transport failure may have been preceded by a server that
  read, applied and answered the request;
* :class:`SocketShutter`: ending a blocked exchange from another thread. ``Response.close()``
  does not wake a thread blocked reading the response; shutting the socket down does, and the
  reader then fails at once with a transport error.
"""

from __future__ import annotations

import enum
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from oncewire.core.extras import refusal

try:
    import httpx2
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("gateway", "oncewire's gateway", exc) from exc

__all__ = [
    "Client",
    "PathSecret",
    "Reach",
    "Response",
    "SocketShutter",
    "Timeouts",
    "Transport",
    "TransportError",
    "iter_sse",
    "make_client",
    "reach",
]

# The types callers see, so that no other module imports httpx2 itself.
Client = httpx2.Client
Response = httpx2.Response
TransportError = httpx2.TransportError
Transport = httpx2.BaseTransport


@dataclass(frozen=True)
class Timeouts:
    """Seconds allowed per phase of one exchange; ``read_seconds`` bounds each wait for bytes
    (a stream that goes silent that long fails), not the whole exchange."""

    connect_seconds: float = 5.0
    read_seconds: float = 120.0
    write_seconds: float = 30.0
    pool_seconds: float = 5.0


@dataclass(frozen=True)
class PathSecret:
    """A secret a URL path must carry (a Telegram bot token) that no log line, exception or repr
    may show: requests name ``placeholder`` in their path and the transport puts ``secret`` in
    its place only while the request is on the wire."""

    placeholder: str
    secret: str = field(repr=False)


class _SecretPathTransport(httpx2.BaseTransport):
    def __init__(self, inner: httpx2.BaseTransport, path_secret: PathSecret) -> None:
        self._inner = inner
        self._placeholder = path_secret.placeholder.encode()
        self._secret = path_secret.secret.encode()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        shown = request.url
        real = shown.raw_path.replace(self._placeholder, self._secret)
        request.url = shown.copy_with(raw_path=real)
        try:
            return self._inner.handle_request(request)
        finally:
            # The client logs the request and attaches it to errors after this returns.
            request.url = shown

    def close(self) -> None:
        self._inner.close()


def make_client(
    timeouts: Timeouts,
    *,
    keepalive: bool = True,
    headers: dict[str, str] | None = None,
    transport: httpx2.BaseTransport | None = None,
    path_secret: PathSecret | None = None,
) -> httpx2.Client:
    """A sync client with per-phase timeouts that never retries on its own (the transport's
    connect retries stay at 0). ``keepalive=False`` opens one connection per request, which is
    what lets :class:`SocketShutter` see the socket of every exchange. With ``path_secret`` the
    client ignores proxy settings from the environment (it brings its own transport)."""
    limits = httpx2.Limits(max_connections=100, max_keepalive_connections=20 if keepalive else 0)
    if path_secret is not None:
        inner = transport if transport is not None else httpx2.HTTPTransport(limits=limits)
        transport = _SecretPathTransport(inner, path_secret)
    timeout = httpx2.Timeout(
        connect=timeouts.connect_seconds,
        read=timeouts.read_seconds,
        write=timeouts.write_seconds,
        pool=timeouts.pool_seconds,
    )
    return httpx2.Client(
        timeout=timeout, limits=limits, headers=headers, transport=transport, follow_redirects=False
    )


class Reach(enum.Enum):
    """Whether a request that failed in transport could have reached the server."""

    # Failed while connecting or waiting for a pooled connection: no byte was written.
    NEVER_LEFT = "never_left"
    # Failed after the request started going out: the server may have read and applied it.
    MAY_HAVE_ARRIVED = "may_have_arrived"


# httpcore2 raises these only before any byte of the request is written (measured on loopback:
# a half-written request surfaces as a read failure, never as a connect error).
_NEVER_LEFT: tuple[type[BaseException], ...] = (
    httpx2.ConnectError,
    httpx2.ConnectTimeout,
    httpx2.PoolTimeout,
    httpx2.UnsupportedProtocol,
)


def reach(exc: BaseException) -> Reach:
    """Classify a failed request. Anything not known to fail before sending may have arrived:
    guessing "never left" wrongly would send a second copy of the request."""
    return Reach.NEVER_LEFT if isinstance(exc, _NEVER_LEFT) else Reach.MAY_HAVE_ARRIVED


def iter_sse(response: httpx2.Response) -> Iterator[tuple[str, str]]:
    """The ``(event, data)`` pairs of a ``text/event-stream`` response, as they arrive."""
    for event in httpx2.EventSource(response):
        yield event.event, event.data


class SocketShutter:
    """Holds the socket of one exchange so that another thread can shut it down.

    Pass :attr:`extensions` to the request: the socket is captured as soon as the connection is
    made, so an exchange blocked before the response headers (a server that never answers) can be
    ended as well as one blocked in the body. A :meth:`shut` that comes before the connection
    exists is remembered and applied the moment the socket appears. Needs a connection of its
    own per exchange (``make_client(keepalive=False)``): a reused connection makes no connect
    event to capture it from.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._shut = False

    @property
    def extensions(self) -> dict[str, Any]:
        return {"trace": self._trace}

    @property
    def is_shut(self) -> bool:
        with self._lock:
            return self._shut

    def _trace(self, name: str, info: dict[str, Any]) -> None:
        if name in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            stream = info.get("return_value")
            sock = None if stream is None else stream.get_extra_info("socket")
            if isinstance(sock, socket.socket):
                self._capture(sock)

    def attach(self, response: httpx2.Response) -> None:
        """Capture the socket from a response's network stream (for a reused connection)."""
        stream = response.extensions.get("network_stream")
        sock = None if stream is None else stream.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            self._capture(sock)

    def _capture(self, sock: socket.socket) -> None:
        with self._lock:
            self._socket = sock
            shut = self._shut
        if shut:
            _shutdown(sock)

    def shut(self) -> None:
        """End the exchange: its reader or writer fails promptly with a transport error."""
        with self._lock:
            self._shut = True
            sock = self._socket
        if sock is not None:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or never connected: nothing left to wake
