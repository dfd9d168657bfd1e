-- The run ledger's statements (oncewire_runs, their event chains and projections, branches,
-- checkpoints, reverts, barriers, completion deliveries and reconciliation reports), written
-- once for every dialect; see oncewire/storage/sql/__init__.py for the rules they are rendered
-- by. The invariants are the schema's (one active run per branch, one terminal event per run,
-- no terminal while a phase is open, the chain only grows at its head); these statements only
-- read and write.
--
-- On PostgreSQL, transactions run concurrently at READ COMMITTED: a statement whose rows the
-- caller decides on locks them ({for_update}), and the lock_* statements take the advisory
-- locks of migration 0002. On SQLite, BEGIN IMMEDIATE already made the caller's transaction the
-- only writer: the locks render to nothing and each lock_* statement is a plain SELECT 1.

-- ---------------------------------------------------------------------------------------------
-- runs and their chains

-- name: insert_run
-- A new run (no events yet), unless its id exists or its branch already has an active run.
INSERT INTO oncewire_runs ({run_columns})
VALUES (:run_id, :scope, :branch, :turn, :workflow, :chain, :status, :terminal_reason,
        :state_json, :head_seq, :head_hash, :owner, :fence, :lease_expires_at, :created_at,
        :updated_at, :finished_at, :abandoned_at, :abandon_reason, :hidden, :key_id)
ON CONFLICT DO NOTHING

-- name: get_run
SELECT {run_columns} FROM oncewire_runs WHERE run_id = :run_id

