"""The hash chain of a LangGraph thread's checkpoints, and its verification.

Each entry of ``oncewire_lg_chain`` hashes (thread, sequence number, kind, previous hash,
material); the first entry's previous hash is the thread's genesis hash. Without a key the hash
is sha256: an edit, a reorder, a deletion or a move to another thread breaks the chain unless
the whole tail is re-hashed. With the runs key (``runs_key=...`` of the :class:`Ledger`,
``ONCEWIRE_RUNS_KEY`` for the command line) it is HMAC-SHA256, which nobody with only database
access can recompute, as for the run ledger (:mod:`oncewire.runs.chain`).

A row is bound to its entry by the digests the material names (:mod:`oncewire.storage.langgraph`):
a changed blob no longer matches. Nothing here imports LangGraph: ``oncewire doctor --deep``
verifies threads without the extra.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from oncewire.core.errors import CheckpointTampered, ConfigurationError
from oncewire.runs.keys import KEY_ENV, key_id
from oncewire.storage import LangGraphStore
from oncewire.storage.langgraph import ChainEntry, CheckpointRow, ThreadHead, WriteRow, blob_digest
from oncewire.storage.verbs.langgraph import Sealer

__all__ = [
    "ThreadVerdict",
    "chain_key",
    "check_checkpoint",
    "check_write",
    "entry_hash",
    "genesis_hash",
    "judge_thread",
    "sealer",
    "verify_entries",
    "verify_thread",
]

_VERSION = "oncewire.langgraph/1"


def _digest(key: bytes | None, material: bytes) -> str:
    if key:
        return hmac.digest(key, material, "sha256").hex()
    return hashlib.sha256(material).hexdigest()


def genesis_hash(thread_id: str, key: bytes | None) -> str:
    """The ``prev_hash`` of a thread's first entry: binds the chain to its thread."""
    return _digest(key, f"{_VERSION}\x1f{thread_id}".encode("utf-8", "surrogatepass"))


def entry_hash(
    key: bytes | None, thread_id: str, seq: int, kind: str, prev_hash: str, material: str
) -> str:
    text = f"{thread_id}\x1f{seq}\x1f{kind}\x1f{prev_hash}\x1f{material}"
    return _digest(key, text.encode("utf-8", "surrogatepass"))


def sealer(thread_id: str, key: bytes | None) -> Sealer:
    """How new entries of ``thread_id`` are hashed under ``key``."""
    return Sealer(
        chain="hmac-sha256" if key else "sha256",
        key_id=key_id(key),
        genesis=genesis_hash(thread_id, key),
        seal=lambda seq, kind, prev, material: entry_hash(
            key, thread_id, seq, kind, prev, material
        ),
    )


def chain_key(head: ThreadHead, key: bytes | None) -> bytes | None:
    """The key ``head``'s chain is verified with, or :class:`ConfigurationError` when this
    saver's key does not fit it (nothing is judged: a wrong key is not tampering)."""
    if head.chain == "hmac-sha256":
        if not key:
            raise ConfigurationError(
                f"thread {head.thread_id!r} is chained with HMAC-SHA256: open the ledger with "
                f"its key (runs_key=..., {KEY_ENV} for the CLI); nothing was judged",
                thread_id=head.thread_id,
            )
        if head.key_id is not None and head.key_id != key_id(key):
            raise ConfigurationError(
                f"thread {head.thread_id!r} is chained under another key (key id "
                f"{head.key_id}); set {KEY_ENV} to the key it was written with; nothing was "
                "judged",
                thread_id=head.thread_id,
            )
        return key
    if key:
        raise ConfigurationError(
            f"thread {head.thread_id!r} is chained without a key (sha256) but this ledger has "
            f"one ({KEY_ENV}): read it with the key unset; nothing was judged",
            thread_id=head.thread_id,
        )
    return None


def _tampered(thread_id: str, reason: str, **fields: Any) -> CheckpointTampered:
    return CheckpointTampered(
        f"thread {thread_id!r}: {reason}; nothing of it was returned",
        thread_id=thread_id,
        reason=reason,
        **fields,
    )


