"""Test helpers: a clock that moves only when told to, and a fake chat platform.

Nothing here is needed in production. ``ManualClock`` makes leases, backoff, deadlines and
retention testable without sleeping: pass it as ``Ledger(..., clock=ManualClock())`` and move
time with ``clock.advance(seconds)``.

``FakePlatform`` is a chat platform adapter that keeps what each chat shows in a journal file
(fsynced before it answers, so it survives a SIGKILL of the process that used it), and fails on
command with scripted faults (``Fault``, one of ``FAULT_KINDS``: a timeout, a lost
acknowledgement, a 429, a refused connection, a permanent rejection, a parked request).
``ChatView`` reads the journals back, from any process, as the messages a person would see
(``VisibleMessage``) and the renditions of one reply (``Copy``). ``FakePlatformClient`` talks
to a fake run as a process of its own (``python -m oncewire.platforms.fake serve``)::

    import oncewire
    from oncewire.replies import TELEGRAM_LIKE
    from oncewire.testing import ChatView, FakePlatform, Fault, ManualClock

    ledger = oncewire.Ledger("chat.db", clock=ManualClock())
    fake = FakePlatform("chat.jsonl", TELEGRAM_LIKE, faults=[Fault("ack_lost", op="send")])
    engine = oncewire.ReplyEngine(ledger, {"telegram": fake})
    ...
    assert [m.text for m in ChatView(["chat.jsonl"]).visible(chat="c1")] == [...]
"""

from __future__ import annotations

from oncewire.core.clock import ManualClock
from oncewire.platforms.fake import (
    FAULT_KINDS,
    ChatView,
    Copy,
    FakePlatform,
    Fault,
    VisibleMessage,
)
from oncewire.platforms.fake_process import FakePlatformClient

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