-- name: lock_run
-- The run a transaction decides on (a renewal's fence, a replay), locked until it commits.
SELECT {run_columns} FROM oncewire_runs WHERE run_id = :run_id {for_update}

-- name: command_context_locked
-- A command's reads in one round trip, locking the run's row: the run, its head event, the
-- event already stored under the command's key, and the barrier held on its scope. On
-- PostgreSQL the joined rows are from before the lock was granted when the run changed while
-- this waited (READ COMMITTED rechecks only the locked row): the verb then reads them again
-- with command_context.
SELECT {run_columns:r}, {event_columns:h}, {event_columns:p}, {barrier_columns:b}
  FROM oncewire_runs AS r
  LEFT JOIN oncewire_run_events AS h ON h.run_id = r.run_id AND h.seq = r.head_seq
  LEFT JOIN oncewire_run_events AS p ON p.run_id = r.run_id AND p.idempotency_key = :key
  LEFT JOIN oncewire_run_barriers AS b ON b.scope = r.scope AND b.state <> 'resolved'
 WHERE r.run_id = :run_id
 {for_update_of:r}

-- name: command_context
-- command_context_locked without the lock, for a run already locked by this transaction.
SELECT {run_columns:r}, {event_columns:h}, {event_columns:p}, {barrier_columns:b}
  FROM oncewire_runs AS r
  LEFT JOIN oncewire_run_events AS h ON h.run_id = r.run_id AND h.seq = r.head_seq
  LEFT JOIN oncewire_run_events AS p ON p.run_id = r.run_id AND p.idempotency_key = :key
  LEFT JOIN oncewire_run_barriers AS b ON b.scope = r.scope AND b.state <> 'resolved'
 WHERE r.run_id = :run_id

-- name: active_run_on_branch
SELECT {run_columns} FROM oncewire_runs
 WHERE scope = :scope AND branch = :branch AND finished_at IS NULL AND abandoned_at IS NULL

-- name: event_by_key
SELECT {event_columns} FROM oncewire_run_events
 WHERE run_id = :run_id AND idempotency_key = :idempotency_key

-- name: event_at
SELECT {event_columns} FROM oncewire_run_events WHERE run_id = :run_id AND seq = :seq

-- name: insert_run_event
-- Extend the run's chain; the schema refuses an event that is not the head's successor, a
-- second terminal, a terminal while a phase is open, and (PostgreSQL) an append to a scope a
-- revert barrier holds. Returns the scope-wide cursor.
INSERT INTO oncewire_run_events (run_id, scope, branch, seq, type, idempotency_key,
                                 request_digest, terminal, payload, prev_hash, hash, at)
VALUES (:run_id, :scope, :branch, :seq, :type, :idempotency_key, :request_digest, :terminal,
        :payload_json, :prev_hash, :hash, :at)
RETURNING id

-- name: advance_run
-- The run row after an event: its projection columns, compact state, chain head and lease.
UPDATE oncewire_runs
   SET status = :status, terminal_reason = :terminal_reason, state = :state_json,
       head_seq = :head_seq, head_hash = :head_hash, owner = :owner, fence = :fence,
       lease_expires_at = :lease_expires_at, updated_at = :updated_at,
       finished_at = :finished_at
 WHERE run_id = :run_id

-- name: insert_phase
-- A phase the event opens (its id used twice fails loudly).
INSERT INTO oncewire_run_phases ({phase_columns})
VALUES (:run_id, :phase_id, :kind, :status, :verdict, :candidate_id, :body_json, :result_json,
        :actions_bound, :opened_seq, :closed_seq, :opened_at, :closed_at)

-- name: upsert_phase
-- A later event fills in how a phase went on.
INSERT INTO oncewire_run_phases ({phase_columns})
VALUES (:run_id, :phase_id, :kind, :status, :verdict, :candidate_id, :body_json, :result_json,
        :actions_bound, :opened_seq, :closed_seq, :opened_at, :closed_at)
ON CONFLICT (run_id, phase_id) DO UPDATE
   SET status = excluded.status, verdict = excluded.verdict, result = excluded.result,
       actions_bound = excluded.actions_bound, closed_seq = excluded.closed_seq,
       closed_at = excluded.closed_at

-- name: insert_finding
INSERT INTO oncewire_run_findings ({finding_columns})
VALUES (:run_id, :finding_id, :phase_id, :candidate_id, :severity, :body_json)

-- name: insert_action
-- A proposal.
INSERT INTO oncewire_run_actions ({action_columns})
VALUES (:run_id, :action_id, :phase_id, :kind, :arguments_json, :arguments_digest,
        :side_effect_class, :resource_keys_json, :effect_key, :status, :result_json,
        :proposed_seq, :resolved_seq)

-- name: upsert_action
-- A resolution only fills in how the action ended.
INSERT INTO oncewire_run_actions ({action_columns})
VALUES (:run_id, :action_id, :phase_id, :kind, :arguments_json, :arguments_digest,
        :side_effect_class, :resource_keys_json, :effect_key, :status, :result_json,
        :proposed_seq, :resolved_seq)
ON CONFLICT (run_id, action_id) DO UPDATE
   SET status = excluded.status, result = excluded.result, resolved_seq = excluded.resolved_seq

-- name: used_ids
-- Which of these phase, finding and action ids the run already uses, as (kind, id, seq): the
-- phase's kind and the event that opened it, 'finding' and the event that closed its phase,
-- 'action' and the event that proposed it. An empty list matches nothing.
SELECT kind, phase_id, opened_seq FROM oncewire_run_phases
 WHERE run_id = :run_id AND phase_id {in :phases}
UNION ALL
SELECT 'finding', f.finding_id, p.closed_seq
  FROM oncewire_run_findings AS f
  LEFT JOIN oncewire_run_phases AS p ON p.run_id = f.run_id AND p.phase_id = f.phase_id
 WHERE f.run_id = :run_id AND f.finding_id {in :findings}
UNION ALL
SELECT 'action', action_id, proposed_seq FROM oncewire_run_actions
 WHERE run_id = :run_id AND action_id {in :actions}

-- name: update_run_lease
UPDATE oncewire_runs
   SET owner = :owner, fence = :fence, lease_expires_at = :lease_expires_at, updated_at = :now
 WHERE run_id = :run_id

-- name: abandon_run
-- Mark an active run abandoned (no terminal is written); no row changed when it is not active.
UPDATE oncewire_runs
   SET abandoned_at = :now, abandon_reason = :reason, lease_expires_at = NULL, updated_at = :now
 WHERE run_id = :run_id AND finished_at IS NULL AND abandoned_at IS NULL

-- name: set_runs_hidden
-- Each run's hidden flag, from (run_id, hidden) rows.
WITH v (v_run_id, v_hidden) AS ({values :rows text, boolean})
UPDATE oncewire_runs AS r SET hidden = v.v_hidden
  FROM v
 WHERE r.run_id = v.v_run_id

-- name: held_barrier
SELECT {barrier_columns} FROM oncewire_run_barriers
 WHERE scope = :scope AND state <> 'resolved'

-- name: get_key_pin
SELECT {key_pin_columns} FROM oncewire_run_key_pins WHERE run_id = :run_id

-- name: lock_key_pins
-- Adopters of a key take turns: on PostgreSQL a table lock that conflicts with itself (not with
-- readers), taken in a statement of its own so that the next one sees the pins committed by
-- the adopter it waited for instead of pinning the same runs again.
SELECT 1

-- name: unpinned_keyless_runs
-- Every keyless run without a key pin, locked.
SELECT {run_columns} FROM oncewire_runs AS r
 WHERE chain = 'sha256'
   AND NOT EXISTS (SELECT 1 FROM oncewire_run_key_pins AS p WHERE p.run_id = r.run_id)
 ORDER BY run_id
 {for_update}

-- name: insert_key_pin
INSERT INTO oncewire_run_key_pins ({key_pin_columns})
VALUES (:run_id, :key_id, :head_seq, :head_hash, :mac, :created_at)

-- name: list_runs
-- By run id after after_run_id; a NULL scope and any_status TRUE list every scope and status.
SELECT {run_columns} FROM oncewire_runs
 WHERE run_id > :after_run_id
   AND (CAST(:scope AS TEXT) IS NULL OR scope = :scope)
   AND (:any_status OR status {in :statuses})
 ORDER BY run_id
 LIMIT :limit

-- name: run_events
SELECT {event_columns} FROM oncewire_run_events WHERE run_id = :run_id ORDER BY seq, id

-- name: run_chain
-- The lean read that verification needs.
SELECT id, seq, type, prev_hash, hash, payload FROM oncewire_run_events
 WHERE run_id = :run_id AND seq > :after_seq
 ORDER BY seq, id

-- name: orphan_event_runs
-- Events whose run row does not exist (an edited store), counted per run id.
SELECT e.run_id, COUNT(*) FROM oncewire_run_events AS e
 WHERE NOT EXISTS (SELECT 1 FROM oncewire_runs AS r WHERE r.run_id = e.run_id)
 GROUP BY e.run_id
 ORDER BY e.run_id

-- name: run_phases
SELECT {phase_columns} FROM oncewire_run_phases WHERE run_id = :run_id ORDER BY opened_seq

-- name: run_findings
SELECT {finding_columns} FROM oncewire_run_findings WHERE run_id = :run_id ORDER BY finding_id

-- name: run_actions
SELECT {action_columns} FROM oncewire_run_actions WHERE run_id = :run_id ORDER BY proposed_seq

-- name: expired_runs
-- Active runs whose lease expired before :now or whose owner is known dead, oldest first.
SELECT {run_columns} FROM oncewire_runs
 WHERE finished_at IS NULL AND abandoned_at IS NULL
   AND (lease_expires_at IS NULL OR lease_expires_at < :now OR owner {in :dead_owners})
 ORDER BY created_at, run_id
 LIMIT :limit

-- name: active_run_owners
SELECT DISTINCT owner FROM oncewire_runs
 WHERE finished_at IS NULL AND abandoned_at IS NULL AND owner IS NOT NULL

-- name: branch_runs
-- Every run started on a branch, locked in one order: a revert decides which of them it
-- abandons and hides.
SELECT {run_columns} FROM oncewire_runs
 WHERE scope = :scope AND branch = :branch
 ORDER BY run_id
 {for_update}

-- name: runs_for_turn
-- A NULL turn matches the runs started without one.
SELECT {run_columns} FROM oncewire_runs
 WHERE scope = :scope AND branch = :branch
   AND (turn = :turn OR (turn IS NULL AND CAST(:turn AS TEXT) IS NULL))
 ORDER BY created_at, run_id

-- ---------------------------------------------------------------------------------------------
-- branches, checkpoints, reverts, barriers

-- name: lock_branch
-- Whoever reads a branch inside a transaction may create or replace it (ensure, fork, revert):
-- on PostgreSQL the branch's advisory lock, so that two of them cannot both see it missing.
SELECT 1

-- name: get_branch
SELECT {branch_columns} FROM oncewire_run_branches WHERE scope = :scope AND branch = :branch

-- name: put_branch
-- Insert the branch or replace its view.
INSERT INTO oncewire_run_branches ({branch_columns})
VALUES (:scope, :branch, :parent, :view_json, :created_at)
ON CONFLICT (scope, branch) DO UPDATE SET view = excluded.view

-- name: insert_checkpoint
-- Unless its id exists.
INSERT INTO oncewire_run_checkpoints ({checkpoint_columns})
VALUES (:checkpoint_id, :scope, :branch, :cursor, :view_json, :reason, :metadata_json,
        :created_at)
ON CONFLICT DO NOTHING

-- name: get_checkpoint
SELECT {checkpoint_columns} FROM oncewire_run_checkpoints WHERE checkpoint_id = :checkpoint_id

-- name: list_checkpoints
-- A scope's checkpoints, oldest first (by the cursor they were taken at).
SELECT {checkpoint_columns} FROM oncewire_run_checkpoints
 WHERE scope = :scope
 ORDER BY cursor, created_at, checkpoint_id
 LIMIT :limit

-- name: list_branches
-- A scope's branches, oldest first: each fork names its parent.
SELECT {branch_columns} FROM oncewire_run_branches
 WHERE scope = :scope
 ORDER BY created_at, branch
 LIMIT :limit

-- name: lock_scope
-- On PostgreSQL the scope's exclusive advisory lock: it waits for every append in flight in the
-- scope (so no event commits later under a cursor at or below one read after it) and orders
-- the holders of its barrier.
SELECT 1

-- name: scope_cursor
-- The cursor of the newest event of the scope (NULL when it has none).
SELECT MAX(e.id) FROM oncewire_runs AS r
  JOIN oncewire_run_events AS e ON e.run_id = r.run_id
 WHERE r.scope = :scope

-- name: max_cursor
SELECT MAX(id) FROM oncewire_run_events

-- name: latest_event_in_segment
-- The newest event of one visible segment of a scope: on the branch, after :after and (unless
-- :upto is NULL) at or before :upto.
SELECT {event_columns:e} FROM oncewire_runs AS r
  JOIN oncewire_run_events AS e ON e.run_id = r.run_id
 WHERE r.scope = :scope AND r.branch = :branch AND e.id > :after
   AND (CAST(:upto AS BIGINT) IS NULL OR e.id <= :upto)
 ORDER BY e.id DESC
 LIMIT 1

-- name: insert_revert
INSERT INTO oncewire_run_reverts (scope, branch, checkpoint_id, hidden_after, hidden_upto,
                                  abandoned, created_at)
VALUES (:scope, :branch, :checkpoint_id, :hidden_after, :hidden_upto, :abandoned_json, :now)

-- name: put_barrier
-- Insert the barrier or move its state (the schema holds one held barrier per scope).
INSERT INTO oncewire_run_barriers ({barrier_columns})
VALUES (:scope, :operation_id, :branch, :state, :created_at, :updated_at)
ON CONFLICT (scope, operation_id) DO UPDATE
   SET state = excluded.state, updated_at = excluded.updated_at

-- name: get_barrier
SELECT {barrier_columns} FROM oncewire_run_barriers
 WHERE scope = :scope AND operation_id = :operation_id

-- ---------------------------------------------------------------------------------------------
-- completion deliveries

-- name: insert_delivery
-- Unless its idempotency key exists (the verb then reads the stored one).
INSERT INTO oncewire_run_deliveries ({delivery_columns})
VALUES (:delivery_id, :idempotency_key, :request_digest, :scope, :branch, :turn, :run_id,
        :content, :content_sha256, :manifest_json, :manifest_sha256, :review_status, :status,
        :recovery_json, :owner, :lease_expires_at, :created_at, :published_at)
ON CONFLICT (idempotency_key) DO NOTHING

-- name: delivery_by_key
SELECT {delivery_columns} FROM oncewire_run_deliveries WHERE idempotency_key = :idempotency_key

-- name: get_delivery
SELECT {delivery_columns} FROM oncewire_run_deliveries WHERE delivery_id = :delivery_id

-- name: lock_delivery
-- Publishing and reconciliation decide on its status and lease.
SELECT {delivery_columns} FROM oncewire_run_deliveries WHERE delivery_id = :delivery_id
{for_update}

-- name: settle_delivery
-- Publish a committed delivery; its bytes are never touched.
UPDATE oncewire_run_deliveries
   SET status = 'published', review_status = :review_status, recovery = :recovery_json,
       published_at = :published_at, lease_expires_at = NULL
 WHERE delivery_id = :delivery_id AND status = 'committed'

-- name: committed_deliveries
-- Committed, unpublished deliveries whose owner's lease expired before :now, oldest first.
SELECT {delivery_columns} FROM oncewire_run_deliveries
 WHERE status = 'committed' AND (lease_expires_at IS NULL OR lease_expires_at < :now)
 ORDER BY created_at, delivery_id
 LIMIT :limit

-- ---------------------------------------------------------------------------------------------
-- reconciliation reports

-- name: insert_report
INSERT INTO oncewire_run_reports (pass_id, subject, subject_id, run_id, owner, outcome, status,
                                  reason, error, created_at)
VALUES (:pass_id, :subject, :subject_id, :run_id, :owner, :outcome, :status, :reason, :error,
        :created_at)

-- name: list_reports
-- Newest first; a NULL subject_id lists every subject.
SELECT {report_columns} FROM oncewire_run_reports
 WHERE (CAST(:subject_id AS TEXT) IS NULL OR subject_id = :subject_id)
 ORDER BY id DESC
 LIMIT :limit
