"""replies: one record per inbound message owning every wire operation, and the reply engine."""

from oncewire.replies.engine import (
    DEFAULT_NOTICE,
    DEFAULT_STOPPED_NOTE,
    DeliveryPass,
    PreviewPass,
    RecoveryReport,
    ReplyEngine,
)
from oncewire.replies.service import Replies, plan_chunks
from oncewire.replies.splitting import Chunk, measure, rejoin, split_text
from oncewire.replies.wire import (
    DISCORD_LIKE,
    NON_EDITABLE,
    TELEGRAM_LIKE,
    Delivered,
    Gone,
    MaybeDelivered,
    NotDelivered,
    Platform,
    PlatformProfile,
    RejectedForGood,
    WireOutcome,
    idempotency_key,
)
from oncewire.storage.replies import (
    Exchange,
    OpKind,
    OpState,
    Reply,
    ReplyOp,
    ReplyState,
    SendRequest,
)

__all__ = [
    "DEFAULT_NOTICE",
    "DEFAULT_STOPPED_NOTE",
    "DISCORD_LIKE",
    "NON_EDITABLE",
    "TELEGRAM_LIKE",
    "Chunk",
    "Delivered",
    "DeliveryPass",
    "Exchange",
    "Gone",
    "MaybeDelivered",
    "NotDelivered",
    "OpKind",
    "OpState",
    "Platform",
    "PlatformProfile",
    "PreviewPass",
    "RecoveryReport",
    "RejectedForGood",
    "Replies",
    "Reply",
    "ReplyEngine",
    "ReplyOp",
    "ReplyState",
    "SendRequest",
    "WireOutcome",
    "idempotency_key",
    "measure",
    "plan_chunks",
    "rejoin",
    "split_text",
]
