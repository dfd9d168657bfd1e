-- The LangGraph checkpointer's tables (oncewire_lg_*), written once for every dialect. A thread's
-- chain grows only under its head row's lock (SQLite: BEGIN IMMEDIATE; PostgreSQL: FOR UPDATE)
-- and by compare and set on head_seq, so two writers can never both append entry n.

-- name: lg_head_for_update
SELECT chain, key_id, head_seq, head_hash FROM oncewire_lg_threads WHERE thread_id = :thread_id
{for_update}

-- name: lg_head
SELECT chain, key_id, head_seq, head_hash FROM oncewire_lg_threads WHERE thread_id = :thread_id

-- name: lg_insert_thread
-- A thread's first entry; nothing inserted (rowcount 0) when another writer created it first.
INSERT INTO oncewire_lg_threads (thread_id, chain, key_id, head_seq, head_hash, updated_at)
VALUES (:thread_id, :chain, :key_id, :head_seq, :head_hash, :now)
ON CONFLICT (thread_id) DO NOTHING
RETURNING head_seq

-- name: lg_advance_head
-- The head moves from prev_seq only: refused (rowcount 0) when someone appended in between.
UPDATE oncewire_lg_threads SET head_seq = :head_seq, head_hash = :head_hash, updated_at = :now
 WHERE thread_id = :thread_id AND head_seq = :prev_seq
RETURNING head_seq

-- name: lg_insert_entry
INSERT INTO oncewire_lg_chain (thread_id, seq, kind, material, prev_hash, hash, created_at)
VALUES (:thread_id, :seq, :kind, :material, :prev_hash, :hash, :now)

-- name: lg_upsert_checkpoint
-- The same checkpoint id put again replaces the row, which then points at its newer entry.
INSERT INTO oncewire_lg_checkpoints (
    thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, seq, type, checkpoint,
    metadata_type, metadata, run_id, created_at)
VALUES (:thread_id, :checkpoint_ns, :checkpoint_id, :parent_checkpoint_id, :seq, :type,
        :checkpoint, :metadata_type, :metadata, :run_id, :now)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_checkpoint_id = excluded.parent_checkpoint_id, seq = excluded.seq,
    type = excluded.type, checkpoint = excluded.checkpoint,
    metadata_type = excluded.metadata_type, metadata = excluded.metadata,
    run_id = excluded.run_id, created_at = excluded.created_at

-- name: lg_write_slots
-- The slots a task already wrote for a checkpoint (a regular slot is written once).
SELECT idx FROM oncewire_lg_writes
 WHERE thread_id = :thread_id AND checkpoint_ns = :checkpoint_ns
   AND checkpoint_id = :checkpoint_id AND task_id = :task_id

-- name: lg_upsert_write
INSERT INTO oncewire_lg_writes (
    thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, value, task_path, seq)
VALUES (:thread_id, :checkpoint_ns, :checkpoint_id, :task_id, :idx, :channel, :type, :value,
        :task_path, :seq)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = excluded.channel, type = excluded.type, value = excluded.value,
    task_path = excluded.task_path, seq = excluded.seq

-- name: lg_advance_held
-- The fast append's compare and set: the head moves from (prev_seq, prev_hash), the head its
-- writer last knew, only while :owner still holds the thread's lease under :fence. The lease row
-- is locked until the append commits (PostgreSQL), so a takeover waits for it or refuses it
-- first; nothing moves when either changed.
UPDATE oncewire_lg_threads SET head_seq = :head_seq, head_hash = :head_hash, updated_at = :now
 WHERE thread_id = :thread_id AND head_seq = :prev_seq AND head_hash = :prev_hash
   AND EXISTS (SELECT 1 FROM oncewire_leases
                WHERE name = :lease AND owner = :owner AND fence = :fence {for_update})

-- name: lg_advance_held_writes
-- lg_advance_held for a task's writes, also refused while any regular slot of the task is
-- already stored for the checkpoint (a write replayed: the general append keeps the stored one).
UPDATE oncewire_lg_threads SET head_seq = :head_seq, head_hash = :head_hash, updated_at = :now
 WHERE thread_id = :thread_id AND head_seq = :prev_seq AND head_hash = :prev_hash
   AND EXISTS (SELECT 1 FROM oncewire_leases
                WHERE name = :lease AND owner = :owner AND fence = :fence {for_update})
   AND NOT EXISTS (SELECT 1 FROM oncewire_lg_writes
                    WHERE thread_id = :thread_id AND checkpoint_ns = :checkpoint_ns
                      AND checkpoint_id = :checkpoint_id AND task_id = :task_id AND idx >= 0)

