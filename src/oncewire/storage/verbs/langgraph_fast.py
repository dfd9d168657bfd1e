"""The LangGraph checkpointer's fast verbs: an append in one round trip, a read in one statement.

``lg_append_held`` is the append of a writer that knows its thread's head (it wrote or verified
it last) and holds the thread's lease. The lease check, the compare and set of the head and the
rows travel together (PostgreSQL: ``BEGIN``, the statements and ``COMMIT`` in one pipeline, one
round trip; SQLite: one ``BEGIN IMMEDIATE`` transaction), and every row is stored only if the
compare and set moved the head to the new entry, which the SQL itself checks. When anything is
not as the writer knew it (another writer moved the head, the lease moved, a replayed write
finds its slots stored), nothing is written and the answer is None: the general append
(:meth:`~oncewire.storage.verbs.langgraph.LangGraphVerbs.lg_append`) then decides from what is
stored. The invariants are :mod:`~oncewire.storage.verbs.langgraph`'s: a write under a moved
fence stores nothing, and the chain grows only by compare and set on its head. Its crash
points are the general append's (``langgraph.put_*``, ``langgraph.writes_*``), the one before
the commit hit before the pipeline is sent: nothing of the append has reached the database.

``lg_read_checkpoint`` reads a checkpoint, its pending writes and its thread's head in one
statement: one moment of the store without a transaction around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oncewire.storage.driver import Driver, Pending, Pipeline
from oncewire.storage.langgraph import (
    ChainEntry,
    CheckpointRow,
    NewCheckpoint,
    ThreadHead,
    WriteRow,
    checkpoint_material,
    writes_material,
)
from oncewire.storage.verbs.langgraph import (
    PUT_AFTER_COMMIT,
    PUT_BEFORE_COMMIT,
    WRITES_AFTER_COMMIT,
    WRITES_BEFORE_COMMIT,
    LeaseHold,
    Sealer,
    Writes,
)

__all__ = ["LangGraphFastVerbs"]


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else bytes(value)


def _entry(row: Sequence[Any]) -> ChainEntry | None:
    seq, kind, material, prev_hash, hash_ = row
    if seq is None:
        return None
    return ChainEntry(int(seq), str(kind), str(material), str(prev_hash), str(hash_))


class LangGraphFastVerbs:
    """The fast append and the one-statement read of LangGraph checkpoints."""

    db: Driver

    def lg_append_held(
        self,
        thread_id: str,
        item: NewCheckpoint | Writes,
        *,
        sealer: Sealer,
        holder: LeaseHold,
        after: tuple[int, str] | None,
        now: float,
        take_lease: bool = False,
    ) -> ChainEntry | None:
        """Append ``item`` after the head ``after`` (``(head_seq, head_hash)``; None for a
        thread with no chain yet) while ``holder`` holds the thread's lease, in one transaction
        of its own; the entry it stored, or None when nothing was written (the head or the lease
        is not what the caller knew, or a write's slots are already stored).

        With ``take_lease`` (a new thread, ``after`` None), the lease is taken in the same
        transaction under fence 1 (``holder.fence``) when nobody ever held it; when somebody
        did, nothing is written. Safe to send twice: a second run finds the head already at the
        entry the first stored, and stores nothing more. ``sealer.seal`` must hash what it is
        given (an entry's hash names it whole: a stored head equal to the new one is this
        entry, stored)."""
        db, q = self.db, self.db.queries
        seq = 1 if after is None else after[0] + 1
        prev = sealer.genesis if after is None else after[1]
        if isinstance(item, NewCheckpoint):
            kind, material = "checkpoint", checkpoint_material(item)
        else:
            kind = "writes"
            material = writes_material(
                item.checkpoint_ns, item.checkpoint_id, item.task_id, item.rows
            )
        hash_ = sealer.seal(seq, kind, prev, material)
        at = {"thread_id": thread_id, "seq": seq, "head_seq": seq, "head_hash": hash_, "now": now}
        lease = {"lease": holder.name, "owner": holder.owner, "fence": holder.fence}

        def fill(p: Pipeline) -> Pending:
            if take_lease:
                p.run(
                    q.insert_lease,
                    name=holder.name,
                    owner=holder.owner,
                    expires_at=holder.expires_at,
                    now=now,
                )
            if after is None:
                p.run(q.lg_start_held, **at, **lease, chain=sealer.chain, key_id=sealer.key_id)
            elif isinstance(item, Writes):
                p.run(
                    q.lg_advance_held_writes,
                    **at,
                    **lease,
                    prev_seq=after[0],
                    prev_hash=after[1],
                    checkpoint_ns=item.checkpoint_ns,
                    checkpoint_id=item.checkpoint_id,
                    task_id=item.task_id,
                )
            else:
                p.run(q.lg_advance_held, **at, **lease, prev_seq=after[0], prev_hash=prev)
            p.run(
                q.lg_insert_entry_at, **at, kind=kind, material=material, prev_hash=prev, hash=hash_
            )
            if isinstance(item, NewCheckpoint):
                p.run(
                    q.lg_upsert_checkpoint_at,
                    **at,
                    checkpoint_ns=item.checkpoint_ns,
                    checkpoint_id=item.checkpoint_id,
                    parent_checkpoint_id=item.parent_checkpoint_id,
                    type=item.type,
                    checkpoint=item.checkpoint,
                    metadata_type=item.metadata_type,
                    metadata=item.metadata,
                    run_id=item.run_id,
                )
            else:
                p.batch(
                    q.lg_upsert_write_at,
                    [
                        {
                            **at,
                            "checkpoint_ns": item.checkpoint_ns,
                            "checkpoint_id": item.checkpoint_id,
                            "task_id": item.task_id,
                            "idx": w.idx,
                            "channel": w.channel,
                            "type": w.type,
                            "value": w.value,
                            "task_path": w.task_path,
                        }
                        for w in item.rows
                    ],
                )
            return p.rows(q.lg_head, thread_id=thread_id)

        before, after_commit = (
            (PUT_BEFORE_COMMIT, PUT_AFTER_COMMIT)
            if isinstance(item, NewCheckpoint)
            else (WRITES_BEFORE_COMMIT, WRITES_AFTER_COMMIT)
        )
        before.hit()  # nothing sent: the pipeline's BEGIN, statements and COMMIT go together
        stored = db.pipelined_write("storing a LangGraph checkpoint", fill).one()
        if stored is None or (int(stored[2]), str(stored[3])) != (seq, hash_):
            return None
        after_commit.hit()
        return ChainEntry(seq, kind, material, prev, hash_)

    def lg_read_checkpoint(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> tuple[CheckpointRow | None, list[WriteRow], ThreadHead | None]:
        """One checkpoint (the namespace's newest when ``checkpoint_id`` is None) or None, its
        pending writes, and its thread's chain head (None when the thread has none), read in
        one statement."""
        q = self.db.queries
        rows = self.db.read(
            q.lg_tuple_latest if checkpoint_id is None else q.lg_tuple_by_id,
            thread_id=thread_id,
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint_id,
        )
        found: CheckpointRow | None = None
        pending: list[Sequence[Any]] = []
        head: ThreadHead | None = None
        for r in rows:
            what = r[0]
            if what == "c":
                found = CheckpointRow(
                    thread_id,
                    checkpoint_ns,
                    str(r[1]),
                    r[2],
                    int(r[7]),
                    str(r[3]),
                    _bytes(r[4]),
                    str(r[5]),
                    _bytes(r[6]),
                    _entry(r[9:14]),
                )
            elif what == "w":
                pending.append(r)
            else:
                head = ThreadHead.from_row(thread_id, r[14:18])
        if found is None:
            return None, [], head
        cid = found.checkpoint_id
        writes = [
            WriteRow(
                checkpoint_ns,
                cid,
                str(r[1]),
                int(r[8]),
                str(r[2]),
                str(r[3]),
                _bytes(r[4]),
                str(r[5]),
                int(r[7]),
                _entry(r[9:14]),
            )
            for r in pending
        ]
        return found, writes, head
