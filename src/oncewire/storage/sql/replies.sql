-- Inbound messages (oncewire_inbound), reply records (oncewire_replies) and their wire
-- operations (oncewire_reply_ops), written once for every dialect; see
-- oncewire/storage/sql/__init__.py for the rules they are rendered by.

-- ---------------------------------------------------------------------------------------------
-- inbound

-- name: admit_inbound
-- Admit a message under its platform identity; no row when it was admitted before.
INSERT INTO oncewire_inbound (platform, bot, chat, thread, platform_message_id, payload, digest,
                              created_at, updated_at)
VALUES (:platform, :bot, :chat, :thread, :platform_message_id, :payload, :digest, :now, :now)
ON CONFLICT DO NOTHING
RETURNING {inbound_columns}

-- name: redeliver_inbound
-- The platform delivered an admitted message again: count it, keep everything else.
UPDATE oncewire_inbound SET deliveries = deliveries + 1, updated_at = :now
 WHERE platform = :platform AND bot = :bot AND chat = :chat AND thread = :thread
   AND platform_message_id = :platform_message_id
RETURNING {inbound_columns}

-- name: get_inbound
SELECT {inbound_columns} FROM oncewire_inbound WHERE id = :inbound_id

-- name: inbound_exists
SELECT 1 FROM oncewire_inbound WHERE id = :inbound_id

-- name: list_inbound
-- Oldest first after after_id; any_status TRUE lists every status.
SELECT {inbound_columns} FROM oncewire_inbound
 WHERE id > :after_id AND (:any_status OR status {in :statuses})
 ORDER BY id
 LIMIT :limit

-- name: queued_inbound
-- Each session's oldest message still waiting (received), of the platforms given, oldest first:
-- received messages are read in id order, each proven its session's first by one probe of
-- oncewire_inbound_received, until limit are found. Handled messages are never read, however
-- long the inbox's history.
SELECT {inbound_columns:i} FROM oncewire_inbound i
 WHERE i.status = 'received' AND i.platform {in :platforms}
   AND NOT EXISTS (SELECT 1 FROM oncewire_inbound o
                    WHERE o.status = 'received' AND o.platform = i.platform AND o.bot = i.bot
                      AND o.chat = i.chat AND o.thread = i.thread AND o.id < i.id)
 ORDER BY i.id
 LIMIT :limit

-- name: newest_inbound_ids
-- Per channel (a thread's own, else the chat's) of one platform, the newest message id among
-- the messages admitted since since whose ids are numbers, compared as numbers (by length, then
-- as text, leading zeros taken off); read through oncewire_inbound_recent.
SELECT channel, message_id FROM (
    SELECT CASE WHEN thread <> '' THEN thread ELSE chat END AS channel,
           LTRIM(platform_message_id, '0') AS message_id,
           ROW_NUMBER() OVER (
               PARTITION BY CASE WHEN thread <> '' THEN thread ELSE chat END
               ORDER BY LENGTH(LTRIM(platform_message_id, '0')) DESC,
                        LTRIM(platform_message_id, '0') DESC
           ) AS newest
      FROM oncewire_inbound
     WHERE platform = :platform AND created_at >= :since
       AND LTRIM(platform_message_id, '0123456789') = ''
) ranked
 WHERE newest = 1

-- name: start_inbound
-- One more attempt at answering; a received message becomes answering, any other keeps its
-- status.
UPDATE oncewire_inbound
   SET attempts = attempts + 1, updated_at = :now,
       status = CASE WHEN status = 'received' THEN 'answering' ELSE status END
 WHERE id = :inbound_id
RETURNING {inbound_columns}

-- name: quarantine_inbound
UPDATE oncewire_inbound SET status = 'quarantined', last_error = :reason, updated_at = :now
 WHERE id = :inbound_id
RETURNING {inbound_columns}

-- name: link_inbound
-- Superseded (from received, or answering when from_answering) or merged (from received): the
-- message is answered by another one's reply. No row when its status does not allow it.
UPDATE oncewire_inbound SET status = :status, answered_by = :answered_by, updated_at = :now
 WHERE id = :inbound_id
   AND (status = 'received' OR (status = 'answering' AND :from_answering))
RETURNING {inbound_columns}

-- name: inbound_answering
-- A reply record was opened for a message nobody had started answering.
UPDATE oncewire_inbound SET status = 'answering', updated_at = :now
 WHERE id = :inbound_id AND status = 'received'