-- name: lg_start_held
-- A new thread's first entry, only while :owner holds its lease under :fence; nothing inserted
-- when the thread exists or the lease is not so held.
INSERT INTO oncewire_lg_threads (thread_id, chain, key_id, head_seq, head_hash, updated_at)
SELECT :thread_id, :chain, :key_id, :head_seq, :head_hash, :now
 WHERE EXISTS (SELECT 1 FROM oncewire_leases
                WHERE name = :lease AND owner = :owner AND fence = :fence {for_update})
ON CONFLICT (thread_id) DO NOTHING

-- name: lg_insert_entry_at
-- A fast append's entry, stored only if the head is now the new entry: its compare and set moved
-- it (the head row is this transaction's until it commits), or an earlier run of the same append
-- did (the hash covers the entry whole), which stored this entry already.
INSERT INTO oncewire_lg_chain (thread_id, seq, kind, material, prev_hash, hash, created_at)
SELECT :thread_id, :seq, :kind, :material, :prev_hash, :hash, :now
 WHERE EXISTS (SELECT 1 FROM oncewire_lg_threads
                WHERE thread_id = :thread_id AND head_seq = :head_seq AND head_hash = :head_hash)
ON CONFLICT (thread_id, seq) DO NOTHING

-- name: lg_upsert_checkpoint_at
-- lg_upsert_checkpoint, only if the fast append's compare and set moved the head.
INSERT INTO oncewire_lg_checkpoints (
    thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, seq, type, checkpoint,
    metadata_type, metadata, run_id, created_at)
SELECT :thread_id, :checkpoint_ns, :checkpoint_id, :parent_checkpoint_id, :seq, :type,
       :checkpoint, :metadata_type, :metadata, :run_id, :now
 WHERE EXISTS (SELECT 1 FROM oncewire_lg_threads
                WHERE thread_id = :thread_id AND head_seq = :head_seq AND head_hash = :head_hash)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_checkpoint_id = excluded.parent_checkpoint_id, seq = excluded.seq,
    type = excluded.type, checkpoint = excluded.checkpoint,
    metadata_type = excluded.metadata_type, metadata = excluded.metadata,
    run_id = excluded.run_id, created_at = excluded.created_at

-- name: lg_upsert_write_at
-- lg_upsert_write, only if the fast append's compare and set moved the head.
INSERT INTO oncewire_lg_writes (
    thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, value, task_path, seq)
SELECT :thread_id, :checkpoint_ns, :checkpoint_id, :task_id, :idx, :channel, :type, :value,
       :task_path, :seq
 WHERE EXISTS (SELECT 1 FROM oncewire_lg_threads
                WHERE thread_id = :thread_id AND head_seq = :head_seq AND head_hash = :head_hash)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = excluded.channel, type = excluded.type, value = excluded.value,
    task_path = excluded.task_path, seq = excluded.seq

-- name: lg_tuple_latest
-- In one statement (one moment of the store): the namespace's newest checkpoint with the entry
-- that wrote it ('c'), its pending writes with theirs ('w'), and the thread's head ('h', also
-- when it has no checkpoint). A missing entry reads as NULLs (a broken history).
WITH c AS (
    SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, seq, type, checkpoint,
           metadata_type, metadata
      FROM oncewire_lg_checkpoints
     WHERE thread_id = :thread_id AND checkpoint_ns = :checkpoint_ns
     ORDER BY checkpoint_id DESC
     LIMIT 1
)
SELECT 'c', c.checkpoint_id, c.parent_checkpoint_id, c.type, c.checkpoint, c.metadata_type,
       c.metadata, c.seq, NULL, e.seq, e.kind, e.material, e.prev_hash, e.hash, NULL, NULL,
       CAST(NULL AS BIGINT), NULL
  FROM c LEFT JOIN oncewire_lg_chain e ON e.thread_id = c.thread_id AND e.seq = c.seq
UNION ALL
SELECT 'w', w.task_id, w.channel, w.type, w.value, w.task_path, NULL, w.seq, w.idx, e.seq,
       e.kind, e.material, e.prev_hash, e.hash, NULL, NULL, CAST(NULL AS BIGINT), NULL
  FROM c JOIN oncewire_lg_writes w
    ON w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
   AND w.checkpoint_id = c.checkpoint_id
  LEFT JOIN oncewire_lg_chain e ON e.thread_id = w.thread_id AND e.seq = w.seq
UNION ALL
SELECT 'h', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       t.chain, t.key_id, t.head_seq, t.head_hash
  FROM oncewire_lg_threads t WHERE t.thread_id = :thread_id

