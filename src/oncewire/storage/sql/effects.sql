-- The outbox's statements (oncewire_effects and its attempt history), written once for every
-- dialect; see oncewire/storage/sql/__init__.py for the rules they are rendered by.

-- name: insert_effect
-- Accept an effect unless its key exists; every other column is its default (the verb builds
-- the record instead of reading it back).
INSERT INTO oncewire_effects (key, kind, payload, digest, max_attempts, not_before, deadline,
                              created_at, updated_at, traceparent)
VALUES (:key, :kind, :payload, :digest, :max_attempts, :not_before, :deadline, :now, :now,
        :traceparent)
ON CONFLICT (key) DO NOTHING
RETURNING id

-- name: get_effect
SELECT {effect_columns} FROM oncewire_effects WHERE key = :key

-- name: lock_effect
-- The effect an operator's command is about to change, locked until the command commits.
SELECT {effect_columns} FROM oncewire_effects WHERE key = :key {for_update}

-- name: list_effects
-- Oldest first; after_id and before_id bound the ids (exclusive), the other filters are
-- optional (a NULL kind, any_state TRUE).
SELECT {effect_columns} FROM oncewire_effects
 WHERE id > :after_id
   AND (CAST(:before_id AS BIGINT) IS NULL OR id < :before_id)
   AND (:any_state OR state {in :states})
   AND (CAST(:kind AS TEXT) IS NULL OR kind = :kind)
 ORDER BY id
 LIMIT :limit

-- name: list_effects_newest
-- list_effects, newest first.
SELECT {effect_columns} FROM oncewire_effects
 WHERE id > :after_id
   AND (CAST(:before_id AS BIGINT) IS NULL OR id < :before_id)
   AND (:any_state OR state {in :states})
   AND (CAST(:kind AS TEXT) IS NULL OR kind = :kind)
 ORDER BY id DESC
 LIMIT :limit

-- name: count_effects
SELECT state, COUNT(*) FROM oncewire_effects
 WHERE (CAST(:kind AS TEXT) IS NULL OR kind = :kind)
 GROUP BY state

