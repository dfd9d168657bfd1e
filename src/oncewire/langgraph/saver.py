"""OncewireSaver: LangGraph's checkpointer on the ledger's own store (SQLite or PostgreSQL).

``OncewireSaver(ledger)`` (or ``OncewireSaver.from_conn_string(url)``, a context manager like the
upstream savers) stores checkpoints and pending writes in the tables of the ledger's store, so
that a checkpoint, its writes and the caller's own rows can share one transaction
(:meth:`OncewireSaver.joined`). On top of what a checkpointer does, it keeps four promises:

- **ordering**: a checkpoint is never stored before the writes LangGraph issued on its parent
  have committed (:mod:`oncewire.langgraph.saver_barrier`);
- **verifiable**: each thread's history is a hash chain (HMAC under the ledger's runs key when
  it has one; :mod:`oncewire.langgraph.chain`), and ``get_tuple`` / ``list`` raise
  :class:`CheckpointTampered` (or :class:`CheckpointUnreadable`) on a broken chain or a blob
  that does not deserialise, never a partial state
  (:mod:`oncewire.langgraph.saver_reading`);
- **write ownership**: writing to a thread takes its lease (a fenced named lease, as the
  gateway's bot leases; a dead owner on this host is recognised at once by pid and start time);
  a process whose lease was taken over is refused (:class:`ThreadLeaseLost`) before anything is
  written, so the chain never forks;
- **no lost accepted run**: :func:`oncewire.langgraph.durable_invoke` records a run's input
  before the first node runs (:mod:`oncewire.langgraph.saver_runs`).
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, cast

from oncewire.core.extras import refusal

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("langgraph", "oncewire.langgraph.OncewireSaver", exc) from exc

from oncewire.core.errors import (
    InvalidState,
    ThreadLeaseLost,
)
from oncewire.core.ids import this_process_owner
from oncewire.langgraph import chain
from oncewire.langgraph import saver_reading as reading
from oncewire.langgraph.saver_barrier import WriteBarrier
from oncewire.langgraph.saver_cache import EMPTY, ChainCache
from oncewire.langgraph.saver_leases import DEFAULT_HOLD_SECONDS, ThreadLeases
from oncewire.ledger import Ledger, LedgerTransaction
from oncewire.storage import LangGraphStore, Transaction
from oncewire.storage.langgraph import (
    CheckpointRow,
    NewCheckpoint,
    NewWrite,
    ThreadHead,
    WriteRow,
    lease_name,
)
from oncewire.storage.verbs.langgraph import Erase, Item, LeaseHold, Writes
from oncewire.storage.verbs.leases import Lease

__all__ = ["DEFAULT_HOLD_SECONDS", "DEFAULT_LEASE_SECONDS", "OncewireSaver"]

DEFAULT_LEASE_SECONDS = 60.0
DEFAULT_BARRIER_TIMEOUT_SECONDS = 10.0

# The caller's transaction that this context's puts and writes join (OncewireSaver.joined).
_JOINED: ContextVar[Transaction | None] = ContextVar("oncewire_langgraph_joined", default=None)


def _configurable(config: RunnableConfig) -> Mapping[str, Any]:
    return cast(Mapping[str, Any], config.get("configurable") or {})


class OncewireSaver(BaseCheckpointSaver[str]):
    """LangGraph's checkpointer on the ledger's store; see the module docstring.

    ``lease_seconds`` is how long a thread stays this saver's once the process stops renewing
    its lease without dying (a dead process on this host is taken over at once); while the
    process lives, a heartbeat renews the lease of a thread it claimed (until
    :meth:`release`) or wrote to within the last ``hold_seconds``
    (:mod:`oncewire.langgraph.saver_leases`; ``heartbeat=False``: only its writes renew it).
    ``barrier_timeout_seconds`` bounds how long a checkpoint waits for its parent's writes.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        serde: SerializerProtocol | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        hold_seconds: float = DEFAULT_HOLD_SECONDS,
        heartbeat: bool = True,
        barrier_timeout_seconds: float = DEFAULT_BARRIER_TIMEOUT_SECONDS,
        owner: str | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.ledger = ledger
        self.store: LangGraphStore = ledger.store
        self.key = ledger.runs.key
        self.lease_seconds = float(lease_seconds)
        self.owner = owner or this_process_owner()
        self.leases = ThreadLeases(
            self.store,
            ledger.clock,
            owner=self.owner,
            lease_seconds=self.lease_seconds,
            hold_seconds=float(hold_seconds),
            heartbeat=heartbeat,
        )
        self._chains = ChainCache()
        # Appends to one thread queue here rather than in the database (SQLite has one writer
        # at a time, whose busy wait sleeps for milliseconds; PostgreSQL's would lock the head).
        stripes = 1 if self.store.dialect == "sqlite" else 64
        self._writing = [threading.Lock() for _ in range(stripes)]
        self._barrier = WriteBarrier(self._load_parent, timeout_seconds=barrier_timeout_seconds)
        self._owned_ledger: Ledger | None = None

    # -- construction ------------------------------------------------------------------------
    @classmethod
    @contextmanager
    def from_conn_string(cls, conn_string: str, **options: Any) -> Iterator[OncewireSaver]:
        """A saver on its own ledger at ``conn_string`` (a SQLite path, ``sqlite://`` or
        ``postgresql://`` URL), closed with the block."""
        ledger = Ledger(conn_string)
        try:
            saver = cls(ledger, **options)
            saver._owned_ledger = ledger
            yield saver
        finally:
            if "saver" in locals():
                saver.close()
            ledger.close()

    def close(self) -> None:
        """Stop renewing this saver's leases (they run out, or are given back by
        :meth:`release`); the ledger stays open (``from_conn_string`` closes its own)."""
        self.leases.stop()

    # -- ownership ---------------------------------------------------------------------------
    def claim(self, thread_id: str) -> Lease:
        """Take ``thread_id``'s lease for this saver (at once when it is free, ran out, or its
        holder is a dead process on this host), or :class:`ThreadBusy` while another live
        process holds it. Writing claims a thread by itself; a resume claims it first. A
        claimed thread's lease is renewed while this process lives, until :meth:`release`."""
        with self.store.borrowed_connection():
            return self.leases.claim(thread_id, pin=True)

    def release(self, thread_id: str) -> bool:
        """Give the thread's lease back (another process may write to it at once)."""
        with self.store.borrowed_connection():
            return self.leases.release(thread_id)

    def _hold(self, thread_id: str) -> LeaseHold:
        lease = self.leases.held(thread_id)
        if lease is None:
            if _JOINED.get() is not None:
                raise InvalidState(
                    f"thread {thread_id!r} is not claimed by this saver: call "
                    "saver.claim(thread_id) before the transaction it joins; nothing was written",
                    thread_id=thread_id,
                )
            lease = self.leases.claim(thread_id, pin=False)
        return LeaseHold(
            lease.name, self.owner, lease.fence, self.ledger.clock.now() + self.lease_seconds
        )

    # -- appending ---------------------------------------------------------------------------
    @contextmanager
    def joined(self, tx: LedgerTransaction | Transaction) -> Iterator[None]:
        """Inside the block, this context's ``put`` and ``put_writes`` write in the caller's
        transaction ``tx`` (``with ledger.transaction() as tx``): they commit with the caller's
        rows, or not at all. For calls made in the caller's thread (``graph.update_state``, a
        checkpoint put by hand); the store's connection is the caller's thread's. The thread
        must be claimed first (:meth:`claim`): a lease is taken in a transaction of its own."""
        token = _JOINED.set(tx)
        try:
            yield
        finally:
            _JOINED.reset(token)

    def _append(self, thread_id: str, items: Sequence[Item], *, owned: bool = True) -> None:
        tx = _JOINED.get()
        if tx is not None:  # the caller's transaction: never queued behind another append
            self._append_slow(thread_id, items, owned, tx)
            return
        stripe = self._writing[hash(thread_id) % len(self._writing)]
        with self.store.borrowed_connection(), stripe:
            item = items[0] if len(items) == 1 else None
            if (
                owned
                and isinstance(item, NewCheckpoint | Writes)
                and (isinstance(item, NewCheckpoint) or item.rows)
                and self._append_fast(thread_id, item)
            ):
                return
            self._append_slow(thread_id, items, owned, None)

    def _append_fast(self, thread_id: str, item: NewCheckpoint | Writes) -> bool:
        """One round trip when this saver knows the thread's head and holds its lease (or the
        thread is new): False when the general append has to decide."""
        lease = self.leases.held(thread_id)
        after = self._chains.tip(thread_id)
        now = self.ledger.clock.now()
        if after is None:
            return False
        take = lease is None
        if lease is None:
            if after != EMPTY or not isinstance(item, NewCheckpoint):
                return False
            holder = LeaseHold(lease_name(thread_id), self.owner, 1, now + self.lease_seconds)
        elif self.leases.due(lease, now):
            return False  # the general append extends the lease in its transaction
        else:
            holder = LeaseHold(lease.name, self.owner, lease.fence, lease.expires_at)
        entry = self.store.lg_append_held(
            thread_id,
            item,
            sealer=chain.sealer(thread_id, self.key),
            holder=holder,
            after=None if after == EMPTY else after,
            now=now,
            take_lease=take,
        )
        if entry is None:
            return False
        if take:
            self.leases.record(thread_id, Lease(holder.name, self.owner, 1, holder.expires_at, now))
        else:
            self.leases.used(thread_id)
        self._chains.appended(thread_id, after, (entry.seq, entry.hash), [entry])
        return True

    def _append_slow(
        self, thread_id: str, items: Sequence[Item], owned: bool, tx: Transaction | None
    ) -> None:
        holder = self._hold(thread_id) if owned else None
        seal = chain.sealer(thread_id, self.key)
        now = self.ledger.clock.now()
        try:
            if tx is None:
                done = self.store.lg_append(thread_id, items, sealer=seal, holder=holder, now=now)
            else:
                done = self.store.lg_append_in_tx(
                    tx, thread_id, items, sealer=seal, holder=holder, now=now
                )
        except ThreadLeaseLost:
            self.leases.lose(thread_id)
            raise
        if holder is not None and tx is None:  # the append extended the lease it checked
            self.leases.record(
                thread_id, Lease(holder.name, self.owner, holder.fence, holder.expires_at, now)
            )
        if done is not None and tx is None:  # our own entries, hashed here: no need to read them
            self._chains.appended(
                thread_id,
                (done.from_seq, done.from_hash) if done.from_seq else EMPTY,
                (done.head.head_seq, done.head.head_hash),
            )

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        conf = _configurable(config)
        thread_id = str(conf["thread_id"])
        ns = str(conf.get("checkpoint_ns", ""))
        parent = conf.get("checkpoint_id")
        full = get_checkpoint_metadata(config, metadata)
        type_, blob = self.serde.dumps_typed(checkpoint)
        mtype, mblob = self.serde.dumps_typed(full)
        run_id = full.get("run_id")
        row = NewCheckpoint(
            ns,
            checkpoint["id"],
            parent,
            type_,
            blob,
            mtype,
            mblob,
            None if run_id is None else str(run_id),
        )
        if parent:
            self._barrier.before_put(
                (thread_id, ns, parent),
                checkpoint.get("versions_seen") or {},
                from_loop=full.get("source") == "loop",
            )
        self._append(thread_id, [row])
        self._barrier.stored((thread_id, ns, checkpoint["id"]), checkpoint.get("versions_seen"))
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        conf = _configurable(config)
        thread_id = str(conf["thread_id"])
        ns = str(conf.get("checkpoint_ns", ""))
        checkpoint_id = str(conf["checkpoint_id"])
        rows = []
        for idx, (channel, value) in enumerate(writes):
            type_, blob = self.serde.dumps_typed(value)
            rows.append(NewWrite(WRITES_IDX_MAP.get(channel, idx), channel, type_, blob, task_path))
        with self._barrier.writing((thread_id, ns, checkpoint_id), task_path):
            self._append(thread_id, [Writes(ns, checkpoint_id, task_id, rows)])

    # -- reading -----------------------------------------------------------------------------
    def _verify(self, thread_id: str, head: ThreadHead | None) -> bytes | None:
        return reading.verify(self.store, self._chains, self.key, thread_id, head)

    def _tuple(
        self, row: CheckpointRow, writes: Sequence[WriteRow], key: bytes | None
    ) -> CheckpointTuple:
        return reading.checkpoint_tuple(self.serde, self._chains, row, writes, key)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = _configurable(config)
        thread_id = str(conf["thread_id"])
        checkpoint_id = get_checkpoint_id(config)
        with self.store.borrowed_connection():
            row, writes, head = self.store.lg_read_checkpoint(
                thread_id, str(conf.get("checkpoint_ns", "")), checkpoint_id
            )
            if row is None:
                if head is None:
                    self._chains.read_empty(thread_id)  # a new thread's first put follows it
                return None
            key = self._verify(thread_id, head)
        result = self._tuple(row, writes, key)
        if checkpoint_id is None:  # a run starts from here: writing to the thread again is allowed
            self.leases.found_again(thread_id)
        return result

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        conf = _configurable(config) if config else {}
        thread_id = conf.get("thread_id")
        ns = conf.get("checkpoint_ns") if "checkpoint_ns" in conf else None
        only_id = conf.get("checkpoint_id")
        rows = self.store.lg_list_checkpoints(
            thread_id=None if thread_id is None else str(thread_id),
            checkpoint_ns=None if ns is None else str(ns),
            before=get_checkpoint_id(before) if before else None,
            limit=None if filter or only_id else limit,
        )
        keys: dict[str, bytes | None] = {}
        count = 0
        for row, writes in rows:
            if only_id and row.checkpoint_id != only_id:
                continue
            if row.thread_id not in keys:
                with self.store.borrowed_connection():
                    head = self.store.lg_head(row.thread_id)
                    keys[row.thread_id] = self._verify(row.thread_id, head)
            result = self._tuple(row, writes, keys[row.thread_id])
            if filter and any(result.metadata.get(k) != v for k, v in filter.items()):
                continue
            yield result
            count += 1
            if limit is not None and count >= limit:
                return

    # -- the barrier's view of the store -----------------------------------------------------
    def _load_parent(self, key: tuple[str, str, str]) -> tuple[Mapping[str, Any] | None, set[str]]:
        """The parent's versions_seen and the task paths whose writes on it are stored."""
        with self.store.borrowed_connection():
            row, writes, _ = self.store.lg_read_checkpoint(*key)
        if row is None:
            return None, set()
        checkpoint = reading.loads(
            self.serde, key[0], f"checkpoint {key[2]}", row.type, row.checkpoint
        )
        return checkpoint.get("versions_seen") or {}, {w.task_path for w in writes}

    # -- deleting and copying ----------------------------------------------------------------
    def delete_thread(self, thread_id: str) -> None:
        self.store.lg_delete_thread(str(thread_id))
        self._chains.forget(str(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        by_thread: dict[str, list[tuple[str, str]]] = {}
        for thread_id, ns, cid in self.store.lg_checkpoints_of_runs(list(run_ids)):
            by_thread.setdefault(thread_id, []).append((ns, cid))
        for thread_id, checkpoints in by_thread.items():
            self._append(thread_id, [Erase(checkpoints, "delete_for_runs")], owned=False)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: keep_latest or delete")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            seen: set[str] = set()
            drop: list[tuple[str, str]] = []
            for ns, cid in self.store.lg_checkpoint_keys(thread_id):  # newest first per ns
                if ns in seen:
                    drop.append((ns, cid))
                seen.add(ns)
            if drop:
                self._append(thread_id, [Erase(drop, "prune keep_latest")], owned=False)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of the source, verified, onto the target's own chain
        (the target's lease is taken for it)."""
        head, _, checkpoints, writes = self.store.lg_thread(source_thread_id)
        if head is None:
            return
        key = self._verify(source_thread_id, head)
        items: list[Item] = []
        by_entry: dict[int, list[WriteRow]] = {}
        for w in writes:
            chain.check_write(source_thread_id, w, key)
            by_entry.setdefault(w.seq, []).append(w)
        ordered: list[tuple[int, Item]] = []
        for c in checkpoints:
            chain.check_checkpoint(c, key)
            ordered.append(
                (
                    c.seq,
                    NewCheckpoint(
                        c.checkpoint_ns,
                        c.checkpoint_id,
                        c.parent_checkpoint_id,
                        c.type,
                        c.checkpoint,
                        c.metadata_type,
                        c.metadata,
                        _run_id(self, source_thread_id, c),
                    ),
                )
            )
        for seq, rows in by_entry.items():
            first = rows[0]
            ordered.append(
                (
                    seq,
                    Writes(
                        first.checkpoint_ns,
                        first.checkpoint_id,
                        first.task_id,
                        [NewWrite(r.idx, r.channel, r.type, r.value, r.task_path) for r in rows],
                    ),
                )
            )
        items = [item for _, item in sorted(ordered, key=lambda pair: pair[0])]
        if items:
            self._append(target_thread_id, items)

    # -- versions ----------------------------------------------------------------------------
    def get_next_version(self, current: str | None, channel: None) -> str:
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # -- asyncio -----------------------------------------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


def _run_id(saver: OncewireSaver, thread_id: str, row: CheckpointRow) -> str | None:
    metadata = reading.loads(
        saver.serde, thread_id, "checkpoint metadata", row.metadata_type, row.metadata
    )
    run_id = metadata.get("run_id") if isinstance(metadata, dict) else None
    return None if run_id is None else str(run_id)