-- name: lg_tuple_by_id
-- lg_tuple_latest for one checkpoint id.
WITH c AS (
    SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, seq, type, checkpoint,
           metadata_type, metadata
      FROM oncewire_lg_checkpoints
     WHERE thread_id = :thread_id AND checkpoint_ns = :checkpoint_ns
       AND checkpoint_id = :checkpoint_id
)
SELECT 'c', c.checkpoint_id, c.parent_checkpoint_id, c.type, c.checkpoint, c.metadata_type,
       c.metadata, c.seq, NULL, e.seq, e.kind, e.material, e.prev_hash, e.hash, NULL, NULL,
       CAST(NULL AS BIGINT), NULL
  FROM c LEFT JOIN oncewire_lg_chain e ON e.thread_id = c.thread_id AND e.seq = c.seq
UNION ALL
SELECT 'w', w.task_id, w.channel, w.type, w.value, w.task_path, NULL, w.seq, w.idx, e.seq,
       e.kind, e.material, e.prev_hash, e.hash, NULL, NULL, CAST(NULL AS BIGINT), NULL
  FROM c JOIN oncewire_lg_writes w
    ON w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
   AND w.checkpoint_id = c.checkpoint_id
  LEFT JOIN oncewire_lg_chain e ON e.thread_id = w.thread_id AND e.seq = w.seq
UNION ALL
SELECT 'h', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       t.chain, t.key_id, t.head_seq, t.head_hash
  FROM oncewire_lg_threads t WHERE t.thread_id = :thread_id

-- name: lg_list_checkpoints
-- Newest first, optionally one thread, one namespace, and ids before a cursor; at most :limit.
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.seq, c.type,
       c.checkpoint, c.metadata_type, c.metadata, e.seq, e.kind, e.material, e.prev_hash, e.hash
  FROM oncewire_lg_checkpoints c
  LEFT JOIN oncewire_lg_chain e ON e.thread_id = c.thread_id AND e.seq = c.seq
 WHERE (CAST(:thread_id AS TEXT) IS NULL OR c.thread_id = :thread_id)
   AND (CAST(:checkpoint_ns AS TEXT) IS NULL OR c.checkpoint_ns = :checkpoint_ns)
   AND (CAST(:before AS TEXT) IS NULL OR c.checkpoint_id < :before)
 ORDER BY c.checkpoint_id DESC, c.thread_id, c.checkpoint_ns
 LIMIT :limit

-- name: lg_get_writes
SELECT w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx, w.channel, w.type, w.value,
       w.task_path, w.seq, e.seq, e.kind, e.material, e.prev_hash, e.hash
  FROM oncewire_lg_writes w
  LEFT JOIN oncewire_lg_chain e ON e.thread_id = w.thread_id AND e.seq = w.seq
 WHERE w.thread_id = :thread_id AND w.checkpoint_ns = :checkpoint_ns
   AND w.checkpoint_id = :checkpoint_id
 ORDER BY w.task_id, w.idx

-- name: lg_thread_checkpoints
-- Every checkpoint of a thread, in the order its chain wrote them.
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.seq, c.type,
       c.checkpoint, c.metadata_type, c.metadata, e.seq, e.kind, e.material, e.prev_hash, e.hash
  FROM oncewire_lg_checkpoints c
  LEFT JOIN oncewire_lg_chain e ON e.thread_id = c.thread_id AND e.seq = c.seq
 WHERE c.thread_id = :thread_id
 ORDER BY c.seq

-- name: lg_thread_writes
SELECT w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx, w.channel, w.type, w.value,
       w.task_path, w.seq, e.seq, e.kind, e.material, e.prev_hash, e.hash
  FROM oncewire_lg_writes w
  LEFT JOIN oncewire_lg_chain e ON e.thread_id = w.thread_id AND e.seq = w.seq
 WHERE w.thread_id = :thread_id
 ORDER BY w.seq, w.idx

-- name: lg_chain_after
SELECT seq, kind, material, prev_hash, hash FROM oncewire_lg_chain
 WHERE thread_id = :thread_id AND seq > :after_seq
 ORDER BY seq

-- name: lg_thread_ids
SELECT thread_id FROM oncewire_lg_threads ORDER BY thread_id

