"""Test helpers: a clock that moves only when told to, a fake chat platform, and fakes of the
services the gateway talks to.

Nothing here is needed in production; the crash lab and ``oncewire gateway demo`` run these
fakes, and users' tests import them. ``ManualClock`` makes leases, backoff, deadlines and
retention testable without sleeping: pass it as ``Ledger(..., clock=ManualClock())`` and move
time with ``clock.advance(seconds)``.

``FakePlatform`` is a chat platform adapter that keeps what each chat shows in a journal file
(fsynced before it answers, so it survives a SIGKILL of the process that used it), and fails on
command with scripted faults (``Fault``, one of ``FAULT_KINDS``: a timeout, a lost
acknowledgement, a 429, a refused connection, a permanent rejection, a parked request).
``ChatView`` reads the journals back, from any process, as the messages a person would see
(``VisibleMessage``) and the renditions of one reply (``Copy``). ``FakePlatformClient`` talks
to a fake run as a process of its own (``python -m oncewire.testing serve``;
``python -m oncewire.testing view JOURNAL...`` prints what each chat shows)::

    import oncewire
    from oncewire.replies import TELEGRAM_LIKE
    from oncewire.testing import ChatView, FakePlatform, Fault, ManualClock

    ledger = oncewire.Ledger("chat.db", clock=ManualClock())
    fake = FakePlatform("chat.jsonl", TELEGRAM_LIKE, faults=[Fault("ack_lost", op="send")])
    engine = oncewire.ReplyEngine(ledger, {"telegram": fake})
    ...
    assert [m.text for m in ChatView(["chat.jsonl"]).visible(chat="c1")] == [...]

The wire fakes speak real protocols on loopback, each run as its own process printing
``ready port=N``: the Telegram Bot API (``python -m oncewire.testing.telegram_api``), the
generic webhook platform (``python -m oncewire.testing.webhook_platform``) and an
OpenAI-compatible model (``python -m oncewire.testing.openai_api``). They journal every request
(with fsync) before answering, and fail on command (:mod:`oncewire.testing.control`).
"""

from __future__ import annotations

from oncewire.core.clock import ManualClock
from oncewire.testing.fake_platform import (
    FAULT_KINDS,
    ChatView,
    Copy,
    FakePlatform,
    Fault,
    VisibleMessage,
)
from oncewire.testing.fake_platform_process import FakePlatformClient

__all__ = [
    "FAULT_KINDS",
    "ChatView",
    "Copy",
    "FakePlatform",
    "FakePlatformClient",
    "Fault",
    "ManualClock",
    "VisibleMessage",
]
