"""A sink that publishes each effect to a NATS JetStream stream, stored once per key.

Every attempt is published with the header ``Nats-Msg-Id: <effect key>``. JetStream keeps the
ids it stored within the stream's ``duplicate_window`` and answers a second publish of a known
id with the first message's sequence number and ``duplicate: true``, storing nothing. A
redelivered attempt (the process died after publishing, before recording ``done``) therefore
becomes one stored message, as long as it comes within that window: set the stream's
``duplicate_window`` longer than an effect can stay unrecorded (the dispatcher's lease plus its
retry delays). Past the window, a redelivery is a second message; its ``Oncewire-Redelivery: 1``
header lets a consumer tell.

What happened becomes a typed outcome here, where it is known:

====================================================  =====================================
what happened                                         outcome
====================================================  =====================================
no connection could be made (no server answered,      ``NotSent``: nothing left this process
refused, the connect timeout passed)
no stream takes the subject (the server answered      ``NotSent``: nothing was stored;
"no responders" at once)                              retried, so a stream created later
                                                      gets it
JetStream answered 503 (unavailable, a stream that    ``NotSent``: JetStream said it did
discards new messages when full)                      not store it
JetStream answered 500 (it failed while storing)      ``MaybeSent``
JetStream refused the message (another error: the     ``Rejected``: sending it again as is
expected stream differs, a bad subject)               will be refused again
no acknowledgement within ``timeout_seconds``, or     ``MaybeSent``: the message may be
the connection was lost after the publish was         stored
written
the acknowledgement (new or duplicate)                ``Done`` with ``{"stream", "seq",
                                                      "duplicate"}``
====================================================  =====================================

It is an ``async def`` sink: the dispatcher awaits it on its event loop, ``concurrency``
publishes in flight on one connection. The connection is made at the first attempt and closed
by :meth:`NatsJetStreamSink.aclose`, which the dispatcher awaits when it stops. Install the
client with ``pip install 'oncewire[nats]'``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from oncewire.core.canonical import canonical_json
from oncewire.core.errors import ConfigurationError
from oncewire.core.extras import require
from oncewire.effects.attempt import Attempt
from oncewire.effects.outcomes import Done, EffectOutcome, MaybeSent, NotSent, Rejected

__all__ = ["NatsJetStreamSink"]

log = logging.getLogger("oncewire.sinks.nats")


class NatsJetStreamSink:
    """Publish each attempt's payload (canonical JSON) to ``subject`` on JetStream.

    ``subject`` is a subject or a function of the attempt returning one. ``stream``, when
    given, is the stream the message must land in (``Nats-Expected-Stream``): another stream
    taking the subject is a ``Rejected``. ``timeout_seconds`` bounds the wait for JetStream's
    acknowledgement; ``connect_timeout_seconds`` the connection's making.
    """

    def __init__(
        self,
        subject: str | Callable[[Attempt], str],
        *,
        servers: str | Sequence[str] = "nats://127.0.0.1:4222",
        stream: str | None = None,
        timeout_seconds: float = 5.0,
        connect_timeout_seconds: float = 2.0,
    ) -> None:
        # Fail where the sink is built, not as a sink that raises at its first attempt.
        require("nats", "NatsJetStreamSink")
        if not callable(subject) and (not isinstance(subject, str) or not subject.strip()):
            raise ConfigurationError("subject must be a non-empty string or a function")
        for name, value in (
            ("timeout_seconds", timeout_seconds),
            ("connect_timeout_seconds", connect_timeout_seconds),
        ):
            if not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise ConfigurationError(f"{name} must be a number of seconds > 0")
        if isinstance(servers, str):
            servers = [servers]
        if (
            not isinstance(servers, Sequence)
            or not servers
            or not all(isinstance(s, str) and s for s in servers)
        ):
            raise ConfigurationError("servers must be a NATS URL or a list of them")
        self.subject = subject
        self.servers = list(servers)
        self.stream = stream
        self.timeout_seconds = float(timeout_seconds)
        self.connect_timeout_seconds = float(connect_timeout_seconds)
        self._nc: Any = None  # nats.aio.client.Client, on _loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f"NatsJetStreamSink(subject={self.subject!r}, servers={self.servers!r})"

    async def __call__(self, attempt: Attempt) -> EffectOutcome:
        import nats.errors
        import nats.js.errors

        subject = self.subject(attempt) if callable(self.subject) else self.subject
        try:
            nc = await self._connection()
        except Exception as exc:  # nats raises its own and OSError subclasses here
            return NotSent(f"no connection to NATS ({type(exc).__name__}: {exc})")
        headers = {"Nats-Msg-Id": attempt.key, "Oncewire-Kind": attempt.kind}
        headers.update(attempt.headers())
        del headers["Idempotency-Key"]  # Nats-Msg-Id is JetStream's idempotency key
        payload = canonical_json(attempt.payload).encode()
        try:
            ack = await nc.jetstream().publish(
                subject,
                payload,
                timeout=self.timeout_seconds,
                stream=self.stream,
                headers=headers,
            )
        except nats.js.errors.NoStreamResponseError:
            return NotSent(f"no JetStream stream takes the subject {subject!r}")
        except nats.js.errors.ServiceUnavailableError as exc:
            return NotSent(f"JetStream did not store it: {exc.description or exc}")
        except nats.js.errors.ServerError as exc:
            return MaybeSent(f"JetStream failed while storing it: {exc.description or exc}")
        except nats.js.errors.APIError as exc:
            return Rejected(f"JetStream refused it: {exc.description or exc}")
        except (TimeoutError, nats.errors.TimeoutError):
            return MaybeSent(f"no acknowledgement within {self.timeout_seconds:g}s")
        except nats.errors.Error as exc:
            # Written to the connection, then the connection failed: it may have arrived.
            return MaybeSent(f"the connection failed after the publish ({exc})")
        return Done({"stream": ack.stream, "seq": ack.seq, "duplicate": bool(ack.duplicate)})

    async def _connection(self) -> Any:
        """The connection on the running loop, made at the first call (and again after the
        loop changed, for a sink given to a second dispatcher, or after it closed)."""
        import nats

        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._nc, self._connecting = loop, None, asyncio.Lock()
        assert self._connecting is not None
        async with self._connecting:
            if self._nc is None or self._nc.is_closed:
                # One try, no reconnecting inside the client: a connection that drops is
                # closed, and the next attempt makes a new one. A reconnecting client would
                # buffer publishes and send them later, after their attempts were recorded.
                self._nc = await nats.connect(
                    servers=self.servers,
                    connect_timeout=self.connect_timeout_seconds,
                    allow_reconnect=False,
                    # The client's connect loop counts tries per server: 1 means two tries,
                    # 0.1 s apart, then NoServersError (0 would mean trying for ever).
                    max_reconnect_attempts=1,
                    reconnect_time_wait=0.1,
                    error_cb=_log_error,
                )
            return self._nc

    async def aclose(self) -> None:
        """Flush and close the connection (awaited by the dispatcher when it stops)."""
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            await nc.drain()


async def _log_error(error: Exception) -> None:
    """The client's own error callback: one line, not its default traceback on stderr."""
    log.warning("NATS connection: %s: %s", type(error).__name__, error)
