"""The hash chain of a run's history.

Each event stores the previous event's hash and its own hash over (run, sequence, type,
previous hash, canonical payload). Without a key the hash is sha256: any edit, reorder,
deletion or move to another run breaks the chain unless the whole tail is re-hashed. With a key
(HMAC-SHA256, held outside the database) nobody with only database access can re-hash it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ChainFault", "chain_name", "event_hash", "genesis_hash", "verify_chain"]

_VERSION = "oncewire.runs/1"


def chain_name(key: bytes | None) -> str:
    return "hmac-sha256" if key else "sha256"


def _digest(key: bytes | None, material: bytes) -> str:
    if key:
        return hmac.digest(key, material, "sha256").hex()
    return hashlib.sha256(material).hexdigest()


def genesis_hash(run_id: str, key: bytes | None) -> str:
    """The ``prev_hash`` of a run's first event: binds the chain to its run."""
    return _digest(key, f"{_VERSION}\x1f{run_id}".encode())


def event_hash(
    key: bytes | None, run_id: str, seq: int, type_: str, prev_hash: str, payload_json: str
) -> str:
    return _digest(key, f"{run_id}\x1f{seq}\x1f{type_}\x1f{prev_hash}\x1f{payload_json}".encode())


@dataclass(frozen=True, slots=True)
class ChainFault:
    """The first event that breaks the chain, and why."""

    seq: int
    reason: str


def verify_chain(
    run_id: str,
    rows: Iterable[tuple[int, int, str, str, str, str]],
    key: bytes | None,
    *,
    after_seq: int = 0,
    after_hash: str | None = None,
    after_cursor: int = 0,
) -> tuple[ChainFault | None, int, str, int]:
    """Check ``(cursor, seq, type, prev_hash, hash, payload_json)`` rows in ``seq`` order.

    Starts after ``(after_seq, after_hash)`` (the last verified event; the genesis by default),
    so verification can resume instead of re-reading a whole history. Returns the first fault
    (or None), and the last verified ``(seq, hash, cursor)``.
    """
    expected_seq = after_seq + 1
    prev = after_hash if after_hash is not None else genesis_hash(run_id, key)
    last_cursor = after_cursor
    sha256 = hashlib.sha256
    hmac_digest = hmac.digest
    for cursor, seq, type_, prev_hash, stored, payload_json in rows:
        if seq != expected_seq:
            return ChainFault(expected_seq, f"event {expected_seq} is missing or moved"), *_at(
                expected_seq - 1, prev, last_cursor
            )
        if prev_hash != prev:
            return ChainFault(seq, "its prev_hash does not match the event before it"), *_at(
                seq - 1, prev, last_cursor
            )
        if cursor <= last_cursor:
            return ChainFault(seq, "its cursor is out of order"), *_at(seq - 1, prev, last_cursor)
        material = f"{run_id}\x1f{seq}\x1f{type_}\x1f{prev_hash}\x1f{payload_json}".encode()
        computed = (
            hmac_digest(key, material, "sha256").hex() if key else sha256(material).hexdigest()
        )
        if computed != stored:
            return ChainFault(seq, "its hash does not match its content"), *_at(
                seq - 1, prev, last_cursor
            )
        prev = stored
        last_cursor = cursor
        expected_seq += 1
    return None, expected_seq - 1, prev, last_cursor


def _at(seq: int, hash_: str, cursor: int) -> tuple[int, str, int]:
    return seq, hash_, cursor
