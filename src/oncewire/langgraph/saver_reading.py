"""What OncewireSaver reads back: a thread's chain verified, its rows made checkpoint tuples.

Nothing is returned of a thread whose chain does not verify or whose blobs do not deserialise:
:func:`verify` checks the chain up to its recorded head (incrementally after what the saver
verified or wrote before, :mod:`oncewire.langgraph.saver_cache`), :func:`checkpoint_tuple`
checks a checkpoint and its writes against it and only then decodes them (:func:`loads`),
raising :class:`CheckpointTampered` or :class:`CheckpointUnreadable`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oncewire.core.extras import refusal

try:
    from langgraph.checkpoint.base import CheckpointTuple
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("langgraph", "oncewire.langgraph.OncewireSaver", exc) from exc

from oncewire.core.errors import CheckpointTampered, CheckpointUnreadable
from oncewire.langgraph import chain
from oncewire.langgraph.saver_cache import ChainCache
from oncewire.storage import LangGraphStore
from oncewire.storage.langgraph import CheckpointRow, ThreadHead, WriteRow

__all__ = ["checkpoint_tuple", "loads", "verify"]


def loads(serde: SerializerProtocol, thread_id: str, what: str, type_: str, blob: bytes) -> Any:
    """``blob`` deserialised, or :class:`CheckpointUnreadable` naming ``what`` it was."""
    try:
        return serde.loads_typed((type_, blob))
    except Exception as exc:
        raise CheckpointUnreadable(
            f"thread {thread_id!r}: {what} does not deserialise ({type(exc).__name__}); "
            "nothing of it was returned",
            thread_id=thread_id,
            reason=f"{what} does not deserialise",
        ) from exc


def verify(
    store: LangGraphStore,
    chains: ChainCache,
    runs_key: bytes | None,
    thread_id: str,
    head: ThreadHead | None,
) -> bytes | None:
    """Check the thread's chain up to ``head`` (incrementally after what this saver
    verified or wrote before); the key its rows are checked with."""
    if head is None:
        raise CheckpointTampered(
            f"thread {thread_id!r}: checkpoint rows without a chain head; nothing of it was "
            "returned",
            thread_id=thread_id,
            reason="checkpoint rows without a chain head",
        )
    key = chain.chain_key(head, runs_key)
    done = chains.head(thread_id)
    if done == (head.head_seq, head.head_hash):
        return key
    after_seq, after_hash = done if done and 0 < done[0] < head.head_seq else (0, None)
    entries = [e for e in store.lg_chain_after(thread_id, after_seq) if e.seq <= head.head_seq]
    seq, last = chain.verify_entries(
        thread_id, entries, key, after_seq=after_seq, after_hash=after_hash
    )
    if (seq, last) != (head.head_seq, head.head_hash):
        raise CheckpointTampered(
            f"thread {thread_id!r}: the chain does not end at its recorded head; nothing of "
            "it was returned",
            thread_id=thread_id,
            reason="the chain does not end at its recorded head",
        )
    chains.verified(thread_id, (seq, last), entries)
    return key


def checkpoint_tuple(
    serde: SerializerProtocol,
    chains: ChainCache,
    row: CheckpointRow,
    writes: Sequence[WriteRow],
    key: bytes | None,
) -> CheckpointTuple:
    """The checkpoint ``row`` and its pending ``writes``, checked against the thread's
    verified chain (``key``: what :func:`verify` returned), then decoded."""
    thread_id = row.thread_id
    known = chains.entries(thread_id)
    chain.check_checkpoint(row, key, known)
    for write in writes:
        chain.check_write(thread_id, write, key, known)
    checked = [e for e in (row.entry, *(w.entry for w in writes)) if e and e.seq not in known]
    if checked:  # hashed from scratch just now: compared, not hashed, from now on
        chains.remember(thread_id, checked)
    checkpoint = loads(
        serde, thread_id, f"checkpoint {row.checkpoint_id}", row.type, row.checkpoint
    )
    metadata = loads(
        serde,
        thread_id,
        f"checkpoint {row.checkpoint_id}'s metadata",
        row.metadata_type,
        row.metadata,
    )
    ordered = sorted(writes, key=lambda w: (w.task_path, w.task_id, w.idx))
    pending = [
        (
            w.task_id,
            w.channel,
            loads(serde, thread_id, f"a write of checkpoint {row.checkpoint_id}", w.type, w.value),
        )
        for w in ordered
    ]
    return CheckpointTuple(
        config={
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": row.checkpoint_ns,
                "checkpoint_id": row.checkpoint_id,
            }
        },
        checkpoint=checkpoint,
        metadata=metadata,
        parent_config=(
            {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": row.checkpoint_ns,
                    "checkpoint_id": row.parent_checkpoint_id,
                }
            }
            if row.parent_checkpoint_id
            else None
        ),
        pending_writes=pending,
    )
