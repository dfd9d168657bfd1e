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
    ConfigurationError,
    EffectNotFound,
    InvalidPayload,
    InvalidState,
    OncewireError,
    PayloadConflict,
    ReceiptNotFound,
    SchemaError,
    StaleFence,
    StorageError,
    StoreBusy,
    UnknownSink,
)
from oncewire.dispatch import Dispatcher, DispatchStats, RetryPolicy
from oncewire.effects import (
    Attempt,
    Done,
    Effect,
    EffectState,
    Ledger,
    LedgerTransaction,
    MaybeSent,
    NotSent,
    Outcome,
    Rejected,
)
from oncewire.receipts import Receipt, ReceiptResult, Receipts

__version__ = "0.1.0"

__all__ = [
    "Attempt",
    "Clock",
    "ConfigurationError",
    "DispatchStats",
    "Dispatcher",
    "Done",
    "Effect",
    "EffectNotFound",
    "EffectState",
    "InvalidPayload",
    "InvalidState",
    "Ledger",
    "LedgerTransaction",
    "ManualClock",
    "MaybeSent",
    "NotSent",
    "OncewireError",
    "Outcome",
    "PayloadConflict",
    "Receipt",
    "ReceiptNotFound",
    "ReceiptResult",
    "Receipts",
    "Rejected",
    "RetryPolicy",
    "SchemaError",
    "StaleFence",
    "StorageError",
    "StoreBusy",
    "SystemClock",
    "UnknownSink",
    "__version__",
    "canonical_json",
    "digest",
]
