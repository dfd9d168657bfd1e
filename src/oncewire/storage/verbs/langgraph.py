"""The LangGraph checkpointer's verbs, written once (statements in ``storage/sql/langgraph.sql``).

The invariants, held in one transaction per append:

- a writer that names a lease (``holder``) writes only while it holds that lease under its fence:
  the lease row is updated first, and a moved fence refuses the whole append
  (:class:`ThreadLeaseLost`) before any row is written;
- a thread's chain is linear: an entry's ``prev_hash`` is the head it read under the head row's
  lock, and the head moves by compare and set on ``head_seq``, so two writers can never both
  append the same sequence number (``PRIMARY KEY (thread_id, seq)`` holds it too);
- every checkpoint and write row points at the entry that wrote it (``seq``), and an erasure
  (prune, delete_for_runs) removes rows only together with an ``erase`` entry that names their
  entries.

Hashing is the caller's (``seal``): the store records what it is given.

The crash points of an append in a transaction of its own (:meth:`LangGraphVerbs.lg_append`,
and the one-round-trip ``lg_append_held`` of :mod:`~oncewire.storage.verbs.langgraph_fast`),
``langgraph.put_*`` for an append that stores a checkpoint, ``langgraph.writes_*`` for one that
stores only a task's writes, hit only when the append writes something:

- ``*_before_commit``: nothing of the append is durable. The general append hits it with its
  statements run in the open transaction, before ``COMMIT``; the one-round-trip append hits it
  before its pipeline is sent (its ``BEGIN``, statements and ``COMMIT`` travel together, so
  there is no instant between them to die in), and again in the general append when that one
  takes over (the head or the lease was not as the writer knew it);
- ``*_after_commit``: the append is committed; the saver's ``put`` / ``put_writes`` has not
  returned (nor learnt the new head).

An append inside the caller's transaction (``lg_append_in_tx``) hits neither: its commit is
the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from oncewire.core import crash
from oncewire.core.errors import ConfigurationError, ThreadLeaseLost
from oncewire.storage.driver import Driver, Transaction
from oncewire.storage.langgraph import (
    ChainEntry,
    CheckpointRow,
    LangGraphRun,
    NewCheckpoint,
    NewWrite,
    ThreadHead,
    ThreadSummary,
    WriteRow,
    checkpoint_material,
    erase_material,
    writes_material,
)

__all__ = [
    "PUT_AFTER_COMMIT",
    "PUT_BEFORE_COMMIT",
    "WRITES_AFTER_COMMIT",
    "WRITES_BEFORE_COMMIT",
    "Appended",
    "Erase",
    "LangGraphVerbs",
    "LeaseHold",
    "Sealer",
    "Writes",
    "crash_points",
]

_NO_LIMIT = 2**62

PUT_BEFORE_COMMIT = crash.register(
    "langgraph.put_before_commit",
    "a checkpoint's rows are written (or, on the one-round-trip append, about to be sent) but "
    "not committed",
)
PUT_AFTER_COMMIT = crash.register(
    "langgraph.put_after_commit",
    "a checkpoint is committed; the saver's put has not returned",
)
WRITES_BEFORE_COMMIT = crash.register(
    "langgraph.writes_before_commit",
    "a task's pending writes are written (or, on the one-round-trip append, about to be sent) "
    "but not committed",
)
WRITES_AFTER_COMMIT = crash.register(
    "langgraph.writes_after_commit",
    "a task's pending writes are committed; the saver's put_writes has not returned",
)


@dataclass(frozen=True, slots=True)
class LeaseHold:
    """The lease an append relies on: refused unless ``owner`` still holds ``name`` under
    ``fence``; a successful append extends it to ``expires_at``."""

    name: str
    owner: str
    fence: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class Writes:
    """One task's writes for one checkpoint (a slot already written is kept, except the special
    slots, ``idx < 0``, which a newer write replaces)."""

    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    rows: Sequence[NewWrite]


@dataclass(frozen=True, slots=True)
class Erase:
    """Remove these checkpoints ``(ns, id)`` and their writes, recorded as one ``erase`` entry."""

    checkpoints: Sequence[tuple[str, str]]
    why: str


@dataclass(frozen=True, slots=True)
class Sealer:
    """How a thread's chain is hashed: its algorithm's name, the key's fingerprint, the genesis
    hash, and ``seal(seq, kind, prev_hash, material) -> hash``."""

    chain: str
    key_id: str | None
    genesis: str
    seal: Callable[[int, str, str, str], str]


@dataclass(frozen=True, slots=True)
class Appended:
    """What an append did: the new head, and the head it continued from."""

    head: ThreadHead
    from_seq: int
    from_hash: str


Item = NewCheckpoint | Writes | Erase


def crash_points(items: Sequence[Item]) -> tuple[crash.CrashPoint, crash.CrashPoint] | None:
    """The (before commit, after commit) points of an append of ``items``: the ``put`` points
    when it stores a checkpoint, the ``writes`` points when it stores writes only, None for an
    erasure."""
    if any(isinstance(item, NewCheckpoint) for item in items):
        return PUT_BEFORE_COMMIT, PUT_AFTER_COMMIT
    if any(isinstance(item, Writes) for item in items):
        return WRITES_BEFORE_COMMIT, WRITES_AFTER_COMMIT
    return None


class LangGraphVerbs:
    """The seam of LangGraph checkpoints: append to a thread's chain, read it, erase from it."""

    db: Driver

    # -- appending ---------------------------------------------------------------------------
    def lg_append(
        self,
        thread_id: str,
        items: Sequence[Item],
        *,
        sealer: Sealer,
        holder: LeaseHold | None,
        now: float,
    ) -> Appended | None:
        """Append ``items`` to ``thread_id``'s chain in one transaction of its own; the new head
        (None when nothing needed writing: writes already stored, nothing left to erase).

        With ``holder``, refused with :class:`ThreadLeaseLost` before anything is written
        unless the lease is still held under its fence."""
        points = crash_points(items)
        with self.db.write("storing a LangGraph checkpoint") as conn:
            done = self._append(conn, thread_id, items, sealer, holder, now)
            if done is not None and points is not None:
                points[0].hit()
        if done is not None and points is not None:
            points[1].hit()
        return done

    def lg_append_in_tx(
        self,
        tx: Transaction,
        thread_id: str,
        items: Sequence[Item],
        *,
        sealer: Sealer,
        holder: LeaseHold | None,
        now: float,
    ) -> Appended | None:
        """:meth:`lg_append` inside the caller's transaction (committed with the caller's
        rows, rolled back with them)."""
        db = self.db
        with db.in_tx(tx, "storing a LangGraph checkpoint") as conn:
            return self._append(conn, thread_id, items, sealer, holder, now)

    def _append(
        self,
        conn: Any,
        thread_id: str,
        items: Sequence[Item],
        sealer: Sealer,
        holder: LeaseHold | None,
        now: float,
    ) -> Appended | None:
        db, q = self.db, self.db.queries
        if holder is not None and not db.run(
            conn,
            q.extend_lease,
            name=holder.name,
            owner=holder.owner,
            fence=holder.fence,
            expires_at=holder.expires_at,
            now=now,
        ):
            raise ThreadLeaseLost(
                f"thread {thread_id!r} was taken over by another process (lease fence "
                f"{holder.fence} is no longer {holder.owner!r}'s); nothing was written",
                thread_id=thread_id,
                owner=holder.owner,
                fence=holder.fence,
            )
        row = db.one(conn, q.lg_head_for_update, thread_id=thread_id)
        head = None if row is None else ThreadHead.from_row(thread_id, row)
        if head is not None and (head.chain, head.key_id) != (sealer.chain, sealer.key_id):
            raise ConfigurationError(
                f"thread {thread_id!r} is chained with {head.chain}"
                + (f" under key {head.key_id}" if head.key_id else "")
                + f", not {sealer.chain}"
                + (f" under key {sealer.key_id}" if sealer.key_id else "")
                + ": open the ledger with the key it was written with; nothing was written",
                thread_id=thread_id,
            )
        seq = 0 if head is None else head.head_seq
        prev = sealer.genesis if head is None else head.head_hash
        first_seq, first_hash = seq, prev
        planned: list[tuple[str, str, list[tuple[Any, list[dict[str, Any]]]]]] = []
        for item in items:
            plan = self._plan(conn, thread_id, item, now)
            if plan is not None:
                planned.append(plan)
        if not planned:
            return None
        with db.pipeline(conn) as p:
            for kind, material, statements in planned:
                seq += 1
                hash_ = sealer.seal(seq, kind, prev, material)
                for query, rows in statements:
                    p.batch(query, [{**row, "seq": seq} for row in rows])
                p.run(
                    q.lg_insert_entry,
                    thread_id=thread_id,
                    seq=seq,
                    kind=kind,
                    material=material,
                    prev_hash=prev,
                    hash=hash_,
                    now=now,
                )
                prev = hash_
            if head is None:
                moved = p.rows(
                    q.lg_insert_thread,
                    thread_id=thread_id,
                    chain=sealer.chain,
                    key_id=sealer.key_id,
                    head_seq=seq,
                    head_hash=prev,
                    now=now,
                )
            else:
                moved = p.rows(
                    q.lg_advance_head,
                    thread_id=thread_id,
                    head_seq=seq,
                    head_hash=prev,
                    prev_seq=first_seq,
                    now=now,
                )
        if moved.one() is None:  # only a concurrent first append can get here (the row is locked)
            raise ThreadLeaseLost(
                f"thread {thread_id!r} was appended to concurrently; nothing was written",
                thread_id=thread_id,
            )
        return Appended(
            ThreadHead(thread_id, sealer.chain, sealer.key_id, seq, prev), first_seq, first_hash
        )

    def _plan(
        self, conn: Any, thread_id: str, item: Item, now: float
    ) -> tuple[str, str, list[tuple[Any, list[dict[str, Any]]]]] | None:
        """What one item writes: its entry's kind and material, and the statements (each with
        its rows, ``seq`` added when sent) that store it; None when it writes nothing."""
        db, q = self.db, self.db.queries
        if isinstance(item, NewCheckpoint):
            row = {
                "thread_id": thread_id,
                "checkpoint_ns": item.checkpoint_ns,
                "checkpoint_id": item.checkpoint_id,
                "parent_checkpoint_id": item.parent_checkpoint_id,
                "type": item.type,
                "checkpoint": item.checkpoint,
                "metadata_type": item.metadata_type,
                "metadata": item.metadata,
                "run_id": item.run_id,
                "now": now,
            }
            return "checkpoint", checkpoint_material(item), [(q.lg_upsert_checkpoint, [row])]
        if isinstance(item, Writes):
            key = {
                "thread_id": thread_id,
                "checkpoint_ns": item.checkpoint_ns,
                "checkpoint_id": item.checkpoint_id,
                "task_id": item.task_id,
            }
            taken = {int(r[0]) for r in db.all(conn, q.lg_write_slots, **key)}
            rows = [w for w in item.rows if w.idx < 0 or w.idx not in taken]
            if not rows:
                return None
            material = writes_material(item.checkpoint_ns, item.checkpoint_id, item.task_id, rows)
            params = [
                {
                    **key,
                    "idx": w.idx,
                    "channel": w.channel,
                    "type": w.type,
                    "value": w.value,
                    "task_path": w.task_path,
                }
                for w in rows
            ]
            return "writes", material, [(q.lg_upsert_write, params)]
        seqs: list[int] = []
        for ns, cid in item.checkpoints:
            key = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}
            found = db.one(conn, q.lg_checkpoint_seq, **key)
            if found is not None:
                seqs.append(int(found[0]))
            seqs.extend(int(r[0]) for r in db.all(conn, q.lg_write_seqs, **key))
            db.run(conn, q.lg_delete_checkpoint_writes, **key)
            db.run(conn, q.lg_delete_checkpoint, **key)
        if not seqs:
            return None
        return "erase", erase_material(seqs, item.why), []

    # -- reading -----------------------------------------------------------------------------
    def lg_head(self, thread_id: str) -> ThreadHead | None:
        rows = self.db.read(self.db.queries.lg_head, thread_id=thread_id)
        return ThreadHead.from_row(thread_id, rows[0]) if rows else None

    def lg_thread_ids(self) -> list[str]:
        return [str(r[0]) for r in self.db.read(self.db.queries.lg_thread_ids)]

    def lg_thread_page(self, *, after: str, limit: int) -> list[ThreadSummary]:
        """Threads by id after ``after``, at most ``limit``: each head, checkpoint count, newest
        checkpoint and lease (one statement; nothing of another thread is read)."""
        rows = self.db.read(self.db.queries.lg_thread_page, after=after, limit=limit)
        return [ThreadSummary.from_row(r) for r in rows]

    def lg_list_checkpoints(
        self,
        *,
        thread_id: str | None,
        checkpoint_ns: str | None,
        before: str | None,
        limit: int | None,
    ) -> list[tuple[CheckpointRow, list[WriteRow]]]:
        """Checkpoints newest first (optionally one thread, one namespace, ids before
        ``before``, at most ``limit``), each with its pending writes."""
        db, q = self.db, self.db.queries
        with db.translate_errors("listing LangGraph checkpoints"), db.snapshot() as conn:
            rows = db.all(
                conn,
                q.lg_list_checkpoints,
                thread_id=thread_id,
                checkpoint_ns=checkpoint_ns,
                before=before,
                limit=_NO_LIMIT if limit is None else limit,
            )
            found = [CheckpointRow.from_row(r) for r in rows]
            return [
                (
                    c,
                    [
                        WriteRow.from_row(w)
                        for w in db.all(
                            conn,
                            q.lg_get_writes,
                            thread_id=c.thread_id,
                            checkpoint_ns=c.checkpoint_ns,
                            checkpoint_id=c.checkpoint_id,
                        )
                    ],
                )
                for c in found
            ]

    def lg_chain_after(self, thread_id: str, after_seq: int) -> list[ChainEntry]:
        rows = self.db.read(
            self.db.queries.lg_chain_after, thread_id=thread_id, after_seq=after_seq
        )
        return [ChainEntry.from_row(r) for r in rows]

    def lg_thread(
        self, thread_id: str
    ) -> tuple[ThreadHead | None, list[ChainEntry], list[CheckpointRow], list[WriteRow]]:
        """Everything stored for a thread, at one moment: head, chain, checkpoints, writes."""
        db, q = self.db, self.db.queries
        with db.translate_errors("reading a LangGraph thread"), db.snapshot() as conn:
            head = db.one(conn, q.lg_head, thread_id=thread_id)
            chain = db.all(conn, q.lg_chain_after, thread_id=thread_id, after_seq=0)
            cps = db.all(conn, q.lg_thread_checkpoints, thread_id=thread_id)
            writes = db.all(conn, q.lg_thread_writes, thread_id=thread_id)
        return (
            None if head is None else ThreadHead.from_row(thread_id, head),
            [ChainEntry.from_row(r) for r in chain],
            [CheckpointRow.from_row(r) for r in cps],
            [WriteRow.from_row(r) for r in writes],
        )

    def lg_checkpoints_of_runs(self, run_ids: Sequence[str]) -> list[tuple[str, str, str]]:
        """``(thread_id, ns, checkpoint_id)`` of the checkpoints whose metadata names a run."""
        if not run_ids:
            return []
        rows = self.db.read(self.db.queries.lg_checkpoints_of_runs, run_ids=list(run_ids))
        return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    def lg_checkpoint_keys(self, thread_id: str) -> list[tuple[str, str]]:
        """``(ns, checkpoint_id)`` of a thread's checkpoints, newest first per namespace."""
        rows = self.db.read(self.db.queries.lg_checkpoint_keys, thread_id=thread_id)
        return [(str(r[0]), str(r[1])) for r in rows]

    # -- deleting ----------------------------------------------------------------------------
    def lg_delete_thread(self, thread_id: str) -> None:
        """Remove everything of a thread: checkpoints, writes, chain, head and recorded run. Its
        lease row stays (a fence only grows)."""
        db, q = self.db, self.db.queries
        with db.write("deleting a LangGraph thread") as conn:
            for query in (
                q.lg_delete_thread_writes,
                q.lg_delete_thread_checkpoints,
                q.lg_delete_thread_chain,
                q.lg_delete_thread_head,
                q.lg_delete_thread_run,
            ):
                db.run(conn, query, thread_id=thread_id)

    # -- runs (durable_invoke) ---------------------------------------------------------------
    def lg_start_run(
        self,
        thread_id: str,
        *,
        graph: str | None,
        input_type: str,
        input_blob: bytes,
        config_json: str,
        owner: str,
        now: float,
    ) -> None:
        """Record a run's input, durable before its first node runs (a new run of the thread
        replaces the record of its last one)."""
        with self.db.write("recording a LangGraph run") as conn:
            self.db.run(
                conn,
                self.db.queries.lg_start_run,
                thread_id=thread_id,
                graph=graph,
                input_type=input_type,
                input=input_blob,
                config=config_json,
                owner=owner,
                now=now,
            )

    def lg_resume_run(self, thread_id: str, *, owner: str, now: float) -> bool:
        """A running run taken over by ``owner``; False when the thread has no running run."""
        with self.db.write("resuming a LangGraph run") as conn:
            return bool(
                self.db.run(
                    conn, self.db.queries.lg_resume_run, thread_id=thread_id, owner=owner, now=now
                )
            )

    def lg_end_run(
        self, thread_id: str, *, owner: str, state: str, error: str | None, now: float
    ) -> bool:
        """``owner``'s running run ends (``done`` or ``failed``); False when it is not
        ``owner``'s running run any more."""
        with self.db.write("ending a LangGraph run") as conn:
            return bool(
                self.db.run(
                    conn,
                    self.db.queries.lg_end_run,
                    thread_id=thread_id,
                    owner=owner,
                    state=state,
                    error=error,
                    now=now,
                )
            )

    def lg_get_run(self, thread_id: str) -> LangGraphRun | None:
        rows = self.db.read(self.db.queries.lg_get_run, thread_id=thread_id)
        return LangGraphRun.from_row(rows[0]) if rows else None

    def lg_running_runs(self) -> list[LangGraphRun]:
        return [LangGraphRun.from_row(r) for r in self.db.read(self.db.queries.lg_running_runs)]
