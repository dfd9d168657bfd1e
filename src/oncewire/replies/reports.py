"""What the reply engine's calls answer: a delivery pass, a preview pass, a recovery report.

Plain records, apart from the engine that makes them, so that a caller (and any other engine
driving the same plan) can name them without the engine's I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from oncewire.storage.replies import Reply

__all__ = ["DeliveryPass", "PreviewPass", "RecoveryReport"]


@dataclass(frozen=True, slots=True)
class DeliveryPass:
    """What one delivery pass did: ``delivered``, ``withdrawn``, ``scheduled``, ``dead`` or
    ``busy``."""

    reply: Reply
    status: str


@dataclass(frozen=True, slots=True)
class PreviewPass:
    """What one :meth:`ReplyEngine.preview` did.

    ``previewing`` turns False once previews of this reply should stop: its answer is
    committed, another engine holds it, or an outcome is uncertain (the final delivery repairs
    and marks what is unknown). ``wait_seconds`` is how long the platform asked to be left
    alone (a rate limit) before the next preview.
    """

    previewing: bool
    wait_seconds: float = 0.0


@dataclass
class RecoveryReport:
    """What ``ReplyEngine.recover`` did, by reply id (and the inbound ids left to answer)."""

    released: list[int] = field(default_factory=list)  # replies taken over from dead owners
    delivered: list[int] = field(default_factory=list)
    scheduled: list[int] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    busy: list[int] = field(default_factory=list)
    withdrawn: list[int] = field(default_factory=list)  # withdrawals whose previews are gone
    unanswered: list[int] = field(default_factory=list)  # inbound ids the application must answer

    def as_dict(self) -> dict[str, list[int]]:
        return dict(self.__dict__)
