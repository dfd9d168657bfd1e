"""The langgraph suite's checkpoint invariants: a thread's history verifies, twice over.

Once as :class:`~oncewire.langgraph.OncewireSaver` verifies it
(:func:`oncewire.langgraph.chain.verify_thread`: every chain entry's hash, every row against
its entry, every row the chain says is stored being there), and once more from the tables read
with the plain driver, without oncewire's code: the chain's entries are numbered 1..head
without a gap, each names the hash of the one before as its ``prev_hash``, the thread's head
is the last entry, every checkpoint points at a ``checkpoint`` entry and every write at a
``writes`` entry, and every checkpoint's parent is stored.

:func:`check_window` checks, from the tables right after a kill at one of the saver's own
points (``langgraph.put_*``, ``langgraph.writes_*``), that the kill landed in the window the
point names: the call the killed process never returned from (its journal) is not stored at
all after a ``*_before_commit`` kill (for a ``put``: the thread's newest checkpoint is not
the one being put), and is stored, its entry the chain's head, after a ``*_after_commit`` one
(the append holds the thread's turn to write until it returns: nothing came after it).
"""

from __future__ import annotations

import itertools
from typing import Any

from oncewire.lab.fixtures import placeholders, rows
from oncewire.lab.framework import ScenarioResult

__all__ = ["WINDOWS", "check_checkpoints", "check_window"]

# The saver's points: (the journalled call they interrupt, whether its append is committed).
WINDOWS: dict[str, tuple[str, bool]] = {
    "langgraph.put_before_commit": ("put", False),
    "langgraph.put_after_commit": ("put", True),
    "langgraph.writes_before_commit": ("writes", False),
    "langgraph.writes_after_commit": ("writes", True),
}


def _read(dialect: str, where: str, sql: str, thread_id: str) -> list[dict[str, Any]]:
    quoted = thread_id.replace("'", "''")
    return rows(dialect, where, placeholders(dialect, sql.replace("?", f"'{quoted}'")))


def _tables(result: ScenarioResult, dialect: str, where: str, thread_id: str) -> int:
    """The direct reading; how many checkpoints the thread has."""
    head = _read(
        dialect,
        where,
        "SELECT head_seq, head_hash FROM oncewire_lg_threads WHERE thread_id = ?",
        thread_id,
    )
    chain = _read(
        dialect,
        where,
        "SELECT seq, kind, prev_hash, hash FROM oncewire_lg_chain WHERE thread_id = ? ORDER BY seq",
        thread_id,
    )
    checkpoints = _read(
        dialect,
        where,
        "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id, seq "
        "FROM oncewire_lg_checkpoints WHERE thread_id = ?",
        thread_id,
    )
    writes = _read(
        dialect, where, "SELECT seq FROM oncewire_lg_writes WHERE thread_id = ?", thread_id
    )
    if not result.require(len(head) == 1, f"the thread has {len(head)} head rows, not one"):
        return len(checkpoints)
    seqs = [entry["seq"] for entry in chain]
    result.require(seqs == list(range(1, len(chain) + 1)), f"the chain has gaps: {seqs}")
    linked = all(
        later["prev_hash"] == earlier["hash"] for earlier, later in itertools.pairwise(chain)
    )
    result.require(linked, "a chain entry does not name the hash of the one before it")
    last = chain[-1] if chain else None
    result.require(
        last is not None
        and (head[0]["head_seq"], head[0]["head_hash"]) == (last["seq"], last["hash"]),
        "the thread's head is not the chain's last entry",
    )
    kinds = {entry["seq"]: entry["kind"] for entry in chain}
    result.require(
        all(kinds.get(row["seq"]) == "checkpoint" for row in checkpoints),
        "a checkpoint row points at no checkpoint entry",
    )
    result.require(
        all(kinds.get(row["seq"]) == "writes" for row in writes),
        "a write row points at no writes entry",
    )
    stored = {(row["checkpoint_ns"], row["checkpoint_id"]) for row in checkpoints}
    orphans = [
        row["checkpoint_id"]
        for row in checkpoints
        if row["parent_checkpoint_id"] is not None
        and (row["checkpoint_ns"], row["parent_checkpoint_id"]) not in stored
    ]
    result.require(not orphans, f"checkpoints whose parent is not stored: {orphans}")
    return len(checkpoints)


def check_checkpoints(result: ScenarioResult, where: str, dialect: str, thread_id: str) -> int:
    """Require that ``thread_id``'s history in the store ``where`` verifies (see the module
    docstring); how many checkpoints it holds."""
    from oncewire.langgraph.chain import verify_thread
    from oncewire.ledger import Ledger

    with Ledger(where, create=False) as ledger:
        verdict = verify_thread(ledger.store, thread_id, ledger.runs.key)
    result.require(verdict.ok, f"the thread's checkpoint chain does not verify: {verdict.reason}")
    result.require(verdict.checkpoints > 0, "the thread has no checkpoint")
    return _tables(result, dialect, where, thread_id)


def _stored_at(
    call: dict[str, Any], checkpoints: list[dict[str, Any]], writes: list[dict[str, Any]]
) -> set[int]:
    """The chain entries that hold the rows of a journalled call (none: it is not stored)."""
    if call["op"] == "put":
        return {r["seq"] for r in checkpoints if r["checkpoint_id"] == call["checkpoint_id"]}
    return {
        r["seq"]
        for r in writes
        if (r["checkpoint_id"], r["task_id"]) == (call["checkpoint_id"], call["task_id"])
    }


def check_window(
    result: ScenarioResult,
    where: str,
    dialect: str,
    thread_id: str,
    point: str,
    calls: list[dict[str, Any]],
) -> str | None:
    """Require that a kill at ``point`` (a key of :data:`WINDOWS`) landed in its window, read
    from the store ``where`` before anything ran again; ``calls`` are the saver calls of the
    killed process that never returned (``oncewire.lab.children.langgraph.unfinished``). What
    was interrupted, or None when the check failed."""
    op, committed = WINDOWS[point]
    if not result.require(bool(calls), f"killed at {point} with no {op} call under way"):
        return None
    head = _read(
        dialect, where, "SELECT head_seq FROM oncewire_lg_threads WHERE thread_id = ?", thread_id
    )
    head_seq = head[0]["head_seq"] if head else 0
    checkpoints = _read(
        dialect,
        where,
        "SELECT checkpoint_id, seq FROM oncewire_lg_checkpoints WHERE thread_id = ?",
        thread_id,
    )
    writes = _read(
        dialect,
        where,
        "SELECT checkpoint_id, task_id, seq FROM oncewire_lg_writes WHERE thread_id = ?",
        thread_id,
    )
    newest = max(checkpoints, key=lambda r: r["seq"])["checkpoint_id"] if checkpoints else None
    for call in calls:
        seqs = _stored_at(call, checkpoints, writes)
        named = f"{op} {call['checkpoint_id']}" + (f" {call['task_id']}" if op == "writes" else "")
        if committed and seqs == {head_seq}:
            return f"{named}: committed, the chain's head"
        if not committed and not seqs and (op != "put" or newest != call["checkpoint_id"]):
            return f"{named}: not stored (newest checkpoint {newest})"
    window = "committed as the chain's head" if committed else "not stored"
    result.require(
        False,
        f"killed at {point}, yet no unfinished {op} call is {window}: {calls}, head {head_seq}",
    )
    return None