-- name: inbound_answered
-- Its reply's text is committed (a quarantined or delivered message keeps its status).
UPDATE oncewire_inbound SET status = 'answered', updated_at = :now
 WHERE id = :inbound_id AND status IN ('received', 'answering')

-- name: inbound_delivered
-- Its reply is delivered; a quarantined message keeps its status (its reply says it was set
-- aside).
UPDATE oncewire_inbound SET status = 'delivered', updated_at = :now
 WHERE id = :inbound_id AND status <> 'quarantined'

-- ---------------------------------------------------------------------------------------------
-- reply records

-- name: insert_reply
-- Open the inbound's one reply record unless it has one already.
INSERT INTO oncewire_replies (inbound_id, platform, bot, chat, thread, reply_to, format, cap,
                              unit, max_attempts, not_before, created_at, updated_at)
VALUES (:inbound_id, :platform, :bot, :chat, :thread, :reply_to, :format, :cap, :unit,
        :max_attempts, :now, :now, :now)
ON CONFLICT (inbound_id) DO NOTHING

-- name: commit_reply
-- Commit the final text and its plan on a reply still open; no row when it was committed (or
-- finished) before.
UPDATE oncewire_replies
   SET state = 'committed', final_text = :final_text, plan = :plan, not_before = :now,
       updated_at = :now
 WHERE inbound_id = :inbound_id AND state = 'open'
RETURNING {reply_columns}

-- name: withdraw_reply
-- Withdraw a reply still open: an empty text and a plan with no chunk, committed so that the
-- delivery deletes its previews; no row when it was committed (or finished) before.
UPDATE oncewire_replies
   SET state = 'committed', final_text = '', plan = :plan, not_before = :now, updated_at = :now
 WHERE inbound_id = :inbound_id AND state = 'open'
RETURNING {reply_columns}

-- name: get_reply
SELECT {reply_columns} FROM oncewire_replies WHERE id = :reply_id

-- name: reply_for_inbound
SELECT {reply_columns} FROM oncewire_replies WHERE inbound_id = :inbound_id

-- name: session_history
-- The session's messages before before_id whose status is in statuses, newest first, each with
-- its reply's state and final text (NULL: no reply). The session is given as values, not
-- joined from before_id's row: so the read walks its index backwards from before_id and stops
-- after limit rows, however long the chat.
SELECT {inbound_columns:i}, r.state, r.final_text
  FROM oncewire_inbound i
  LEFT JOIN oncewire_replies r ON r.inbound_id = i.id
 WHERE i.platform = :platform AND i.bot = :bot AND i.chat = :chat AND i.thread = :thread
   AND i.id < :before_id AND i.status {in :statuses}
 ORDER BY i.id DESC
 LIMIT :limit

-- name: list_replies
-- Oldest first after after_id; any_state TRUE lists every state.
SELECT {reply_columns} FROM oncewire_replies
 WHERE id > :after_id AND (:any_state OR state {in :states})
 ORDER BY id
 LIMIT :limit

-- name: list_due_replies
-- list_replies restricted to the replies due by due_before, soonest first.
SELECT {reply_columns} FROM oncewire_replies
 WHERE id > :after_id AND (:any_state OR state {in :states}) AND not_before <= :due_before
 ORDER BY not_before, id
 LIMIT :limit

-- name: deliverable_replies
-- Committed replies of the platforms given whose time has come and that nobody holds (no
-- lease, or one run out), soonest first (oncewire_replies_due: delivered replies are never
-- read).
SELECT {reply_columns} FROM oncewire_replies
 WHERE state = 'committed' AND not_before <= :now AND platform {in :platforms}
   AND (lease_owner IS NULL OR lease_expires_at < :now)
 ORDER BY not_before, id
 LIMIT :limit

-- name: next_reply_due
-- When the next of them becomes deliverable: its time, or its lease's end when that is later.
SELECT MIN(CASE WHEN lease_owner IS NOT NULL AND lease_expires_at > not_before
                THEN lease_expires_at ELSE not_before END)
  FROM oncewire_replies
 WHERE state = 'committed' AND platform {in :platforms}

-- name: count_replies
SELECT state, COUNT(*) FROM oncewire_replies GROUP BY state

-- name: claim_reply
-- Lease an unfinished reply to owner unless another live owner holds it (an owner named in
-- dead is known to be gone: its lease is taken over before it expires).
UPDATE oncewire_replies
   SET lease_owner = :owner, lease_expires_at = :expires_at, updated_at = :now
 WHERE id = :reply_id
   AND (lease_owner IS NULL OR lease_owner = :owner OR lease_expires_at < :now
        OR lease_owner {in :dead})
   AND state IN ('open', 'committed')
