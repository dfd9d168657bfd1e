"""replies: one record per inbound message owning every wire operation, and the reply engine."""

from oncewire.replies.engine import DEFAULT_NOTICE, Delivery, RecoveryReport, ReplyEngine
from oncewire.replies.service import Replies, RepliesView, plan_chunks
from oncewire.replies.splitting import Chunk, measure, rejoin, split_text
from oncewire.replies.wire import (
    DISCORD_LIKE,
    NON_EDITABLE,
    TELEGRAM_LIKE,
    Acked,
    Ambiguous,
    Platform,
    PlatformProfile,
    Refused,
    RejectedPermanently,
    WireOutcome,
)
from oncewire.storage.replies import (
    OpKind,
    OpState,
    Reply,
    ReplyOp,
    ReplyState,
    SendRequest,
)

__all__ = [
    "DEFAULT_NOTICE",
    "DISCORD_LIKE",
    "NON_EDITABLE",
    "TELEGRAM_LIKE",
    "Acked",
    "Ambiguous",
    "Chunk",
    "Delivery",
    "OpKind",
    "OpState",
    "Platform",
    "PlatformProfile",
    "RecoveryReport",
    "Refused",
    "RejectedPermanently",
    "Replies",
    "RepliesView",
    "Reply",
    "ReplyEngine",
    "ReplyOp",
    "ReplyState",
    "SendRequest",
    "WireOutcome",
    "measure",
    "plan_chunks",
    "rejoin",
    "split_text",
]
