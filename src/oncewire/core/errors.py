"""The error tree: one root, typed subclasses, stable codes.

Every error oncewire raises on purpose is an :class:`OncewireError`. ``code`` is stable across
releases and is what scripts and the CLI match on; the message is for people. A subclass's
docstring is its default message.
"""

from __future__ import annotations

from typing import Any, ClassVar

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


class OncewireError(Exception):
    """An oncewire operation failed."""

    code: ClassVar[str] = "oncewire_error"

    def __init__(self, message: str | None = None, **fields: Any) -> None:
        self.fields = fields
        super().__init__(message or (self.__doc__ or self.code).strip().splitlines()[0])

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": str(self), **self.fields}


class InvalidPayload(OncewireError, ValueError):
    """The payload is not canonical JSON (malformed, NaN/Infinity, or not serialisable)."""

    code = "invalid_payload"


class PayloadConflict(OncewireError):
    """This key is already bound to a different payload; nothing was changed."""

    code = "payload_conflict"

    def __init__(self, key: str, stored_digest: str, offered_digest: str) -> None:
        super().__init__(
            f"key {key!r} is bound to payload {stored_digest[:12]}…, "
            f"not {offered_digest[:12]}…; nothing was changed",
            key=key,
            stored_digest=stored_digest,
            offered_digest=offered_digest,
        )
        self.key = key
        self.stored_digest = stored_digest
        self.offered_digest = offered_digest


class KindConflict(PayloadConflict):
    """This key is already bound to another kind of effect; nothing was changed."""

    code = "kind_conflict"

    def __init__(
        self,
        key: str,
        stored_kind: str,
        offered_kind: str,
        stored_digest: str,
        offered_digest: str,
    ) -> None:
        OncewireError.__init__(
            self,
            f"key {key!r} is bound to kind {stored_kind!r}, not {offered_kind!r}; "
            "nothing was changed",
            key=key,
            stored_kind=stored_kind,
            offered_kind=offered_kind,
            stored_digest=stored_digest,
            offered_digest=offered_digest,
        )
        self.key = key
        self.stored_kind = stored_kind
        self.offered_kind = offered_kind
        self.stored_digest = stored_digest
        self.offered_digest = offered_digest


class _NotFound(OncewireError, KeyError):
    """Nothing has this key or id (the base of every ``...NotFound``; never raised itself)."""

    code = "not_found"

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class EffectNotFound(_NotFound):
    """No effect has this key."""

    code = "effect_not_found"


class ReceiptNotFound(_NotFound):
    """No receipt has this key."""

    code = "receipt_not_found"


class InvalidState(OncewireError):
    """The record is not in a state that allows this operation."""

    code = "invalid_state"


class StaleFence(OncewireError):
    """The lease this write relied on has been superseded; the write was refused."""

    code = "stale_fence"


class StorageError(OncewireError):
    """The store failed."""

    code = "storage_error"
    # Whether trying again later may succeed (an outage, a lock, a dropped connection). A
    # dispatcher rides out a transient error and stops on a permanent one.
    transient: ClassVar[bool] = True


class StoreBusy(StorageError):
    """The store stayed locked by another writer past the busy timeout."""

    code = "store_busy"


class SchemaError(StorageError):
    """The store's schema is missing, foreign, or newer than this version of oncewire."""

    code = "schema_error"
    transient = False


class StoreUnreachable(StorageError):
    """The database connection failed or was lost (refused, terminated, timed out)."""

    code = "store_unreachable"


class StoreFull(StorageError):
    """The store's disk is full (or its size limit reached): the write was not stored."""

    code = "store_full"
    # Transient: once space is freed (or the limit raised) the same write succeeds, and a
    # dispatcher waits for that rather than exit.


class StoreUnusable(StorageError):
    """The store cannot be used as it is: read-only, not a database, corrupt, or no access."""

    code = "store_unusable"
    transient = False


class StatementError(StorageError):
    """The database refused a statement (placeholders, syntax, a constraint): not an outage."""

    code = "statement_error"
    transient = False


class ConfigurationError(OncewireError, ValueError):
    """An option or argument is invalid."""

    code = "configuration_error"


class WrongType(ConfigurationError, TypeError):
    """An argument is not of the type the call takes."""

    code = "wrong_type"


class CrashPointUnknown(ConfigurationError):
    """A crash point was armed that no code registers."""

    code = "crash_point_unknown"


class MissingExtra(ConfigurationError, ImportError):
    """This needs an optional extra of oncewire that is not installed."""

    code = "missing_extra"

    def __init__(
        self, feature: str = "", extra: str = "", missing: tuple[str, ...] | list[str] = ()
    ) -> None:
        # Also an ImportError: a caller that guards an optional import catches this one too.
        message = None
        if feature and extra:
            message = f"{feature} needs the '{extra}' extra: pip install 'oncewire[{extra}]'"
            if missing:
                message += f" ({', '.join(missing)} not installed)"
        super().__init__(message, feature=feature, extra=extra, missing=list(missing))
        self.feature = feature
        self.extra = extra
        self.missing = list(missing)


class InboundNotFound(_NotFound):
    """No inbound message has this id."""

    code = "inbound_not_found"


class ReplyNotFound(_NotFound):
    """No reply record matches."""

    code = "reply_not_found"


class ReplyConflict(OncewireError):
    """This inbound message already has a committed reply with different text; nothing changed."""

    code = "reply_conflict"


# -- runs ---------------------------------------------------------------------------------------


class RunError(OncewireError):
    """A run ledger operation was refused."""

    code = "run_error"


class RunNotFound(RunError, _NotFound):
    """No run, checkpoint, branch or delivery has this id."""

    code = "run_not_found"


class RunConflict(RunError):
    """This idempotency key is already bound to a different request; nothing was written."""

    code = "run_conflict"


class TransitionRefused(RunError):
    """The run's state or a guard does not allow this command; nothing was written."""

    code = "transition_refused"


class BranchBusy(TransitionRefused):
    """Another run is still active on this branch; nothing was written."""

    code = "branch_busy"


class HistoryHidden(TransitionRefused):
    """The run's history was reverted away or the run was abandoned: it authorises nothing."""

    code = "history_hidden"


class RevertBarrierHeld(TransitionRefused):
    """A revert holds this scope and requires recovery: no new runs or actions are admitted."""

    code = "revert_barrier_held"


class HistoryTampered(RunError):
    """The run's history failed verification: it authorises nothing and is kept as evidence."""

    code = "history_tampered"


# -- LangGraph checkpoints ----------------------------------------------------------------------


class CheckpointError(OncewireError):
    """A LangGraph checkpoint operation was refused."""

    code = "checkpoint_error"


class CheckpointTampered(CheckpointError):
    """The thread's checkpoint history failed verification: nothing of it was returned."""

    code = "checkpoint_tampered"


class CheckpointUnreadable(CheckpointTampered):
    """A stored checkpoint or write does not deserialise: nothing of it was returned."""

    code = "checkpoint_unreadable"


class CheckpointOrderRefused(CheckpointError):
    """A checkpoint's parent writes did not all commit in time: the checkpoint was not stored."""

    code = "checkpoint_order_refused"


class ThreadBusy(CheckpointError):
    """Another live process owns this thread's lease; nothing was written."""

    code = "thread_busy"


class ThreadLeaseLost(StaleFence):
    """Another process took this thread over (its fence moved): the write was refused before
    anything was written."""

    code = "thread_lease_lost"
