"""Records of the LangGraph checkpointer's tables, and the material its hash chain covers.

A thread's chain (``oncewire_lg_chain``) has one entry per checkpoint put, per batch of writes
and per erasure. An entry's ``material`` is compact JSON that names what the entry wrote: the
checkpoint's ids and the sha256 of its serialised blob and metadata, or each write's slot and
the sha256 of its value, or the entries whose rows an erasure removed. The entry's hash covers
the material (and the previous hash), so a row whose bytes no longer match its entry's digest,
or an entry whose hash no longer matches its material, is a broken history. The hashing itself
(keyed or not) is the caller's: :mod:`oncewire.langgraph.chain`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ChainEntry",
    "CheckpointRow",
    "LangGraphRun",
    "NewCheckpoint",
    "NewWrite",
    "ThreadHead",
    "ThreadSummary",
    "WriteRow",
    "blob_digest",
    "checkpoint_material",
    "erase_material",
    "lease_name",
    "writes_material",
]

LEASE_PREFIX = "langgraph.thread:"


def lease_name(thread_id: str) -> str:
    """The named lease (``oncewire_leases``) a process holds to write to ``thread_id``."""
    return LEASE_PREFIX + thread_id


def blob_digest(type_: str, blob: bytes) -> str:
    """sha256 of a serialised value and its serde type (``type\\x1fbytes``)."""
    h = hashlib.sha256(type_.encode("utf-8", "surrogatepass"))
    h.update(b"\x1f")
    h.update(blob)
    return h.hexdigest()


def _material(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def checkpoint_material(row: NewCheckpoint) -> str:
    return _material(
        {
            "k": "checkpoint",
            "ns": row.checkpoint_ns,
            "id": row.checkpoint_id,
            "parent": row.parent_checkpoint_id,
            "blob": blob_digest(row.type, row.checkpoint),
            "meta": blob_digest(row.metadata_type, row.metadata),
        }
    )


def writes_material(
    checkpoint_ns: str, checkpoint_id: str, task_id: str, rows: Sequence[NewWrite]
) -> str:
    return _material(
        {
            "k": "writes",
            "ns": checkpoint_ns,
            "id": checkpoint_id,
            "task": task_id,
            "rows": [[w.idx, w.channel, w.task_path, blob_digest(w.type, w.value)] for w in rows],
        }
    )


def erase_material(seqs: Sequence[int], why: str) -> str:
    return _material({"k": "erase", "seqs": sorted(set(seqs)), "why": why})


def _bytes(value: Any) -> bytes:
    return bytes(value) if not isinstance(value, bytes) else value


@dataclass(frozen=True, slots=True)
class NewCheckpoint:
    """A checkpoint to store, serialised."""

    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    type: str
    checkpoint: bytes
    metadata_type: str
    metadata: bytes
    run_id: str | None


@dataclass(frozen=True, slots=True)
class NewWrite:
    """One pending write to store, serialised (``idx`` negative for LangGraph's special slots,
    which a newer write replaces)."""

    idx: int
    channel: str
    type: str
    value: bytes
    task_path: str


@dataclass(frozen=True, slots=True)
class ThreadHead:
    """A thread's chain head as stored."""

    thread_id: str
    chain: str
    key_id: str | None
    head_seq: int
    head_hash: str

    @classmethod
    def from_row(cls, thread_id: str, row: Sequence[Any]) -> ThreadHead:
        chain, key_id, seq, hash_ = row
        return cls(thread_id, str(chain), key_id, int(seq), str(hash_))


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    """A thread as a list shows it: its head, how many checkpoints it stores, its newest
    checkpoint and who holds its lease (``owner`` None: never held, or given back)."""

    head: ThreadHead
    updated_at: float
    checkpoints: int
    head_checkpoint: str | None
    owner: str | None
    fence: int | None
    lease_expires_at: float | None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ThreadSummary:
        updated_at, count, newest, owner, fence, expires = row[5:11]
        return cls(
            ThreadHead.from_row(str(row[0]), row[1:5]),
            float(updated_at),
            int(count),
            None if newest is None else str(newest),
            owner,
            None if fence is None else int(fence),
            None if expires is None else float(expires),
        )


@dataclass(frozen=True, slots=True)
class ChainEntry:
    """One entry of a thread's chain."""

    seq: int
    kind: str
    material: str
    prev_hash: str
    hash: str

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ChainEntry:
        seq, kind, material, prev_hash, hash_ = row
        return cls(int(seq), str(kind), str(material), str(prev_hash), str(hash_))


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """A stored checkpoint with the chain entry that wrote it (``entry`` None when that entry
    is missing: a broken history)."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    seq: int
    type: str
    checkpoint: bytes
    metadata_type: str
    metadata: bytes
    entry: ChainEntry | None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> CheckpointRow:
        (thread_id, ns, cid, parent, seq, type_, blob, mtype, meta, eseq, kind, material) = row[:12]
        prev_hash, hash_ = row[12:14]
        entry = (
            None
            if eseq is None
            else ChainEntry(int(eseq), str(kind), str(material), str(prev_hash), str(hash_))
        )
        return cls(
            str(thread_id),
            str(ns),
            str(cid),
            parent,
            int(seq),
            str(type_),
            _bytes(blob),
            str(mtype),
            _bytes(meta),
            entry,
        )


@dataclass(frozen=True, slots=True)
class WriteRow:
    """A stored pending write with the chain entry that wrote it."""

    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    channel: str
    type: str
    value: bytes
    task_path: str
    seq: int
    entry: ChainEntry | None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> WriteRow:
        ns, cid, task_id, idx, channel, type_, value, path, seq = row[:9]
        eseq, kind, material, prev_hash, hash_ = row[9:14]
        entry = (
            None
            if eseq is None
            else ChainEntry(int(eseq), str(kind), str(material), str(prev_hash), str(hash_))
        )
        return cls(
            str(ns),
            str(cid),
            str(task_id),
            int(idx),
            str(channel),
            str(type_),
            _bytes(value),
            str(path),
            int(seq),
            entry,
        )


@dataclass(frozen=True, slots=True)
class LangGraphRun:
    """A run ``durable_invoke`` accepted: its input, recorded before the first node ran."""

    thread_id: str
    state: str  # running | done | failed
    graph: str | None
    input_type: str
    input: bytes
    config_json: str
    owner: str
    attempts: int
    error: str | None
    started_at: float
    updated_at: float

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> LangGraphRun:
        (thread_id, state, graph, itype, input_, config, owner, attempts, error, t0, t1) = row
        return cls(
            str(thread_id),
            str(state),
            graph,
            str(itype),
            _bytes(input_),
            str(config),
            str(owner),
            int(attempts),
            error,
            float(t0),
            float(t1),
        )
