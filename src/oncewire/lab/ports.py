"""A loopback port for a server the lab restarts on the same address.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` comes from the ephemeral range
(Linux: 32768-60999), where any process's next ``bind(0)`` or outgoing connection may take it.
A server killed with SIGKILL and started again on the same port (a gateway's webhook server
whose URL a fake platform already holds, a PostgreSQL cluster crashed and restarted) would then
fail with "Address already in use" when a test running beside it took the port meanwhile. A
port below that range is handed out by nobody; :func:`stable_port` picks a free one at random.
"""

from __future__ import annotations

import os
import random
import socket
import time

__all__ = ["stable_port"]

LOW, HIGH = 20_000, 32_000  # below the kernel's ephemeral range


def stable_port() -> int:
    """A loopback port free now, below the ephemeral range (so it stays free while unbound)."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(500):
        port = rng.randrange(LOW, HIGH)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise OSError(f"no free loopback port between {LOW} and {HIGH}")
