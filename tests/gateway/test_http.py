"""The gateway's HTTP door: which failures prove a request never left, and shutting a blocked
exchange from another thread."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx2
import pytest

from oncewire.gateway.http import Reach, SocketShutter, Timeouts, make_client, reach
from tests.conftest import _child_env

NEVER_LEFT = [httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout]
MAY_HAVE_ARRIVED = [
    httpx2.ReadTimeout,
    httpx2.ReadError,
    httpx2.WriteTimeout,
    httpx2.WriteError,
    httpx2.RemoteProtocolError,
    httpx2.LocalProtocolError,
    httpx2.CloseError,
]


@pytest.mark.parametrize(
    ("error", "expected"),
    [(e, Reach.NEVER_LEFT) for e in NEVER_LEFT]
    + [(e, Reach.MAY_HAVE_ARRIVED) for e in MAY_HAVE_ARRIVED],
)
def test_classification_of_each_transport_failure(
    error: type[httpx2.TransportError], expected: Reach
) -> None:
    # A real server cannot produce each of these on demand; the transport raises them here.
    def fail(request: httpx2.Request) -> httpx2.Response:
        raise error("simulated", request=request)

    client = make_client(Timeouts(), transport=httpx2.MockTransport(fail))
    with pytest.raises(error) as caught:
        client.post("http://model.test/v1/chat/completions", json={})

    assert reach(caught.value) is expected


def test_an_unknown_failure_may_have_arrived() -> None:
    assert reach(RuntimeError("anything")) is Reach.MAY_HAVE_ARRIVED


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A loopback server that accepts, reads and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    # Wake the accepting thread and wait for it, so a connection it accepts while the test ends
    # is closed here, not left to the collector (an unclosed-socket warning in a later test).
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    thread.join(timeout=10)
    for conn in accepted:
        conn.close()


def test_a_refused_connection_never_left(closed_port: int) -> None:
    client = make_client(Timeouts(connect_seconds=2))

    with pytest.raises(httpx2.TransportError) as caught:
        client.get(f"http://127.0.0.1:{closed_port}/")

    assert reach(caught.value) is Reach.NEVER_LEFT


def test_a_server_that_reads_and_stays_silent_may_have_the_request(silent_server: int) -> None:
    client = make_client(Timeouts(read_seconds=0.2))

    with pytest.raises(httpx2.TransportError) as caught:
        client.post(f"http://127.0.0.1:{silent_server}/", json={})

    assert isinstance(caught.value, httpx2.ReadTimeout)
    assert reach(caught.value) is Reach.MAY_HAVE_ARRIVED


def test_shutting_the_socket_from_another_thread_ends_a_blocked_exchange(
    silent_server: int,
) -> None:
    # The read timeout is far past the test's own: only the shutter can end this exchange.
    client = make_client(Timeouts(read_seconds=600), keepalive=False)
    shutter = SocketShutter()
    timer = threading.Timer(0.2, shutter.shut)
    timer.start()

    with pytest.raises(httpx2.TransportError) as caught:
        client.post(f"http://127.0.0.1:{silent_server}/", json={}, extensions=shutter.extensions)
    timer.join()

    assert shutter.is_shut
    assert reach(caught.value) is Reach.MAY_HAVE_ARRIVED


def test_a_shut_before_the_connection_exists_is_applied_when_it_appears(
    silent_server: int,
) -> None:
    client = make_client(Timeouts(read_seconds=600), keepalive=False)
    shutter = SocketShutter()
    shutter.shut()

    with pytest.raises(httpx2.TransportError):
        client.post(f"http://127.0.0.1:{silent_server}/", json={}, extensions=shutter.extensions)


def test_the_client_has_a_timeout_per_phase() -> None:
    client = make_client(
        Timeouts(connect_seconds=1, read_seconds=2, write_seconds=3, pool_seconds=4)
    )

    assert client.timeout.as_dict() == {"connect": 1, "read": 2, "write": 3, "pool": 4}


def test_the_core_package_and_the_config_import_without_the_gateway_extra() -> None:
    code = (
        "import sys; sys.modules['httpx2'] = None\n"
        "import oncewire, oncewire.gateway, oncewire.gateway.config\n"
        "try:\n"
        "    import oncewire.gateway.model\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=_child_env(), capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 0, result.stderr
    assert "pip install 'oncewire[gateway]'" in result.stdout
