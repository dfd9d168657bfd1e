"""A journaled fake chat platform for tests and the lab, with scripted wire faults.

Every send, edit and delete the fake accepts is appended to its journal (one JSON object per
line) and fsynced before it answers, so what the chat shows survives a SIGKILL of the process
that used the fake: a new :class:`FakePlatform` on the same journal continues from it, and
:class:`ChatView` (the oracle) reads it from any process.

Faults match an operation by platform, kind of operation, chat and a substring of the rendered
text, and fire a bounded number of times (counted in the journal, across restarts):

=============  ==============================================================================
``timeout``     not accepted; the caller sees a timeout (ambiguous: it cannot know)
``ack_lost``    accepted and journaled; the caller sees a timeout (ambiguous)
``rate_limit``  refused with ``retry_after`` (a 429)
``conn_error``  refused: the connection failed before the request was written
``rejected``    refused for good (chat gone, bot blocked)
``hold``        park before acceptance (for crash tests); after ``hold_seconds``, a timeout
``hold_after``  accept and journal, then park; after ``hold_seconds``, a timeout
``gone``        an edit or delete: someone else deleted the target first (journaled as a
                delete ``by`` someone else); the caller sees :class:`Gone` (sends never match)
=============  ==============================================================================

An edit of a message deleted before answers :class:`Gone` too, as Telegram's "message to edit
not found" does; a repeated delete is a no-op. With ``honour_keys`` the fake drops a send whose
``request.idempotency_key`` it accepted before (as a Discord nonce or an ``Idempotency-Key``
header does) and answers the message that send made; ``key_window_seconds`` bounds how long a
key is remembered (a Discord nonce: minutes), counted from the send that made the message.

``python -m oncewire.testing view JOURNAL...`` prints what each chat shows;
``python -m oncewire.testing serve ...`` runs a fake as its own process
(:mod:`oncewire.testing.fake_platform_process`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncewire.core.errors import ConfigurationError
from oncewire.replies.splitting import rejoin
from oncewire.replies.wire import (
    Delivered,
    Gone,
    MaybeDelivered,
    NotDelivered,
    PlatformProfile,
    RejectedForGood,
    WireOutcome,
)
from oncewire.storage.replies import SendRequest

__all__ = ["FAULT_KINDS", "ChatView", "Copy", "FakePlatform", "Fault", "VisibleMessage"]

FAULT_KINDS = (
    "timeout",
    "ack_lost",
    "rate_limit",
    "conn_error",
    "rejected",
    "hold",
    "hold_after",
    "gone",
)


@dataclass(frozen=True, slots=True)
class Fault:
    """A scripted fault; ``name`` identifies it in the journal (default: its position)."""

    kind: str
    op: str = "any"  # send, edit, delete or any
    chat: str | None = None
    contains: str | None = None
    platform: str | None = None
    times: int = 1
    retry_after: float = 1.0
    hold_seconds: float = 60.0
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ConfigurationError(f"unknown fault {self.kind!r} (one of {FAULT_KINDS})")
        if self.op not in ("send", "edit", "delete", "any"):
            raise ConfigurationError(f"unknown operation {self.op!r}")
        if self.times < 0 or not (0 <= self.retry_after < float("inf")):
            raise ConfigurationError("times and retry_after must be finite and >= 0")
        if not (0 <= self.hold_seconds < float("inf")):
            raise ConfigurationError("hold_seconds must be finite and >= 0")

    def matches(self, platform: str, op: str, chat: str, text: str) -> bool:
        return (
            (self.platform is None or self.platform == platform)
            and self.op in ("any", op)
            and not (self.kind == "gone" and op == "send")  # a send has no target to lose
            and (self.chat is None or self.chat == chat)
            and (self.contains is None or self.contains in text)
        )


class FakePlatform:
    """One fake platform (``name``, e.g. ``fk_tg``) behind a profile, journaled to ``journal``."""

    def __init__(
        self,
        journal: Path | str,
        profile: PlatformProfile,
        *,
        name: str | None = None,
        faults: Sequence[Fault] = (),
        honour_keys: bool = False,
        key_window_seconds: float = float("inf"),
    ) -> None:
        self.journal = Path(journal)
        self.honour_keys = honour_keys
        self.key_window_seconds = key_window_seconds
        # idempotency key -> (the message its send made, when it was made)
        self._keys: dict[str, tuple[str, float]] = {}
        self._profile = profile
        self.name = name or profile.name
        self.faults = [f if f.name else _named(f, str(n)) for n, f in enumerate(faults)]
        self._lock = threading.Lock()
        self._release = threading.Event()
        self.calls: list[tuple[str, str]] = []  # (op, outcome) as the caller saw them
        self._next_id = 1
        self._fired: dict[str, int] = {}
        self._alive: dict[str, str] = {}  # message id -> chat, for messages not deleted
        self._deleted: dict[str, str] = {}  # message id -> chat, for deleted messages
        for entry in _read(self.journal):
            if entry["event"] == "send":
                self._next_id = max(self._next_id, int(entry["message_id"]) + 1)
                self._alive[entry["message_id"]] = entry["chat"]
                if entry.get("key"):
                    self._keys[entry["key"]] = (entry["message_id"], float(entry["ts"]))
            elif entry["event"] == "delete":
                self._alive.pop(entry["message_id"], None)
                self._deleted[entry["message_id"]] = entry["chat"]
            elif entry["event"] == "fault":
                self._fired[entry["fault"]] = self._fired.get(entry["fault"], 0) + 1
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @property
    def profile(self) -> PlatformProfile:
        return self._profile

    def close(self) -> None:
        self._release.set()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def release_holds(self) -> None:
        """Let every parked operation go on (as a timeout)."""
        self._release.set()

    # -- the platform contract ---------------------------------------------------------------
    def send(self, request: SendRequest, body: str, *, marked: bool) -> WireOutcome:
        text = self._profile.render(body, marked)
        return self._call("send", request, None, text)

    def edit(
        self, request: SendRequest, message_id: str, body: str, *, marked: bool
    ) -> WireOutcome:
        if not self._profile.can_edit:
            return RejectedForGood("this platform cannot edit messages")
        return self._call("edit", request, message_id, self._profile.render(body, marked))

    def delete(self, request: SendRequest, message_id: str) -> WireOutcome:
        if not self._profile.can_delete:
            return RejectedForGood("this platform cannot delete messages")
        return self._call("delete", request, message_id, "")

    # -- internals ---------------------------------------------------------------------------
    def _write(self, entry: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
        os.fsync(self._fd)

    def record_fault(self, fault: Fault, op: str, chat: str, text: str = "") -> None:
        """Journal ``fault`` as fired on ``op`` in ``chat`` (for a fault applied outside
        :meth:`send`, :meth:`edit` and :meth:`delete`: a listener blackout)."""
        with self._lock:
            self._fired[fault.name] = self._fired.get(fault.name, 0) + 1
            self._write_fault(fault, op, chat, text)

    def _write_fault(self, fault: Fault, op: str, chat: str, text: str) -> None:
        self._write(
            {
                "event": "fault",
                "fault": fault.name,
                "kind": fault.kind,
                "op": op,
                "platform": self.name,
                "chat": chat,
                "text": text[:200],
                "pid": os.getpid(),
                "ts": time.time(),
            }
        )

    def _fault_for(self, op: str, chat: str, text: str) -> Fault | None:
        for fault in self.faults:
            if self._fired.get(fault.name, 0) < fault.times and fault.matches(
                self.name, op, chat, text
            ):
                self._fired[fault.name] = self._fired.get(fault.name, 0) + 1
                return fault
        return None

    def _call(
        self, op: str, request: SendRequest, message_id: str | None, text: str
    ) -> WireOutcome:
        outcome = self._decide(op, request, message_id, text)
        self.calls.append((op, type(outcome).__name__))
        return outcome

    def _decide(
        self, op: str, request: SendRequest, message_id: str | None, text: str
    ) -> WireOutcome:
        if len(text) > 0 and _units(text, self._profile) > self._profile.cap:
            return RejectedForGood(f"message longer than {self._profile.cap}")
        with self._lock:
            fault = self._fault_for(op, request.chat, text)
            if fault is not None:
                self._write_fault(fault, op, request.chat, text)
            kind = fault.kind if fault else None
            if kind == "conn_error":
                return NotDelivered("connection refused before the request was written")
            if kind == "rate_limit":
                assert fault is not None
                return NotDelivered("429 too many requests", retry_after=fault.retry_after)
            if kind == "rejected":
                return RejectedForGood("403 bot was blocked by the user")
            if kind == "timeout":
                return MaybeDelivered("timed out waiting for the platform")
            if kind == "gone":
                return self._gone(request, message_id)
            if kind != "hold":
                accepted = self._accept(op, request, message_id, text)
                if isinstance(accepted, RejectedForGood):
                    return accepted
                if kind is None:
                    return accepted
                if kind == "ack_lost":
                    return MaybeDelivered("timed out after the request was sent")
        assert fault is not None  # hold or hold_after: park outside the lock
        self._release.wait(fault.hold_seconds)
        return MaybeDelivered("timed out (the request was parked)")

    def _accept(
        self, op: str, request: SendRequest, message_id: str | None, text: str
    ) -> WireOutcome:
        key = request.idempotency_key if op == "send" else None
        now = time.time()
        if self.honour_keys and key is not None and key in self._keys:
            made, at = self._keys[key]
            if now - at < self.key_window_seconds:
                return Delivered(made)  # a repeat of a key: the platform drops it
        if op == "send":
            message_id = str(self._next_id)
            self._next_id += 1
            self._alive[message_id] = request.chat
            if key is not None:
                self._keys[key] = (message_id, now)
        elif op == "delete" and message_id in self._deleted:
            if self._deleted[message_id] == request.chat:
                return Delivered(message_id)  # already gone: a repeated delete is a no-op
            return RejectedForGood(f"message {message_id} not found in this chat")
        elif op == "edit" and self._deleted.get(message_id or "") == request.chat:
            return Gone(f"message {message_id} to edit not found")
        elif message_id not in self._alive or self._alive[message_id] != request.chat:
            return RejectedForGood(f"message {message_id} not found in this chat")
        elif op == "delete":
            del self._alive[message_id]
            self._deleted[message_id] = request.chat
        self._write(
            {
                "event": op,
                "platform": self.name,
                "chat": request.chat,
                "thread": request.thread,
                "reply_to": request.reply_to,
                "message_id": message_id,
                "text": text,
                "key": key,
                "ts": now,
            }
        )
        assert message_id is not None
        return Delivered(message_id)

    def _gone(self, request: SendRequest, message_id: str | None) -> WireOutcome:
        """Someone else deletes the target (journaled as theirs), then the operation finds it
        gone."""
        if message_id is not None and self._alive.get(message_id) == request.chat:
            del self._alive[message_id]
            self._deleted[message_id] = request.chat
            self._write(
                {
                    "event": "delete",
                    "by": "someone else",
                    "platform": self.name,
                    "chat": request.chat,
                    "thread": request.thread,
                    "reply_to": request.reply_to,
                    "message_id": message_id,
                    "text": "",
                    "ts": time.time(),
                }
            )
        return Gone(f"message {message_id} not found")


def _named(fault: Fault, name: str) -> Fault:
    from dataclasses import replace

    return replace(fault, name=name)


def _units(text: str, profile: PlatformProfile) -> int:
    from oncewire.replies.splitting import measure

    return measure(text, profile.unit)


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a torn last line: the write it belonged to was never answered
    return entries


# -- the oracle -------------------------------------------------------------------------------
@dataclass
class VisibleMessage:
    """One message a chat shows now, as its journal says (after its edits, unless deleted)."""

    platform: str
    chat: str
    thread: str
    reply_to: str | None
    message_id: str
    text: str
    edits: int = 0


@dataclass
class Copy:
    """One rendition of a reply on screen, re-joined across its chunks."""

    texts: list[str] = field(default_factory=list)
    marked: bool = False
    complete: bool = False
    message_ids: list[str] = field(default_factory=list)
    piece_marks: list[bool] = field(default_factory=list)  # which pieces carry the marker

    @property
    def text(self) -> str:
        return rejoin(self.texts)

    @property
    def text_as_read(self) -> str:
        """The text as a person reads it: a marked piece re-sends a chunk, so the earlier piece
        it repeats, or the cut-off start of it (a preview or a send whose acknowledgement was
        lost, left on screen), is read as superseded."""
        kept: list[str] = []
        for body, marked in zip(self.texts, self.piece_marks, strict=True):
            if marked and kept and kept[-1] and body.startswith(kept[-1]):
                kept.pop()
            elif marked and body in kept:
                continue
            kept.append(body)
        return rejoin(kept)


class ChatView:
    """What the chats show, read from one or more journals (any process may read them)."""

    def __init__(self, journals: Iterable[Path | str]) -> None:
        self.messages: list[VisibleMessage] = []
        self.faults: list[dict[str, Any]] = []
        self.operations: list[dict[str, Any]] = []
        by_id: dict[tuple[str, str], VisibleMessage] = {}
        for journal in journals:
            for entry in _read(Path(journal)):
                key = (entry.get("platform", ""), str(entry.get("message_id")))
                if entry["event"] == "fault":
                    self.faults.append(entry)
                    continue
                self.operations.append(entry)
                if entry["event"] == "send":
                    message = VisibleMessage(
                        entry["platform"],
                        entry["chat"],
                        entry.get("thread", ""),
                        entry.get("reply_to"),
                        entry["message_id"],
                        entry["text"],
                    )
                    by_id[key] = message
                    self.messages.append(message)
                elif entry["event"] == "edit" and key in by_id:
                    by_id[key].text = entry["text"]
                    by_id[key].edits += 1
                elif entry["event"] == "delete" and key in by_id:
                    self.messages.remove(by_id.pop(key))

    def visible(self, platform: str | None = None, chat: str | None = None) -> list[VisibleMessage]:
        return [
            m
            for m in self.messages
            if (platform is None or m.platform == platform) and (chat is None or m.chat == chat)
        ]

    def copies(
        self,
        platform: str,
        chat: str,
        header: str,
        footer: str,
        profile: PlatformProfile,
    ) -> tuple[list[Copy], list[VisibleMessage]]:
        """(copies of the reply between ``header`` and ``footer``, messages outside any copy)."""
        copies: list[Copy] = []
        others: list[VisibleMessage] = []
        current: Copy | None = None
        for message in self.visible(platform, chat):
            body, marked = profile.strip_marker(message.text)
            if body.startswith(header):
                current = Copy(marked=marked)
                copies.append(current)
            elif current is None or current.complete:
                others.append(message)
                continue
            current.texts.append(body)
            current.piece_marks.append(marked)
            current.message_ids.append(message.message_id)
            if footer in body:
                current.complete = True
        return copies, others
