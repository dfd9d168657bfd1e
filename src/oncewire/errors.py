"""Every exception the core of oncewire raises, in one place: catch ``oncewire.errors.X``.

The gateway extra (``oncewire[gateway]``) keeps its own subclasses of ``OncewireError`` beside
its code (``oncewire.gateway.model.ModelFailure``,
``oncewire.gateway.platforms.telegram.TelegramError``).

The five a caller usually catches are also at the top level (``oncewire.PayloadConflict``,
``oncewire.StaleFence``, ``oncewire.StorageError``, ``oncewire.ConfigurationError``,
``oncewire.InvalidState``), with their root ``oncewire.OncewireError``. Each class's docstring
is its default message; each carries a stable ``code`` and ``as_dict()``. The tree::

    OncewireError
    ├── InvalidPayload (a ValueError)      the payload is not canonical JSON
    ├── PayloadConflict                    the key is bound to a different payload
    │   └── KindConflict                   the key is bound to another kind of effect
    ├── EffectNotFound (a KeyError)        no effect has this key
    ├── ReceiptNotFound (a KeyError)       no receipt has this key
    ├── InboundNotFound (a KeyError)       no inbound message has this id
    ├── ReplyNotFound (a KeyError)         no reply record matches
    ├── InvalidState                       the record's state does not allow the operation
    ├── StaleFence                         the lease the write relied on was superseded
    │   └── ThreadLeaseLost                another process took the LangGraph thread over
    ├── StorageError                       the store failed (``transient``: may a retry help?)
    │   ├── StoreBusy                      locked by another writer past the busy timeout
    │   ├── StoreFull                      the disk is full: the write was not stored
    │   ├── SchemaError                    the schema is missing, foreign or newer
    │   ├── StoreUnreachable               the connection failed or was lost
    │   ├── StoreUnusable                  read-only, not a database, corrupt, or no access
    │   └── StatementError                 the database refused a statement
    ├── ConfigurationError (a ValueError)  an option or argument is invalid
    │   ├── WrongType (a TypeError too)    an argument is not of the type the call takes
    │   ├── CrashPointUnknown              an armed crash point that no code registers
    │   └── MissingExtra (an ImportError)  needs an extra that is not installed (``extra``)
    ├── ReplyConflict                      the message already has a reply with other text
    ├── RunError                           a run ledger operation was refused
    │   ├── RunNotFound (a KeyError)       no run, checkpoint, branch or delivery has this id
    │   ├── RunConflict                    the command key is bound to a different request
    │   ├── TransitionRefused              the run's state or a guard refuses the command
    │   │   ├── BranchBusy                 another run is active on the branch
    │   │   ├── HistoryHidden              the history was reverted away, or the run abandoned
    │   │   └── RevertBarrierHeld          a revert holds the scope until recovery
    │   └── HistoryTampered                the history failed verification
    └── CheckpointError                    a LangGraph checkpoint operation was refused
        ├── CheckpointTampered             a thread's checkpoint history failed verification
        │   └── CheckpointUnreadable       a stored checkpoint or write does not deserialise
        ├── CheckpointOrderRefused         a checkpoint's parent writes did not commit in time
        └── ThreadBusy                     another live process owns the thread's lease
"""

from __future__ import annotations

from oncewire.core.errors import (
    BranchBusy,
    CheckpointError,
    CheckpointOrderRefused,
    CheckpointTampered,
    CheckpointUnreadable,
    ConfigurationError,
    CrashPointUnknown,
    EffectNotFound,
    HistoryHidden,
    HistoryTampered,
    InboundNotFound,
    InvalidPayload,
    InvalidState,
    KindConflict,
    MissingExtra,
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
    StoreFull,
    StoreUnreachable,
    StoreUnusable,
    ThreadBusy,
    ThreadLeaseLost,
    TransitionRefused,
    WrongType,
)

__all__ = [
    "BranchBusy",
    "CheckpointError",
    "CheckpointOrderRefused",
    "CheckpointTampered",
    "CheckpointUnreadable",
    "ConfigurationError",
    "CrashPointUnknown",
    "EffectNotFound",
    "HistoryHidden",
    "HistoryTampered",
    "InboundNotFound",
    "InvalidPayload",
    "InvalidState",
    "KindConflict",
    "MissingExtra",
    "OncewireError",
    "PayloadConflict",
    "ReceiptNotFound",
    "ReplyConflict",
    "ReplyNotFound",
    "RevertBarrierHeld",
    "RunConflict",
    "RunError",
    "RunNotFound",
    "SchemaError",
    "StaleFence",
    "StatementError",
    "StorageError",
    "StoreBusy",
    "StoreFull",
    "StoreUnreachable",
    "StoreUnusable",
    "ThreadBusy",
    "ThreadLeaseLost",
    "TransitionRefused",
    "WrongType",
]
