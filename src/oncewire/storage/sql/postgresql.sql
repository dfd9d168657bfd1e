-- PostgreSQL-only forms of neutral queries (same name, marked [postgresql]). Each one exists
-- because the neutral text would be correct but slower or less concurrent on PostgreSQL, or
-- because PostgreSQL's concurrent writers need a lock that SQLite's single writer (BEGIN
-- IMMEDIATE) already holds, where the neutral text is a plain SELECT 1.

-- name: claim [postgresql]
-- SKIP LOCKED: concurrent dispatchers take different due effects instead of queueing on the
-- same rows.
WITH due AS (
    SELECT id FROM oncewire_effects
     WHERE state IN ('pending', 'uncertain') AND not_before <= :now AND recoveries = 0
       AND (deadline IS NULL OR deadline >= :now)
       AND (:any_kind OR kind {in :kinds}) AND (:any_key OR key {in :keys})
     ORDER BY not_before, id
     LIMIT :limit
     {skip_locked})
UPDATE oncewire_effects AS e
   SET state = 'claimed', attempts = e.attempts + 1, fence = e.fence + 1,
       started_fence = CASE WHEN :mark THEN e.fence + 1 ELSE e.started_fence END,
       lease_owner = :owner, lease_expires_at = :expires_at, updated_at = :now
  FROM due
 WHERE e.id = due.id
RETURNING e.id, e.key, e.kind, e.payload, e.attempts, e.max_attempts, e.fence, e.maybe_sent,
          e.deadline, e.not_sent, e.traceparent, e.recoveries, e.started_fence

-- name: claim_suspect [postgresql]
-- SKIP LOCKED, as claim.
WITH due AS (
    SELECT id FROM oncewire_effects
     WHERE state IN ('pending', 'uncertain') AND recoveries > 0
       AND not_before <= :now AND (deadline IS NULL OR deadline >= :now)
       AND (:any_kind OR kind {in :kinds}) AND (:any_key OR key {in :keys})
     ORDER BY not_before, id
     LIMIT 1
     {skip_locked})
UPDATE oncewire_effects AS e
   SET state = 'claimed', attempts = e.attempts + 1, fence = e.fence + 1,
       started_fence = e.fence + 1,
       lease_owner = :owner, lease_expires_at = :expires_at, updated_at = :now
  FROM due
 WHERE e.id = due.id
RETURNING e.id, e.key, e.kind, e.payload, e.attempts, e.max_attempts, e.fence, e.maybe_sent,
          e.deadline, e.not_sent, e.traceparent, e.recoveries, e.started_fence

-- name: backlog [postgresql]
-- One scan with FILTER instead of four subqueries.
SELECT MIN(not_before) FILTER (WHERE state IN ('pending', 'uncertain')),
       COUNT(*) FILTER (WHERE state = 'uncertain'),
       COUNT(*) FILTER (WHERE state = 'claimed'),
       COUNT(*) FILTER (WHERE state = 'pending' AND fence > 0),
       MIN(not_before) FILTER (WHERE state = 'uncertain' OR (state = 'pending' AND fence > 0))
  FROM oncewire_effects
 WHERE state IN ('pending', 'uncertain', 'claimed') AND (:any_kind OR kind {in :kinds})
   AND (:any_key OR key {in :keys})

-- name: lock_branch [postgresql]
-- The branch's advisory lock, held until the transaction ends (migration 0002).
SELECT oncewire_run_branch_lock(:scope, :branch)

-- name: lock_scope [postgresql]
-- The scope's exclusive advisory lock, held until the transaction ends (migration 0002).
SELECT oncewire_run_scope_lock(:scope, TRUE)

-- name: lock_key_pins [postgresql]
-- SHARE ROW EXCLUSIVE conflicts with itself and with writers, not with readers. EXPLAIN cannot
-- plan a LOCK: the statement test runs it instead, in a transaction it rolls back.
LOCK TABLE oncewire_run_key_pins IN SHARE ROW EXCLUSIVE MODE

-- name: command_context_locked [postgresql]
-- The head event is read by a LATERAL subquery, planned on its own, that walks the run's
-- (run_id, seq) index backwards from the head's seq and stops at the first row: in the order
-- that index gives, no plan can do better, whatever the table's statistics say. Joined
-- directly, a cached generic plan (psycopg prepares a statement from its fifth run, and
-- PostgreSQL then keeps one plan) made while the events table was small and not yet analyzed
-- could read all of the run's events and keep the one whose seq matched, so that each command
-- on a run took longer with every event until autovacuum analyzed the table. A head event
-- that is missing still reads as missing: a row of another seq is not the head.
SELECT {run_columns:r}, {event_columns:h}, {event_columns:p}, {barrier_columns:b}
  FROM oncewire_runs AS r
  LEFT JOIN LATERAL (SELECT * FROM oncewire_run_events AS e
                      WHERE e.run_id = r.run_id AND e.seq <= r.head_seq
                      ORDER BY e.seq DESC LIMIT 1) AS h ON TRUE
  LEFT JOIN oncewire_run_events AS p ON p.run_id = r.run_id AND p.idempotency_key = :key
  LEFT JOIN oncewire_run_barriers AS b ON b.scope = r.scope AND b.state <> 'resolved'
 WHERE r.run_id = :run_id
 FOR UPDATE OF r

-- name: command_context [postgresql]
-- command_context_locked without the lock; the head event read as there.
SELECT {run_columns:r}, {event_columns:h}, {event_columns:p}, {barrier_columns:b}
  FROM oncewire_runs AS r
  LEFT JOIN LATERAL (SELECT * FROM oncewire_run_events AS e
                      WHERE e.run_id = r.run_id AND e.seq <= r.head_seq
                      ORDER BY e.seq DESC LIMIT 1) AS h ON TRUE
  LEFT JOIN oncewire_run_events AS p ON p.run_id = r.run_id AND p.idempotency_key = :key
  LEFT JOIN oncewire_run_barriers AS b ON b.scope = r.scope AND b.state <> 'resolved'
 WHERE r.run_id = :run_id
