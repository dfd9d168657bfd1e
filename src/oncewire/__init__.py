"""oncewire: the durability layer between an AI agent and the world.

Accept an intent in your own transaction, dispatch it with leases and fences, and let the
receiver turn redeliveries into one effect::

    ledger = oncewire.Ledger("app.db")
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO orders (id) VALUES (:id)", {"id": 42})
        tx.accept("order-42/charge", "charge", {"order": 42, "cents": 1999})
    oncewire.Dispatcher(ledger, sinks={"charge": charge_card}).run()

The top level holds what a first program needs: the ledger, the outbox and its dispatcher, the
receiver, the reply engine, runs, and the errors a caller usually catches. The rest lives in its
subpackage: ``oncewire.effects``, ``oncewire.receipts``, ``oncewire.inbound``,
``oncewire.replies``, ``oncewire.runs``, ``oncewire.dispatch``, ``oncewire.sinks``; every
exception in ``oncewire.errors``; test helpers (a manual clock, a fake chat platform) in
``oncewire.testing``. A name that left the top level says where it lives now when it is asked
for (``oncewire.StoreBusy`` raises an ``AttributeError`` naming ``oncewire.errors.StoreBusy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from oncewire import errors as errors
from oncewire.core import lazy as _lazy

if TYPE_CHECKING:  # what a type checker and an editor see; at run time see _HOME below
    from oncewire.core.errors import (
        ConfigurationError,
        InvalidState,
        OncewireError,
        PayloadConflict,
        StaleFence,
        StorageError,
    )
    from oncewire.dispatch import Dispatcher, DispatchStats, RetryPolicy
    from oncewire.effects import (
        Attempt,
        Done,
        Effect,
        EffectOutcome,
        EffectState,
        MaybeSent,
        NotSent,
        Rejected,
    )
    from oncewire.inbound import Inbound
    from oncewire.ledger import Ledger, LedgerTransaction
    from oncewire.receipts import ReceiptResult, Receipts
    from oncewire.replies import Platform, PlatformProfile, Reply, ReplyEngine, SendRequest
    from oncewire.runs import Run, RunEvent
    from oncewire.sinks import ReceiptsSink, SubprocessSink

__version__ = "0.1.0"

__all__ = [
    "Attempt",
    "ConfigurationError",
    "DispatchStats",
    "Dispatcher",
    "Done",
    "Effect",
    "EffectOutcome",
    "EffectState",
    "Inbound",
    "InvalidState",
    "Ledger",
    "LedgerTransaction",
    "MaybeSent",
    "NotSent",
    "OncewireError",
    "PayloadConflict",
    "Platform",
    "PlatformProfile",
    "ReceiptResult",
    "Receipts",
    "ReceiptsSink",
    "Rejected",
    "Reply",
    "ReplyEngine",
    "RetryPolicy",
    "Run",
    "RunEvent",
    "SendRequest",
    "StaleFence",
    "StorageError",
    "SubprocessSink",
    "__version__",
]

# Where each top-level name is defined. ``import oncewire`` loads none of them: a name is
# imported on first use (PEP 562), so a process that needs the outbox does not pay for the run
# ledger, the reply engine and the rest. ``from oncewire import Ledger`` works as before.
_HOME: dict[str, str] = {
    **dict.fromkeys(
        (
            "ConfigurationError",
            "InvalidState",
            "OncewireError",
            "PayloadConflict",
            "StaleFence",
            "StorageError",
        ),
        "oncewire.core.errors",
    ),
    **dict.fromkeys(("Dispatcher", "DispatchStats", "RetryPolicy"), "oncewire.dispatch"),
    **dict.fromkeys(
        (
            "Attempt",
            "Done",
            "Effect",
            "EffectOutcome",
            "EffectState",
            "MaybeSent",
            "NotSent",
            "Rejected",
        ),
        "oncewire.effects",
    ),
    "Inbound": "oncewire.inbound",
    "Ledger": "oncewire.ledger",
    "LedgerTransaction": "oncewire.ledger",
    "ReceiptResult": "oncewire.receipts",
    "Receipts": "oncewire.receipts",
    **dict.fromkeys(
        ("Platform", "PlatformProfile", "Reply", "ReplyEngine", "SendRequest"), "oncewire.replies"
    ),
    "Run": "oncewire.runs",
    "RunEvent": "oncewire.runs",
    "ReceiptsSink": "oncewire.sinks",
    "SubprocessSink": "oncewire.sinks",
}

# Names 0.1.0 took off the top level, and where each lives now.
_MOVED: dict[str, str] = {
    "DISCORD_LIKE": "oncewire.replies.DISCORD_LIKE",
    "NON_EDITABLE": "oncewire.replies.NON_EDITABLE",
    "TELEGRAM_LIKE": "oncewire.replies.TELEGRAM_LIKE",
    "Admission": "oncewire.inbound.Admission",
    "Clock": "oncewire.core.clock.Clock",
    "Effects": "oncewire.effects.Effects",
    "Inbox": "oncewire.inbound.Inbox",
    "ManualClock": "oncewire.testing.ManualClock",
    "Receipt": "oncewire.receipts.Receipt",
    "ReconcileReport": "oncewire.runs.ReconcileReport",
    "Replies": "oncewire.replies.Replies",
    "ReplyState": "oncewire.replies.ReplyState",
    "Runs": "oncewire.runs.Runs",
    "SideEffectClass": "oncewire.runs.SideEffectClass",
    "SystemClock": "oncewire.core.clock.SystemClock",
    "Verdict": "oncewire.runs.Verdict",
    "Verification": "oncewire.runs.Verification",
    "canonical_json": "oncewire.core.canonical.canonical_json",
    "digest": "oncewire.core.canonical.digest",
    "this_process_owner": "oncewire.core.ids.this_process_owner",
    **{name: f"oncewire.errors.{name}" for name in errors.__all__ if name not in __all__},
}

# Names 0.1.0 renamed (no alias is kept), and the new name of each.
_RENAMED: dict[str, str] = {
    "Acked": "oncewire.replies.Delivered",
    "Refused": "oncewire.replies.NotDelivered",
    "Ambiguous": "oncewire.replies.MaybeDelivered",
    "RejectedPermanently": "oncewire.replies.RejectedForGood",
    "Outcome": "oncewire.EffectOutcome (a run command's result is oncewire.runs.CommandResult)",
    "Delivery": "oncewire.replies.DeliveryPass (a run's is oncewire.runs.CompletionDelivery)",
    "InboundStatus": "oncewire.inbound.InboundState",
    "RunStatus": "oncewire.runs.RunState",
    "ActionStatus": "oncewire.runs.ActionState",
    "RunsView": "oncewire.runs.Runs",
    "EffectsView": "oncewire.effects.Effects",
    "InboundView": "oncewire.inbound.Inbox",
    "RepliesView": "oncewire.replies.Replies",
}


def _gone(name: str) -> NoReturn:
    """For a name that left the top level: where it lives now, or what it is called now."""
    if name in _RENAMED:
        raise AttributeError(f"oncewire.{name} was renamed: use {_RENAMED[name]}", name=name)
    if name in _MOVED:
        raise AttributeError(
            f"oncewire.{name} is not at the top level: use {_MOVED[name]}", name=name
        )
    raise AttributeError(f"module 'oncewire' has no attribute {name!r}", name=name)


if not TYPE_CHECKING:  # a type checker keeps reporting unknown names as errors
    __getattr__, __dir__ = _lazy.names(globals(), _HOME, _gone)