-- name: record_attempts
-- One attempt-history row per settlement that will apply (its effect still claimed under its
-- fence), read from the claim before the settlement clears its owner. On PostgreSQL the claim
-- stays locked as read until the settlement (a reaper's release waits, then finds it settled).
WITH v (id, fence, attempt, redelivery, outcome, state, error, started_at, finished_at) AS (
    {values :rows bigint, bigint, int, boolean, text, text, text, float8, float8})
INSERT INTO oncewire_attempts ({attempt_columns})
SELECT e.id, CASE WHEN v.attempt > 0 THEN v.attempt ELSE e.attempts END, e.fence,
       e.lease_owner, e.maybe_sent OR v.redelivery, v.outcome, v.state, v.error,
       v.started_at, v.finished_at
  FROM v JOIN oncewire_effects AS e ON e.id = v.id AND e.fence = v.fence
 WHERE e.state = 'claimed'
 {for_update_of:e}
ON CONFLICT (effect_id, fence) DO NOTHING

-- name: settle
-- Apply each settlement whose effect is still claimed under its fence; return which did. A
-- refunded (not-sent) attempt does not count, and not_sent counts them in a row (a charged
-- attempt ends the run). v's columns are named apart from the table's: SQLite's RETURNING
-- cannot name the table by its alias.
WITH v (v_id, v_fence, state, result, last_error, not_before, maybe_sent, refund) AS (
    {values :rows bigint, bigint, text, text, text, float8, boolean, int})
UPDATE oncewire_effects AS e
   SET state = v.state, result = v.result, last_error = v.last_error,
       not_before = COALESCE(v.not_before, e.not_before),
       maybe_sent = e.maybe_sent OR v.maybe_sent,
       attempts = e.attempts - v.refund,
       not_sent = CASE WHEN v.refund = 1 THEN e.not_sent + 1 ELSE 0 END,
       lease_owner = NULL, lease_expires_at = NULL, updated_at = :now
  FROM v
 WHERE e.id = v.v_id AND e.fence = v.v_fence AND e.state = 'claimed'
RETURNING id, fence

-- name: claim
-- Lease up to :limit due effects (of the kinds given, unless any_kind, and of the keys given,
-- unless any_key) to :owner, bumping the fence and the attempt count. Past-deadline effects are
-- not claimed, nor those an owner died on while their sink ran (recoveries > 0): claim_suspect
-- takes those, one at a time. With :mark the claims are recorded as starting (started_fence):
-- their sinks are called as soon as this commits; without it, mark_started must record each one
-- before its sink is called.
UPDATE oncewire_effects
   SET state = 'claimed', attempts = attempts + 1, fence = fence + 1,
       started_fence = CASE WHEN :mark THEN fence + 1 ELSE started_fence END,
       lease_owner = :owner, lease_expires_at = :expires_at, updated_at = :now
 WHERE id IN (SELECT id FROM oncewire_effects
               WHERE state IN ('pending', 'uncertain') AND not_before <= :now AND recoveries = 0
                 AND (deadline IS NULL OR deadline >= :now)
                 AND (:any_kind OR kind {in :kinds}) AND (:any_key OR key {in :keys})
               ORDER BY not_before, id
               LIMIT :limit)
RETURNING id, key, kind, payload, attempts, max_attempts, fence, maybe_sent, deadline, not_sent,
          traceparent, recoveries, started_fence

-- name: claim_suspect
-- Lease the first due effect an owner died on while its sink ran (recoveries > 0), alone and
-- recorded as starting: if it is what kills its process, it takes nothing else down with it.
UPDATE oncewire_effects
   SET state = 'claimed', attempts = attempts + 1, fence = fence + 1, started_fence = fence + 1,
       lease_owner = :owner, lease_expires_at = :expires_at, updated_at = :now
 WHERE id IN (SELECT id FROM oncewire_effects
               WHERE state IN ('pending', 'uncertain') AND recoveries > 0
                 AND not_before <= :now AND (deadline IS NULL OR deadline >= :now)
                 AND (:any_kind OR kind {in :kinds}) AND (:any_key OR key {in :keys})
               ORDER BY not_before, id
               LIMIT 1)
RETURNING id, key, kind, payload, attempts, max_attempts, fence, maybe_sent, deadline, not_sent,
          traceparent, recoveries, started_fence

-- name: mark_started
-- Record that the sinks of the claims (id, fence) still held by :owner are about to be called.
-- Only a claim returned here may have its sink called: one released or cancelled meanwhile is
-- someone else's now.
WITH v (v_id, v_fence) AS ({values :fences bigint, bigint})
UPDATE oncewire_effects AS e
   SET started_fence = e.fence
  FROM v
 WHERE e.id = v.v_id AND e.fence = v.v_fence AND e.state = 'claimed'
   AND e.lease_owner = :owner
RETURNING id

-- name: renew_leases
-- Extend the leases (id, fence) still held by :owner.
WITH v (v_id, v_fence) AS ({values :fences bigint, bigint})
UPDATE oncewire_effects AS e
   SET lease_expires_at = :expires_at, updated_at = :now
  FROM v
 WHERE e.id = v.v_id AND e.fence = v.v_fence AND e.state = 'claimed'
   AND e.lease_owner = :owner
RETURNING id

-- name: lease_holders
SELECT DISTINCT lease_owner FROM oncewire_effects WHERE state = 'claimed'

-- name: record_released
-- The attempt-history rows of the claims release_claims is about to release, written first,
-- while each claim still names its owner (and, on PostgreSQL, locked until the release). Each
-- row's state and error are what the release sets on its effect, decided here only. Only a
-- claim whose sink was recorded as starting (started_fence = fence) may have reached its
-- receiver: it becomes uncertain (its next attempt a redelivery), dead at :max_recoveries or
-- past its deadline. A claim whose sink was never called is 'not_started' and goes back as it
-- was (pending, or uncertain if an earlier attempt may have landed), or dead past its deadline.
INSERT INTO oncewire_attempts ({attempt_columns})
SELECT id, attempts, fence, lease_owner, maybe_sent,
       CASE WHEN started_fence <> fence THEN 'not_started'
            WHEN lease_expires_at < :now THEN 'lease_expired' ELSE 'owner_died' END,
       CASE WHEN deadline IS NOT NULL AND deadline < :now THEN 'dead'
            WHEN started_fence <> fence
                 THEN CASE WHEN maybe_sent THEN 'uncertain' ELSE 'pending' END
            WHEN recoveries + 1 >= :max_recoveries THEN 'dead'
            ELSE 'uncertain' END,
       CASE WHEN started_fence <> fence AND deadline IS NOT NULL AND deadline < :now
                 THEN CASE WHEN maybe_sent
                           THEN 'deadline passed; an earlier attempt may have landed'
                           ELSE 'deadline passed before delivery' END
            WHEN started_fence <> fence
                 THEN 'the claim of ' || lease_owner
                      || ' was released before its sink was called; not an attempt'
            WHEN recoveries + 1 >= :max_recoveries AND lease_expires_at < :now
                 THEN 'its dispatcher died or lost its lease while its sink ran, '
                      || (recoveries + 1) || ' times; the outcome of the last attempt is unknown'
            WHEN recoveries + 1 >= :max_recoveries
                 THEN 'its dispatcher died while its sink ran, ' || (recoveries + 1)
                      || ' times; the outcome of the last attempt is unknown'
            WHEN deadline IS NOT NULL AND deadline < :now
                 THEN 'deadline passed; the outcome of the last attempt is unknown'
            WHEN lease_expires_at < :now
                 THEN 'lease of ' || lease_owner || ' expired during attempt ' || attempts
            ELSE 'owner ' || lease_owner || ' died during attempt ' || attempts END,
       NULL, :now
  FROM oncewire_effects
 WHERE state = 'claimed' AND (lease_expires_at < :now OR lease_owner {in :dead_owners})
 {for_update}
ON CONFLICT (effect_id, fence) DO NOTHING

-- name: release_claims
-- Release the claims record_released wrote an attempt-history row for (and, on PostgreSQL,
-- locked; a claim that started to match between the two statements is left for the next
-- release): each takes the state and the error its row records. A claim whose sink started
-- counts a recovery, not an attempt; one whose sink was never called gives its attempt back.
-- not_before is kept: it was due then, so it goes back to the head of the line.
UPDATE oncewire_effects AS e
   SET state = a.state, last_error = a.error,
       maybe_sent = (e.maybe_sent OR e.started_fence = e.fence),
       recoveries = CASE WHEN e.started_fence = e.fence THEN e.recoveries + 1
                         ELSE e.recoveries END,
       attempts = e.attempts - 1,
       lease_owner = NULL, lease_expires_at = NULL, updated_at = :now
  FROM oncewire_attempts AS a
 WHERE a.effect_id = e.id AND a.fence = e.fence
   AND e.state = 'claimed' AND (e.lease_expires_at < :now OR e.lease_owner {in :dead_owners})

-- name: expire_deadlines
UPDATE oncewire_effects
   SET state = 'dead', updated_at = :now,
       last_error = CASE WHEN maybe_sent THEN 'deadline passed; an earlier attempt may have landed'
                         ELSE 'deadline passed before delivery' END
 WHERE state IN ('pending', 'uncertain') AND deadline IS NOT NULL AND deadline < :now

-- name: backlog
-- What remains for a dispatcher of the kinds given (any kind if any_kind) and of the keys given
-- (any key if any_key). Retrying counts by fence, not attempts: a not-sent attempt gives its
-- charge back but was a claim.
SELECT (SELECT MIN(not_before) FROM oncewire_effects
         WHERE state IN ('pending', 'uncertain') AND (:any_kind OR kind {in :kinds})
           AND (:any_key OR key {in :keys})),
       (SELECT COUNT(*) FROM oncewire_effects
         WHERE state = 'uncertain' AND (:any_kind OR kind {in :kinds})
           AND (:any_key OR key {in :keys})),
       (SELECT COUNT(*) FROM oncewire_effects
         WHERE state = 'claimed' AND (:any_kind OR kind {in :kinds})
           AND (:any_key OR key {in :keys})),
       (SELECT COUNT(*) FROM oncewire_effects
         WHERE state = 'pending' AND fence > 0 AND (:any_kind OR kind {in :kinds})
           AND (:any_key OR key {in :keys})),
       (SELECT MIN(not_before) FROM oncewire_effects
         WHERE (state = 'uncertain' OR (state = 'pending' AND fence > 0))
           AND (:any_kind OR kind {in :kinds})
           AND (:any_key OR key {in :keys}))

-- name: waiting_kinds
SELECT kind, COUNT(*), MIN(created_at) FROM oncewire_effects
 WHERE state IN ('pending', 'uncertain')
 GROUP BY kind

-- name: list_attempts
SELECT {attempt_columns} FROM oncewire_attempts WHERE effect_id = :effect_id ORDER BY fence

-- name: recent_attempts
-- Attempts closed at or after :since, oldest first, across every effect (a dashboard's chart
-- of attempts and redeliveries over time).
SELECT {attempt_columns} FROM oncewire_attempts
 WHERE finished_at >= :since
 ORDER BY finished_at, effect_id, fence
 LIMIT :limit

-- name: record_cancelled
-- The attempt-history row of a claimed effect being cancelled (its attempt may have landed).
INSERT INTO oncewire_attempts ({attempt_columns})
VALUES (:effect_id, :attempt, :fence, :owner, :redelivery, 'cancelled', 'cancelled', :error,
        NULL, :finished_at)
ON CONFLICT (effect_id, fence) DO NOTHING

-- name: cancel_effect
-- An attempt in flight may land: maybe_sent makes a later retry go out as a redelivery.
UPDATE oncewire_effects
   SET state = 'cancelled', last_error = :reason, lease_owner = NULL, lease_expires_at = NULL,
       fence = fence + 1, updated_at = :now, maybe_sent = :maybe_sent
 WHERE id = :id
RETURNING {effect_columns}

-- name: retry_effect
-- A deadline that has passed would kill the retry at once: the operator's retry lifts it. A
-- deadline still ahead stays.
UPDATE oncewire_effects
   SET state = 'pending', attempts = 0, not_sent = 0, recoveries = 0, not_before = :now,
       deadline = CASE WHEN deadline < :now THEN NULL ELSE deadline END,
       last_error = NULL, updated_at = :now
 WHERE id = :id
RETURNING {effect_columns}
