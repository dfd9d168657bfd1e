-- The OpenAI Agents SDK's sessions (oncewire_agents_sessions, oncewire_agents_items), written
-- once for every dialect. Every change to a session takes its row's lock first (SQLite:
-- BEGIN IMMEDIATE; PostgreSQL: the row an INSERT ... ON CONFLICT, UPDATE or DELETE touches),
-- so one session's appends, pops and clears happen one after the other, and each statement
-- after the lock reads what the one before it committed.

-- name: agent_session_reserve_seqs
-- Give out the next :count sequence numbers of a session (created with its first append); the
-- last of them is returned. The session's row stays locked until the transaction ends.
INSERT INTO oncewire_agents_sessions (session_id, last_seq, created_at, updated_at)
VALUES (:session_id, :count, :now, :now)
ON CONFLICT (session_id) DO UPDATE
   SET last_seq = oncewire_agents_sessions.last_seq + excluded.last_seq,
       updated_at = excluded.updated_at
RETURNING last_seq

-- name: agent_session_insert_items
-- Items (seq, canonical JSON) of one session, numbered by agent_session_reserve_seqs. SQLite pads the
-- rows with NULLs to a power of two: those are skipped.
WITH v (v_seq, v_item) AS ({values :rows bigint, text})
INSERT INTO oncewire_agents_items (session_id, seq, item, created_at)
SELECT :session_id, v_seq, v_item, :now FROM v WHERE v_seq IS NOT NULL

-- name: agent_session_lock_session
-- The lock a pop takes before it looks for the newest item: a second pop waits here and then
-- finds the item before the first one's. No row: the session has no items.
UPDATE oncewire_agents_sessions SET updated_at = :now WHERE session_id = :session_id
RETURNING last_seq

-- name: agent_session_pop_item
-- Remove a session's newest item and return it (nothing when it has none).
DELETE FROM oncewire_agents_items
 WHERE session_id = :session_id
   AND seq = (SELECT MAX(seq) FROM oncewire_agents_items WHERE session_id = :session_id)
RETURNING seq, item, created_at

-- name: agent_session_delete_session
-- A clear's first statement: the session's row, which locks it (an append waiting on it then
-- starts the session afresh, after this transaction).
DELETE FROM oncewire_agents_sessions WHERE session_id = :session_id

-- name: agent_session_delete_items
-- Every item of a session (after agent_session_delete_session: it sees every committed append).
DELETE FROM oncewire_agents_items WHERE session_id = :session_id

-- name: agent_session_items
-- A session's items, oldest first.
SELECT seq, item, created_at FROM oncewire_agents_items
 WHERE session_id = :session_id
 ORDER BY seq

-- name: agent_session_latest_items
-- A session's newest :limit items, newest first (the caller puts them back in order).
SELECT seq, item, created_at FROM oncewire_agents_items
 WHERE session_id = :session_id
 ORDER BY seq DESC
 LIMIT :limit