def verify_entries(
    thread_id: str,
    entries: Iterable[ChainEntry],
    key: bytes | None,
    *,
    after_seq: int = 0,
    after_hash: str | None = None,
) -> tuple[int, str]:
    """Check ``entries`` (in ``seq`` order) continue the chain after ``(after_seq,
    after_hash)`` (the genesis by default); the last verified ``(seq, hash)``. The first break
    raises :class:`CheckpointTampered` naming it."""
    expected = after_seq + 1
    prev = after_hash if after_hash is not None else genesis_hash(thread_id, key)
    for entry in entries:
        if entry.seq != expected:
            raise _tampered(thread_id, f"chain entry {expected} is missing or moved", seq=expected)
        if entry.prev_hash != prev:
            raise _tampered(
                thread_id, f"chain entry {entry.seq} does not follow the one before", seq=entry.seq
            )
        computed = entry_hash(key, thread_id, entry.seq, entry.kind, prev, entry.material)
        if not hmac.compare_digest(computed, entry.hash):
            raise _tampered(
                thread_id, f"chain entry {entry.seq}'s hash does not match it", seq=entry.seq
            )
        prev = entry.hash
        expected += 1
    return expected - 1, prev


@functools.lru_cache(maxsize=4096)
def _parsed(material: str) -> Any:
    """The material's JSON (read only: the same object is handed to every caller)."""
    try:
        return json.loads(material)
    except ValueError:
        return None


def _material(thread_id: str, entry: ChainEntry) -> dict[str, Any]:
    value = _parsed(entry.material)
    if not isinstance(value, dict) or value.get("k") != entry.kind:
        raise _tampered(thread_id, f"chain entry {entry.seq} is unreadable", seq=entry.seq)
    return value


Known = Mapping[int, ChainEntry]  # entries verified before (their chain, their hash), by seq
_NOTHING: Known = MappingProxyType({})


def _sealed(
    thread_id: str, entry: ChainEntry | None, seq: int, key: bytes | None, known: Known
) -> ChainEntry:
    """The row's own entry, present and hashing to what it says (an entry read back exactly as
    one verified before hashes as it did then)."""
    if entry is None:
        raise _tampered(thread_id, f"chain entry {seq} of a stored row is missing", seq=seq)
    if known.get(entry.seq) == entry:
        return entry
    computed = entry_hash(key, thread_id, entry.seq, entry.kind, entry.prev_hash, entry.material)
    if not hmac.compare_digest(computed, entry.hash):
        raise _tampered(thread_id, f"chain entry {entry.seq}'s hash does not match it", seq=seq)
    return entry


def check_checkpoint(row: CheckpointRow, key: bytes | None, known: Known = _NOTHING) -> None:
    """The checkpoint row is the one its chain entry recorded, byte for byte (``known``:
    entries verified before, see :func:`_sealed`)."""
    entry = _sealed(row.thread_id, row.entry, row.seq, key, known)
    m = _material(row.thread_id, entry)
    if (
        entry.kind != "checkpoint"
        or m.get("ns") != row.checkpoint_ns
        or m.get("id") != row.checkpoint_id
        or m.get("parent") != row.parent_checkpoint_id
        or m.get("blob") != blob_digest(row.type, row.checkpoint)
        or m.get("meta") != blob_digest(row.metadata_type, row.metadata)
    ):
        raise _tampered(
            row.thread_id,
            f"checkpoint {row.checkpoint_id} does not match its chain entry {row.seq}",
            checkpoint_id=row.checkpoint_id,
            seq=row.seq,
        )


def check_write(
    thread_id: str,
    row: WriteRow,
    key: bytes | None,
    known: Known = _NOTHING,
) -> None:
    """The write row is one its chain entry recorded, byte for byte."""
    entry = _sealed(thread_id, row.entry, row.seq, key, known)
    m = _material(thread_id, entry)
    wanted = [row.idx, row.channel, row.task_path, blob_digest(row.type, row.value)]
    if (
        entry.kind != "writes"
        or m.get("ns") != row.checkpoint_ns
        or m.get("id") != row.checkpoint_id
        or m.get("task") != row.task_id
        or wanted not in m.get("rows", [])
    ):
        raise _tampered(
            thread_id,
            f"a write of checkpoint {row.checkpoint_id} does not match its chain entry {row.seq}",
            checkpoint_id=row.checkpoint_id,
            seq=row.seq,
        )


