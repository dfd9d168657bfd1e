"""oncewire: the durability layer between an AI agent and the world.

Accept an intent in your own transaction, dispatch it with leases and fences, and let the
receiver turn redeliveries into one effect::

    ledger = oncewire.Ledger("app.db")
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO orders (id) VALUES (?)", (42,))
        tx.accept("order-42/charge", "charge", {"order": 42, "cents": 1999})
    oncewire.Dispatcher(ledger, sinks={"charge": charge_card}).run()
"""

from __future__ import annotations

from oncewire.core.canonical import canonical_json, digest
from oncewire.core.clock import Clock, ManualClock, SystemClock
from oncewire.core.errors import (
    BranchBusy,
    ConfigurationError,
    EffectNotFound,
    HistoryHidden,
    HistoryTampered,
    InboundNotFound,
    InvalidPayload,
    InvalidState,
    KindConflict,
    OncewireError,
    PayloadConflict,
    ReceiptNotFound,
    ReplyConflict,
    ReplyNotFound,
    RevertBarrierHeld,
    RunConflict,
    RunError,
    RunNotFound,
    SchemaError,
    StaleFence,
    StatementError,
    StorageError,
    StoreBusy,
    StoreUnreachable,
    StoreUnusable,
    TransitionRefused,
)
from oncewire.core.ids import this_process_owner
from oncewire.dispatch import Dispatcher, DispatchStats, RetryPolicy
from oncewire.effects import (
    Attempt,
    Done,
    Effect,
    EffectOutcome,
    Effects,
    EffectState,
    MaybeSent,
    NotSent,
    Rejected,
)
from oncewire.inbound import Admission, Inbound, InboundState, Inbox
from oncewire.ledger import Ledger, LedgerTransaction
from oncewire.receipts import Receipt, ReceiptResult, Receipts
from oncewire.replies import (
    DISCORD_LIKE,
    NON_EDITABLE,
    TELEGRAM_LIKE,
    Delivered,
    DeliveryPass,
    MaybeDelivered,
    NotDelivered,
    Platform,
    PlatformProfile,
    RejectedForGood,
    Replies,
    Reply,
    ReplyEngine,
    ReplyState,
    SendRequest,
)
from oncewire.runs import (
    ReconcileReport,
    Run,
    RunEvent,
    Runs,
    RunState,
    RunsView,
    SideEffectClass,
    Verdict,
    Verification,
)
from oncewire.sinks import ReceiptsSink, SubprocessSink

__version__ = "0.1.0"

__all__ = [
    "DISCORD_LIKE",
    "NON_EDITABLE",
    "TELEGRAM_LIKE",
    "Admission",
    "Attempt",
    "BranchBusy",
    "Clock",
    "ConfigurationError",
    "Delivered",
    "DeliveryPass",
    "DispatchStats",
    "Dispatcher",
    "Done",
    "Effect",
    "EffectNotFound",
    "EffectOutcome",
    "EffectState",
    "Effects",
    "HistoryHidden",
    "HistoryTampered",
    "Inbound",
    "InboundNotFound",
    "InboundState",
    "Inbox",
    "InvalidPayload",
    "InvalidState",
    "KindConflict",
    "Ledger",
    "LedgerTransaction",
    "ManualClock",
    "MaybeDelivered",
    "MaybeSent",
    "NotDelivered",
    "NotSent",
    "OncewireError",
    "PayloadConflict",
    "Platform",
    "PlatformProfile",
    "Receipt",
    "ReceiptNotFound",
    "ReceiptResult",
    "Receipts",
    "ReceiptsSink",
    "ReconcileReport",
    "Rejected",
    "RejectedForGood",
    "Replies",
    "Reply",
    "ReplyConflict",
    "ReplyEngine",
    "ReplyNotFound",
    "ReplyState",
    "RetryPolicy",
    "RevertBarrierHeld",
    "Run",
    "RunConflict",
    "RunError",
    "RunEvent",
    "RunNotFound",
    "RunState",
    "Runs",
    "RunsView",
    "SchemaError",
    "SendRequest",
    "SideEffectClass",
    "StaleFence",
    "StatementError",
    "StorageError",
    "StoreBusy",
    "StoreUnreachable",
    "StoreUnusable",
    "SubprocessSink",
    "SystemClock",
    "TransitionRefused",
    "Verdict",
    "Verification",
    "__version__",
    "canonical_json",
    "digest",
    "this_process_owner",
]
