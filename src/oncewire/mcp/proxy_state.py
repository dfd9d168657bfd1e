"""What a proxy holds in memory about the requests under way (nothing of it needs to survive a
crash: the store holds what must)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from oncewire.storage.records import Effect

__all__ = ["Intercepted", "Live", "NotSentYet", "Relayed", "Unfinished", "id_key"]


@dataclass
class Relayed:
    """A client request relayed to the server under the proxy's id."""

    client_id: Any
    method: str


@dataclass
class Live:
    """What only this process knows of a call a client waits for here."""

    meta: dict[str, Any]
    waiting: int = 0
    result: dict[str, Any] | None = None  # the server's answer, as it came
    error: dict[str, Any] | None = None  # the server's JSON-RPC error, as it came
    upstream_id: int | None = None  # the forwarded request's id while it is in flight


@dataclass
class Intercepted:
    """A tools/call the proxy answers itself, by the client's id."""

    params: Any = None  # the request's, to tell a resend from another request under its id
    key: str | None = None
    task: asyncio.Task[None] | None = None
    cancelled: bool = False  # the client sent notifications/cancelled for it
    reason: str = ""
    accepted: bool = False  # its accept has returned (until then it may still commit)


class Unfinished(Exception):
    """The server's connection ended with the call not ended: said so to the client."""

    def __init__(self, effect: Effect) -> None:
        super().__init__(effect.key)
        self.effect = effect


class NotSentYet(Unfinished):
    """The server's connection ended before the call was sent (its effect ``pending``)."""


def id_key(request_id: Any) -> str:
    """A JSON-RPC id as a dictionary key: ``1`` and ``"1"`` stay apart."""
    return json.dumps(request_id)