@dataclass(frozen=True, slots=True)
class ThreadVerdict:
    """What verifying one thread whole found."""

    thread_id: str
    ok: bool
    entries: int
    checkpoints: int
    writes: int
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "ok": self.ok,
            "entries": self.entries,
            "checkpoints": self.checkpoints,
            "writes": self.writes,
            "reason": self.reason,
        }


def _live_rows(
    thread_id: str, chain: Sequence[ChainEntry]
) -> tuple[set[int], dict[tuple[str, str], int], dict[tuple[str, str, str, int], int]]:
    """From the chain alone: the erased entries, and which entry last wrote each checkpoint and
    write slot that should still be stored."""
    erased: set[int] = set()
    checkpoints: dict[tuple[str, str], int] = {}
    writes: dict[tuple[str, str, str, int], int] = {}
    for entry in chain:
        m = _material(thread_id, entry)
        if entry.kind == "erase":
            erased.update(int(s) for s in m.get("seqs", []))
        elif entry.kind == "checkpoint":
            checkpoints[(m["ns"], m["id"])] = entry.seq
        else:
            for slot in m.get("rows", []):
                writes[(m["ns"], m["id"], m["task"], int(slot[0]))] = entry.seq
    return erased, checkpoints, writes


def verify_thread(store: LangGraphStore, thread_id: str, key: bytes | None) -> ThreadVerdict:
    """Verify everything stored for ``thread_id``: the chain from its genesis to its head, every
    row against its entry, and every row the chain says is stored (not erased) being there. A
    key that does not fit is :class:`ConfigurationError`, not a verdict."""
    return judge_thread(thread_id, *store.lg_thread(thread_id), key)


def judge_thread(
    thread_id: str,
    head: ThreadHead | None,
    chain: Sequence[ChainEntry],
    checkpoints: Sequence[CheckpointRow],
    writes: Sequence[WriteRow],
    key: bytes | None,
) -> ThreadVerdict:
    """:func:`verify_thread` of rows already read (``Store.lg_thread``'s, at one moment), for a
    caller that also shows them."""
    counts = (len(chain), len(checkpoints), len(writes))
    if head is None:
        if chain or checkpoints or writes:
            return ThreadVerdict(thread_id, False, *counts, reason="rows without a chain head")
        return ThreadVerdict(thread_id, True, *counts)
    use = chain_key(head, key)
    try:
        seq, last = verify_entries(thread_id, chain, use)
        if (seq, last) != (head.head_seq, head.head_hash):
            raise _tampered(thread_id, "the chain does not end at the recorded head")
        for row in checkpoints:
            check_checkpoint(row, use)
        for write in writes:
            check_write(thread_id, write, use)
        erased, want_cps, want_writes = _live_rows(thread_id, chain)
        _compare(
            thread_id,
            "checkpoint",
            erased,
            want_cps,
            {(r.checkpoint_ns, r.checkpoint_id): r.seq for r in checkpoints},
        )
        _compare(
            thread_id,
            "write",
            erased,
            want_writes,
            {(w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx): w.seq for w in writes},
        )
    except CheckpointTampered as exc:
        return ThreadVerdict(thread_id, False, *counts, reason=str(exc.fields.get("reason")))
    return ThreadVerdict(thread_id, True, *counts)


def _compare(
    thread_id: str, name: str, erased: set[int], want: Mapping[Any, int], have: Mapping[Any, int]
) -> None:
    """The rows stored are exactly those the chain says should be (not erased, the newest entry
    for each slot)."""
    for slot, entry_seq in want.items():
        if entry_seq not in erased and have.get(slot) != entry_seq:
            raise _tampered(thread_id, f"a {name} that chain entry {entry_seq} wrote is missing")
    for slot, row_seq in have.items():
        if row_seq in erased or want.get(slot) != row_seq:
            raise _tampered(thread_id, f"a {name} row is not the chain's (entry {row_seq})")