RETURNING {reply_columns}

-- name: release_reply
-- Give a lease back (only its owner can); a NULL not_before or last_error keeps the stored one.
UPDATE oncewire_replies
   SET lease_owner = NULL, lease_expires_at = NULL,
       not_before = COALESCE(:not_before, not_before),
       last_error = COALESCE(:last_error, last_error), updated_at = :now
 WHERE id = :reply_id AND lease_owner = :owner

-- name: mark_reply
-- The reply carries the resend marker from now on.
UPDATE oncewire_replies SET marked = TRUE, updated_at = :now WHERE id = :reply_id

-- name: finish_reply
UPDATE oncewire_replies
   SET state = :state, last_error = COALESCE(:last_error, last_error),
       lease_owner = NULL, lease_expires_at = NULL, updated_at = :now
 WHERE id = :reply_id
RETURNING {reply_columns}

-- name: lease_reply_for_op
-- Take or renew the reply's lease for a wire operation (refused while another live owner holds
-- it or once it finished); marked only ever goes from FALSE to TRUE.
UPDATE oncewire_replies
   SET lease_owner = :owner, lease_expires_at = :expires_at, marked = (marked OR :marked),
       updated_at = :now
 WHERE id = :reply_id
   AND (lease_owner IS NULL OR lease_owner = :owner OR lease_expires_at < :now)
   AND state IN ('open', 'committed')

-- name: count_reply_attempt
UPDATE oncewire_replies
   SET attempts = attempts + 1, last_error = COALESCE(:error, last_error), updated_at = :now
 WHERE id = :reply_id

-- ---------------------------------------------------------------------------------------------
-- wire operations

-- name: reply_ops
SELECT {op_columns} FROM oncewire_reply_ops WHERE reply_id = :reply_id ORDER BY seq

-- name: next_op_seq
SELECT COALESCE(MAX(seq), 0) + 1 FROM oncewire_reply_ops WHERE reply_id = :reply_id

-- name: acked_send_slots
-- The slots a stream preview already sent (they will be edited, not sent again).
SELECT slot FROM oncewire_reply_ops
 WHERE reply_id = :reply_id AND kind = 'send' AND state = 'acked'

-- name: plan_send
INSERT INTO oncewire_reply_ops (reply_id, seq, slot, kind, body, created_at, updated_at)
VALUES (:reply_id, :seq, :slot, 'send', :body, :now, :now)

-- name: settle_op
-- An operation in flight turned out acknowledged under message_id (read back from the
-- platform before the next operation starts).
UPDATE oncewire_reply_ops SET state = 'acked', message_id = :message_id, updated_at = :now
 WHERE id = :op_id AND state = 'in_flight'

-- name: start_planned_op
-- Put the oldest planned operation of this slot and kind in flight, if there is one.
UPDATE oncewire_reply_ops
   SET state = 'in_flight', body = :body, marked = :marked, message_id = :message_id,
       updated_at = :now
 WHERE id = (SELECT id FROM oncewire_reply_ops
              WHERE reply_id = :reply_id AND slot = :slot AND kind = :kind AND state = 'planned'
              ORDER BY seq
              LIMIT 1)
RETURNING {op_columns}

-- name: insert_op
-- A new operation, in flight from the start.
INSERT INTO oncewire_reply_ops (reply_id, seq, slot, kind, body, marked, state, message_id,
                                created_at, updated_at)
VALUES (:reply_id, :seq, :slot, :kind, :body, :marked, 'in_flight', :message_id, :now, :now)
RETURNING {op_columns}

-- name: send_gone
-- Someone else deleted the message a send made: that send no longer shows anything, and the
-- slot may be acknowledged as sent again.
UPDATE oncewire_reply_ops SET state = 'gone', updated_at = :now
 WHERE reply_id = :reply_id AND kind = 'send' AND state = 'acked' AND message_id = :message_id

-- name: end_op
-- Record the outcome of an operation in flight; no row when it is not in flight.
UPDATE oncewire_reply_ops
   SET state = :state, message_id = COALESCE(:message_id, message_id),
       retry_after = :retry_after, error = :error, updated_at = :now
 WHERE id = :op_id AND state = 'in_flight'
RETURNING {op_columns}