-- name: lg_thread_page
-- A page of threads by id after :after (the dashboard's list): each head, how many checkpoints
-- it stores, its newest checkpoint (of the root namespace first) and its lease's holder.
SELECT t.thread_id, t.chain, t.key_id, t.head_seq, t.head_hash, t.updated_at,
       (SELECT COUNT(*) FROM oncewire_lg_checkpoints c WHERE c.thread_id = t.thread_id),
       (SELECT c.checkpoint_id FROM oncewire_lg_checkpoints c WHERE c.thread_id = t.thread_id
         ORDER BY CASE WHEN c.checkpoint_ns = '' THEN 0 ELSE 1 END, c.checkpoint_id DESC
         LIMIT 1),
       l.owner, l.fence, l.expires_at
  FROM oncewire_lg_threads t
  LEFT JOIN oncewire_leases l ON l.name = 'langgraph.thread:' || t.thread_id
 WHERE t.thread_id > :after
 ORDER BY t.thread_id
 LIMIT :limit

-- name: lg_checkpoints_of_runs
-- The checkpoints (and the entries that wrote them) that carry one of :run_ids.
SELECT thread_id, checkpoint_ns, checkpoint_id, seq FROM oncewire_lg_checkpoints
 WHERE run_id {in :run_ids}
 ORDER BY thread_id, seq

-- name: lg_checkpoint_keys
-- Every checkpoint of a thread, newest first per namespace: what pruning decides on.
SELECT checkpoint_ns, checkpoint_id, seq FROM oncewire_lg_checkpoints
 WHERE thread_id = :thread_id
 ORDER BY checkpoint_ns, checkpoint_id DESC

-- name: lg_write_seqs
-- The entries that wrote a checkpoint's pending writes.
SELECT DISTINCT seq FROM oncewire_lg_writes
 WHERE thread_id = :thread_id AND checkpoint_ns = :checkpoint_ns
   AND checkpoint_id = :checkpoint_id

-- name: lg_delete_checkpoint
DELETE FROM oncewire_lg_checkpoints
 WHERE thread_id = :thread_id AND checkpoint_ns = :checkpoint_ns
   AND checkpoint_id = :checkpoint_id

-- name: lg_delete_checkpoint_writes
DELETE FROM oncewire_lg_writes
 WHERE thread_id = :thread_id AND checkpoint_ns = :checkpoint_ns
   AND checkpoint_id = :checkpoint_id

-- name: lg_delete_thread_checkpoints
DELETE FROM oncewire_lg_checkpoints WHERE thread_id = :thread_id

-- name: lg_delete_thread_writes
DELETE FROM oncewire_lg_writes WHERE thread_id = :thread_id

-- name: lg_delete_thread_chain
DELETE FROM oncewire_lg_chain WHERE thread_id = :thread_id

-- name: lg_delete_thread_head
DELETE FROM oncewire_lg_threads WHERE thread_id = :thread_id

-- name: lg_delete_thread_run
DELETE FROM oncewire_lg_runs WHERE thread_id = :thread_id

-- name: lg_start_run
-- A run accepted on a thread: its input, before the first node runs. A thread whose earlier
-- run ended is started again (one row per thread: its latest run).
INSERT INTO oncewire_lg_runs (
    thread_id, state, graph, input_type, input, config, owner, attempts, error, started_at,
    updated_at)
VALUES (:thread_id, 'running', :graph, :input_type, :input, :config, :owner, 1, NULL, :now,
        :now)
ON CONFLICT (thread_id) DO UPDATE SET
    state = 'running', graph = excluded.graph, input_type = excluded.input_type,
    input = excluded.input, config = excluded.config, owner = excluded.owner, attempts = 1,
    error = NULL, started_at = excluded.started_at, updated_at = excluded.updated_at

-- name: lg_resume_run
-- A run taken over by a new owner (a resume): one more attempt.
UPDATE oncewire_lg_runs SET owner = :owner, attempts = attempts + 1, updated_at = :now
 WHERE thread_id = :thread_id AND state = 'running'

-- name: lg_end_run
UPDATE oncewire_lg_runs SET state = :state, error = :error, updated_at = :now
 WHERE thread_id = :thread_id AND owner = :owner AND state = 'running'

-- name: lg_get_run
SELECT thread_id, state, graph, input_type, input, config, owner, attempts, error, started_at,
       updated_at
  FROM oncewire_lg_runs WHERE thread_id = :thread_id

-- name: lg_running_runs
SELECT thread_id, state, graph, input_type, input, config, owner, attempts, error, started_at,
       updated_at
  FROM oncewire_lg_runs WHERE state = 'running' ORDER BY thread_id

-- name: lg_checkpoint_seq
-- The entry that wrote one checkpoint (what an erasure names).
SELECT seq FROM oncewire_lg_checkpoints
 WHERE thread_id = :thread_id AND checkpoint_ns = :checkpoint_ns
   AND checkpoint_id = :checkpoint_id
