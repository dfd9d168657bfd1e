"""The fake Discord's Gateway: a ``websockets`` sync server speaking Discord's Gateway protocol.

One connection, as Discord runs it:

1. the server sends Hello (op 10, ``heartbeat_interval`` in milliseconds);
2. the client sends Identify (op 2: ``token``, ``intents``) or Resume (op 6: ``token``,
   ``session_id``, ``seq``). A token that is not the bot's closes the connection with 4004
   (authentication failed), intents outside the allowed ones with 4014 (disallowed intents).
   Identify starts a session and answers ``READY`` (``session_id``, ``resume_gateway_url``,
   ``user``); Resume of a session that is still resumable replays every dispatch after the
   client's ``seq`` and then sends ``RESUMED``; of any other, Invalid Session (op 9, ``d``
   false), after which the client identifies afresh;
3. every dispatch (op 0: ``MESSAGE_CREATE``, the bot's own messages included) carries the
   session's next ``s``; a Heartbeat (op 1) is answered by a Heartbeat ACK (op 11).

A session whose connection ends stays resumable for ``resume_window_seconds`` and keeps every
dispatch meanwhile, so a Resume replays them: Discord's re-delivery. Past the window (or after
:meth:`GatewayHub.expire_sessions`) it is forgotten, and what arrived meanwhile can only be read
back over REST (a backfill). Without the MESSAGE_CONTENT intent (1 << 15) a message in a guild
arrives with empty ``content``, as on Discord.

The :meth:`GatewayHub.reconnect` control makes the live connections misbehave the ways Discord
does: Reconnect (op 7), Invalid Session (op 9, resumable or not), a close with a code (4000 by
default), or ``zombie``: heartbeats are no longer acknowledged on those connections; with
``rewind`` (a number of dispatches) or ``rewind_to`` (a message id: from that message's dispatch
on), the next Resume replays dispatches the client had already handled as well.
:meth:`GatewayHub.dispatch` also serves the ``redeliver`` control: a user's message dispatched
again, as a second ``MESSAGE_CREATE`` with the next ``s``.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oncewire.core.extras import refusal

try:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.server import Server, ServerConnection, serve
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("gateway", "oncewire's fake Discord", exc) from exc

__all__ = ["MESSAGE_CONTENT", "GatewayHub", "serve_gateway"]

MESSAGE_CONTENT = 1 << 15
# Every intent Discord defines (through 1 << 25): what the fake allows unless told otherwise.
ALL_INTENTS = (1 << 26) - 1

DISPATCH, HEARTBEAT, IDENTIFY, RESUME, RECONNECT, INVALID_SESSION, HELLO, HEARTBEAT_ACK = (
    0,
    1,
    2,
    6,
    7,
    9,
    10,
    11,
)


@dataclass
class _Session:
    id: str
    intents: int
    seq: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)  # every dispatch, in order
    connection: ServerConnection | None = None
    ended_at: float | None = None  # when its last connection ended (None: connected)
    expired: bool = False
    identified_at: float = field(default_factory=time.time)
    resumes: int = 0
    rewind: int = 0  # the next Resume replays this many dispatches before the client's seq
    rewind_to: str | None = None  # ...or every one from this message's dispatch on


class GatewayHub:
    """The sessions of one bot and what is dispatched to them (thread-safe)."""

    def __init__(
        self,
        token: str,
        user: Mapping[str, Any],
        *,
        heartbeat_ms: int = 41250,
        allowed_intents: int = ALL_INTENTS,
        resume_window_seconds: float = 120.0,
    ) -> None:
        self.token = token
        self.user = dict(user)
        self.heartbeat_ms = heartbeat_ms
        self.allowed_intents = allowed_intents
        self.resume_window_seconds = resume_window_seconds
        self.url = ""  # ws://host:port, once serving
        self._lock = threading.RLock()
        self._sessions: dict[str, _Session] = {}
        self._zombies: set[ServerConnection] = set()
        self.identifies = 0
        self.heartbeats = 0

    # -- what the REST side and the controls call ------------------------------------------
    def dispatch(self, event: str, data: Mapping[str, Any], *, content_intent: bool) -> None:
        """Send ``event`` to every session that is connected or still resumable.

        ``content_intent``: the data carries message content that needs MESSAGE_CONTENT.
        """
        with self._lock:
            for session in self._live():
                payload = dict(data)
                if content_intent and not session.intents & MESSAGE_CONTENT:
                    payload["content"] = ""
                session.seq += 1
                frame = {"op": DISPATCH, "t": event, "s": session.seq, "d": payload}
                session.events.append(frame)
                if session.connection is not None:
                    self._send(session.connection, frame)

    def reconnect(
        self, how: str, *, code: int = 4000, rewind: int = 0, rewind_to: str | None = None
    ) -> int:
        """Make every live connection misbehave ``how``: ``op7``, ``invalid_session``,
        ``invalid_session_resumable``, ``close`` (with ``code``) or ``zombie``. With
        ``rewind``, the session's next Resume also replays that many message dispatches the
        client had handled (a re-delivery); with ``rewind_to``, every one from the dispatch of
        that message on (none if the session never had it). Returns how many connections it
        reached."""
        if type(rewind) is not int or rewind < 0:
            raise ValueError("rewind is a number of dispatches >= 0")
        if how not in ("op7", "invalid_session", "invalid_session_resumable", "close", "zombie"):
            raise ValueError(f"unknown reconnect {how!r}")
        if how == "close" and not (1000 <= code < 5000):
            raise ValueError("a close code is 1000-4999")
        with self._lock:
            reached = [s for s in self._sessions.values() if s.connection is not None]
            for session in reached:
                connection = session.connection
                assert connection is not None
                session.rewind = rewind
                session.rewind_to = rewind_to
                if how == "op7":
                    self._send(connection, {"op": RECONNECT, "d": None})
                elif how.startswith("invalid_session"):
                    resumable = how.endswith("resumable")
                    if not resumable:
                        session.expired = True
                    self._send(connection, {"op": INVALID_SESSION, "d": resumable})
                elif how == "close":
                    threading.Thread(
                        target=connection.close, args=(code, "closed by the fake"), daemon=True
                    ).start()
                else:
                    self._zombies.add(connection)
            return len(reached)

    def expire_sessions(self) -> int:
        """Forget every session, as Discord does past its resume window: a Resume then gets
        Invalid Session. Returns how many were forgotten."""
        with self._lock:
            count = 0
            for session in self._sessions.values():
                count += not session.expired
                session.expired = True
            return count

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "identifies": self.identifies,
                "heartbeats": self.heartbeats,
                "sessions": [
                    {
                        "session_id": s.id,
                        "seq": s.seq,
                        "connected": s.connection is not None,
                        "resumable": self._resumable(s),
                        "resumes": s.resumes,
                        "intents": s.intents,
                    }
                    for s in self._sessions.values()
                ],
            }

    # -- one connection ---------------------------------------------------------------------
    def handle(self, connection: ServerConnection) -> None:
        """The websockets handler: one connection from Hello to its end."""
        session: _Session | None = None
        try:
            self._send(connection, {"op": HELLO, "d": {"heartbeat_interval": self.heartbeat_ms}})
            while True:
                try:
                    raw = connection.recv(timeout=1.0)
                except TimeoutError:
                    continue
                try:
                    frame = json.loads(raw)
                    op = frame["op"]
                except (ValueError, TypeError, KeyError):
                    connection.close(4002, "Error while decoding payload.")
                    return
                data = frame.get("d")
                if op == HEARTBEAT:
                    with self._lock:
                        self.heartbeats += 1
                        zombie = connection in self._zombies
                    if not zombie:
                        self._send(connection, {"op": HEARTBEAT_ACK})
                elif op == IDENTIFY:
                    if session is not None:
                        connection.close(4005, "Already authenticated.")
                        return
                    session = self._identify(connection, data)
                    if session is None:
                        return
                elif op == RESUME:
                    if session is not None:
                        connection.close(4005, "Already authenticated.")
                        return
                    session = self._resume(connection, data)
                elif session is None:
                    connection.close(4003, "Not authenticated.")
                    return
                else:
                    connection.close(4001, "Unknown opcode.")
                    return
        except ConnectionClosed:
            return
        finally:
            with self._lock:
                self._zombies.discard(connection)
                if session is not None and session.connection is connection:
                    session.connection = None
                    session.ended_at = time.time()

    def _identify(self, connection: ServerConnection, data: Any) -> _Session | None:
        data = data if isinstance(data, Mapping) else {}
        if data.get("token") != self.token:
            connection.close(4004, "Authentication failed.")
            return None
        intents = data.get("intents")
        if type(intents) is not int or intents & ~self.allowed_intents:
            connection.close(4014, "Disallowed intent(s).")
            return None
        with self._lock:
            self.identifies += 1
            session = _Session(id=secrets.token_hex(16), intents=intents, connection=connection)
            self._sessions[session.id] = session
            session.seq += 1
            ready = {
                "v": 10,
                "user": self.user,
                "guilds": [],
                "session_id": session.id,
                "resume_gateway_url": self.url,
                "application": {"id": self.user["id"], "flags": 0},
            }
            frame = {"op": DISPATCH, "t": "READY", "s": session.seq, "d": ready}
            session.events.append(frame)
            self._send(connection, frame)
        return session

    def _resume(self, connection: ServerConnection, data: Any) -> _Session | None:
        data = data if isinstance(data, Mapping) else {}
        if data.get("token") != self.token:
            connection.close(4004, "Authentication failed.")
            return None
        seq = data.get("seq")
        with self._lock:
            session = self._sessions.get(str(data.get("session_id")))
            if session is None or not self._resumable(session) or type(seq) is not int:
                self._send(connection, {"op": INVALID_SESSION, "d": False})
                return None  # the client may identify on this connection now
            old = session.connection
            session.connection = connection
            session.ended_at = None
            session.resumes += 1
            replayed = [f for f in session.events if f["t"] not in ("READY", "RESUMED")]
            handled = [f for f in replayed if f["s"] <= seq]
            back = min(session.rewind, len(handled))
            start = handled[-back]["s"] - 1 if back else seq
            if session.rewind_to is not None:
                marks = [f["s"] for f in handled if f["d"].get("id") == session.rewind_to]
                start = min([start, *(s - 1 for s in marks[:1])])
            session.rewind, session.rewind_to = 0, None
            for frame in replayed:
                if frame["s"] > min(seq, start):
                    self._send(connection, frame)
            session.seq += 1
            resumed = {"op": DISPATCH, "t": "RESUMED", "s": session.seq, "d": {}}
            session.events.append(resumed)
            self._send(connection, resumed)
        if old is not None and old is not connection:
            threading.Thread(
                target=old.close, args=(4000, "resumed elsewhere"), daemon=True
            ).start()
        return session

    # -- pieces ------------------------------------------------------------------------------
    def _resumable(self, session: _Session) -> bool:
        if session.expired:
            return False
        if session.ended_at is None:
            return True
        return time.time() - session.ended_at < self.resume_window_seconds

    def _live(self) -> list[_Session]:
        return [s for s in self._sessions.values() if self._resumable(s)]

    def _send(self, connection: ServerConnection, frame: Mapping[str, Any]) -> None:
        try:
            connection.send(json.dumps(frame))
        except ConnectionClosed:
            pass  # the connection's handler forgets it; a resumable session keeps the frame


def serve_gateway(host: str, hub: GatewayHub) -> tuple[Server, Callable[[], None]]:
    """Bind the Gateway's server on ``host`` (any free port) and set ``hub.url``: (the server,
    its serve-forever callable, to run in a thread)."""
    server = serve(hub.handle, host, 0, compression=None, ping_interval=None)
    port = server.socket.getsockname()[1]
    hub.url = f"ws://{host}:{port}"
    return server, server.serve_forever
