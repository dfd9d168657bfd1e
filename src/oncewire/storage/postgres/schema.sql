-- The current schema, for a fresh install. tests prove the migrations build the same.
-- Payloads and results are canonical JSON *text*: jsonb would re-encode them and lose the exact
-- bytes that the digest covers. Times are seconds since the epoch, as the caller's clock says.
CREATE TABLE oncewire_effects (
    id               BIGSERIAL PRIMARY KEY,
    key              TEXT             NOT NULL UNIQUE,
    kind             TEXT             NOT NULL,
    payload          TEXT             NOT NULL,
    digest           TEXT             NOT NULL,
    state            TEXT             NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'claimed', 'uncertain', 'done', 'rejected',
                                      'dead', 'cancelled')),
    attempts         INTEGER          NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     INTEGER          NOT NULL CHECK (max_attempts >= 1),
    not_before       DOUBLE PRECISION NOT NULL,
    deadline         DOUBLE PRECISION,
    fence            BIGINT           NOT NULL DEFAULT 0 CHECK (fence >= 0),
    lease_owner      TEXT,
    lease_expires_at DOUBLE PRECISION,
    maybe_sent       BOOLEAN          NOT NULL DEFAULT FALSE,
    result           TEXT,
    last_error       TEXT,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL,
    not_sent         INTEGER          NOT NULL DEFAULT 0 CHECK (not_sent >= 0), -- in a row; 0004
    traceparent      TEXT, -- the accepting span's W3C traceparent; 0008
    started_fence    BIGINT           NOT NULL DEFAULT 0 CHECK (started_fence >= 0), -- 0009
    recoveries       INTEGER          NOT NULL DEFAULT 0 CHECK (recoveries >= 0), -- 0009
    CONSTRAINT oncewire_effects_lease_iff_claimed
        CHECK ((state = 'claimed') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT oncewire_effects_result_only_done CHECK (result IS NULL OR state = 'done')
);

CREATE INDEX oncewire_effects_due ON oncewire_effects (not_before, id)
    WHERE state IN ('pending', 'uncertain');

CREATE INDEX oncewire_effects_leases ON oncewire_effects (lease_expires_at)
    WHERE state = 'claimed';

-- Waiting effects an owner died on while their sink ran (0009): claimed first, alone.
CREATE INDEX oncewire_effects_suspects ON oncewire_effects (not_before, id)
    WHERE state IN ('pending', 'uncertain') AND recoveries > 0;

-- Wake idle dispatchers when new work commits (delivered at commit, coalesced per transaction).
CREATE FUNCTION oncewire_notify_effects() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('oncewire_effects', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER oncewire_effects_notify
    AFTER INSERT ON oncewire_effects
    FOR EACH STATEMENT EXECUTE FUNCTION oncewire_notify_effects();

-- The attempt history (0004): one row per attempt closed, written in the transaction that
-- closes it
-- (a settlement, the release of a claim whose owner died or whose lease expired, the cancel
-- of an effect in flight). The fence is unique per claim, so it keys the row and orders an
-- effect's attempts oldest first.
CREATE TABLE oncewire_attempts (
    effect_id   BIGINT           NOT NULL REFERENCES oncewire_effects (id) ON DELETE CASCADE,
    fence       BIGINT           NOT NULL CHECK (fence >= 0),
    attempt     INTEGER          NOT NULL CHECK (attempt >= 0),
    owner       TEXT,
    redelivery  BOOLEAN          NOT NULL DEFAULT FALSE,
    outcome     TEXT             NOT NULL,
    state       TEXT             NOT NULL
                CHECK (state IN ('pending', 'claimed', 'uncertain', 'done', 'rejected',
                                 'dead', 'cancelled')),
    error       TEXT,
    started_at  DOUBLE PRECISION,
    finished_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (effect_id, fence)
);

-- The attempts closed lately, across every effect (the dashboard's chart); 0011.
CREATE INDEX oncewire_attempts_finished ON oncewire_attempts (finished_at);

CREATE TABLE oncewire_receipts (
    key        TEXT PRIMARY KEY,
    digest     TEXT             NOT NULL,
    payload    TEXT             NOT NULL,
    result     TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION
);

CREATE INDEX oncewire_receipts_expiry ON oncewire_receipts (expires_at)
    WHERE expires_at IS NOT NULL;


CREATE TABLE oncewire_inbound (
    id                  BIGSERIAL        PRIMARY KEY,
    platform            TEXT             NOT NULL,
    bot                 TEXT             NOT NULL,
    chat                TEXT             NOT NULL,
    thread              TEXT             NOT NULL DEFAULT '',
    platform_message_id TEXT             NOT NULL,
    payload             TEXT             NOT NULL,
    digest              TEXT             NOT NULL,
    status              TEXT             NOT NULL DEFAULT 'received'
                        CHECK (status IN ('received', 'answering', 'answered', 'delivered',
                                          'quarantined', 'superseded', 'merged')),
    deliveries          INTEGER          NOT NULL DEFAULT 1 CHECK (deliveries >= 1),
    attempts            INTEGER          NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error          TEXT,
    created_at          DOUBLE PRECISION NOT NULL,
    updated_at          DOUBLE PRECISION NOT NULL,
    -- The inbound message whose reply answers a superseded or merged one (0006).
    answered_by         BIGINT           REFERENCES oncewire_inbound (id),
    -- A platform message is admitted once, whatever re-delivers it.
    CONSTRAINT oncewire_inbound_once UNIQUE (platform, bot, chat, thread, platform_message_id),
    CONSTRAINT oncewire_inbound_answered_by
        CHECK ((answered_by IS NULL) = (status NOT IN ('superseded', 'merged')))
);

-- What recovery asks: admitted but unanswered, answered but undelivered.
CREATE INDEX oncewire_inbound_open ON oncewire_inbound (status, id)
    WHERE status IN ('received', 'answering', 'answered');

-- A session's earlier messages, newest first (the gateway's chat history for the model); 0011.
CREATE INDEX oncewire_inbound_session ON oncewire_inbound (platform, bot, chat, thread, id);

-- Each session's oldest message still waiting (the gateway's scheduler); 0013.
CREATE INDEX oncewire_inbound_received ON oncewire_inbound (platform, bot, chat, thread, id)
    WHERE status = 'received';

-- A platform's messages admitted lately (where a Discord backfill starts); 0013.
CREATE INDEX oncewire_inbound_recent ON oncewire_inbound (platform, created_at);

-- Wake a gateway's scheduler when the inbox changes (a message admitted, a session's turn
-- answered or superseded); 0013. Delivered at commit, coalesced per transaction.
CREATE FUNCTION oncewire_notify_inbound() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('oncewire_inbound', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER oncewire_inbound_notify
    AFTER INSERT OR UPDATE OF status ON oncewire_inbound
    FOR EACH STATEMENT EXECUTE FUNCTION oncewire_notify_inbound();

CREATE TABLE oncewire_replies (
    id               BIGSERIAL        PRIMARY KEY,
    inbound_id       BIGINT           NOT NULL UNIQUE REFERENCES oncewire_inbound (id),
    platform         TEXT             NOT NULL,
    bot              TEXT             NOT NULL,
    chat             TEXT             NOT NULL,
    thread           TEXT             NOT NULL DEFAULT '',
    reply_to         TEXT,
    format           TEXT             NOT NULL DEFAULT 'plain',
    cap              INTEGER          NOT NULL CHECK (cap >= 1),
    unit             TEXT             NOT NULL CHECK (unit IN ('utf16', 'codepoints')),
    state            TEXT             NOT NULL DEFAULT 'open'
                     CHECK (state IN ('open', 'committed', 'delivered', 'dead', 'withdrawn')),
    final_text       TEXT,
    plan             TEXT,
    marked           BOOLEAN          NOT NULL DEFAULT FALSE,
    attempts         INTEGER          NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     INTEGER          NOT NULL CHECK (max_attempts >= 1),
    not_before       DOUBLE PRECISION NOT NULL,
    lease_owner      TEXT,
    lease_expires_at DOUBLE PRECISION,
    last_error       TEXT,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL,
    -- The final text and its chunk plan arrive together, and only an open reply lacks them.
    CONSTRAINT oncewire_replies_text_with_plan CHECK ((final_text IS NULL) = (plan IS NULL)),
    CONSTRAINT oncewire_replies_text_unless_open
        CHECK (state IN ('open', 'dead') OR final_text IS NOT NULL)
);

-- What the reply engine looks at: committed replies in due order.
CREATE INDEX oncewire_replies_due ON oncewire_replies (not_before, id)
    WHERE state = 'committed';

-- Wake a reply thread when a reply becomes deliverable by anyone (committed with no lease:
-- committed by a caller that does not deliver it, or given back with a retry time); 0013.
CREATE FUNCTION oncewire_notify_replies() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('oncewire_replies', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER oncewire_replies_notify
    AFTER INSERT OR UPDATE ON oncewire_replies
    FOR EACH ROW WHEN (NEW.state = 'committed' AND NEW.lease_owner IS NULL)
    EXECUTE FUNCTION oncewire_notify_replies();

CREATE TABLE oncewire_reply_ops (
    id          BIGSERIAL        PRIMARY KEY,
    reply_id    BIGINT           NOT NULL REFERENCES oncewire_replies (id),
    seq         INTEGER          NOT NULL,
    slot        INTEGER          NOT NULL CHECK (slot >= -1),
    kind        TEXT             NOT NULL CHECK (kind IN ('send', 'edit', 'delete')),
    body        TEXT             NOT NULL,
    marked      BOOLEAN          NOT NULL DEFAULT FALSE,
    state       TEXT             NOT NULL DEFAULT 'planned'
                CHECK (state IN ('planned', 'in_flight', 'acked', 'refused', 'ambiguous',
                                 'gone')),
    message_id  TEXT,
    retry_after DOUBLE PRECISION,
    error       TEXT,
    created_at  DOUBLE PRECISION NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL,
    CONSTRAINT oncewire_reply_ops_seq UNIQUE (reply_id, seq),
    -- An acknowledged operation names the platform message it made or touched.
    CONSTRAINT oncewire_reply_ops_acked_has_id CHECK (state <> 'acked' OR message_id IS NOT NULL),
    -- Edits and deletes always target a recorded message.
    CONSTRAINT oncewire_reply_ops_target CHECK (kind = 'send' OR message_id IS NOT NULL)
);

-- One visible message per slot: a slot is acknowledged as sent at most once while its message
-- exists (a send whose message someone else deleted is 'gone').
CREATE UNIQUE INDEX oncewire_reply_ops_one_send ON oncewire_reply_ops (reply_id, slot)
    WHERE kind = 'send' AND state = 'acked';


-- Runs: an event-sourced run ledger with a hash-chained history, branches, barriers, an
-- action ledger, completion deliveries and reconciliation reports. The invariants are held
-- here, by constraints and triggers, under concurrent transactions at READ COMMITTED.

-- Locks the run ledger takes beyond row locks, as transaction-scoped advisory locks:
-- a scope's lock is shared by every event appended in it and exclusive while a barrier is
-- taken or a checkpoint reads the scope's cursor; a branch's lock orders its creation,
-- forks and reverts. Advisory locks are database-wide: their keys include the schema, so that
-- stores in different schemas of one database do not wait for each other.
CREATE FUNCTION oncewire_run_scope_lock(lock_scope TEXT, exclusive BOOLEAN) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF exclusive THEN
        PERFORM pg_advisory_xact_lock(
            1920298611, hashtext(current_schema() || chr(31) || lock_scope));
    ELSE
        PERFORM pg_advisory_xact_lock_shared(
            1920298611, hashtext(current_schema() || chr(31) || lock_scope));
    END IF;
END;
$$;

CREATE FUNCTION oncewire_run_branch_lock(lock_scope TEXT, lock_branch TEXT) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(
        1651663214, hashtext(current_schema() || chr(31) || lock_scope || chr(31) || lock_branch));
END;
$$;

-- The run row: a projection of the run's events plus its lease (which is not history).
-- `state` is the compact folded state; the head event commits to its digest.
CREATE TABLE oncewire_runs (
    run_id           TEXT COLLATE "C" PRIMARY KEY, -- ordered bytewise, as on SQLite
    scope            TEXT             NOT NULL,
    branch           TEXT             NOT NULL,
    turn             TEXT,
    workflow         TEXT             NOT NULL,
    chain            TEXT             NOT NULL CHECK (chain IN ('sha256', 'hmac-sha256')),
    status           TEXT             NOT NULL,
    terminal_reason  TEXT,
    state            TEXT             NOT NULL,
    head_seq         BIGINT           NOT NULL DEFAULT 0 CHECK (head_seq >= 0),
    head_hash        TEXT             NOT NULL,
    owner            TEXT,
    fence            BIGINT           NOT NULL DEFAULT 1 CHECK (fence >= 1),
    lease_expires_at DOUBLE PRECISION,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL,
    finished_at      DOUBLE PRECISION,
    abandoned_at     DOUBLE PRECISION,
    abandon_reason   TEXT,
    hidden           BOOLEAN          NOT NULL DEFAULT FALSE,
    key_id           TEXT, -- the HMAC key's fingerprint (never the key); 0005
    -- A run is finished exactly when it carries a terminal reason, and never both finished
    -- and abandoned.
    CONSTRAINT oncewire_runs_finished_with_reason
        CHECK ((finished_at IS NULL) = (terminal_reason IS NULL)),
    CONSTRAINT oncewire_runs_finished_or_abandoned
        CHECK (finished_at IS NULL OR abandoned_at IS NULL),
    CONSTRAINT oncewire_runs_abandoned_with_reason
        CHECK ((abandoned_at IS NULL) = (abandon_reason IS NULL))
);

-- At most one active run per branch.
CREATE UNIQUE INDEX oncewire_runs_one_active_per_branch ON oncewire_runs (scope, branch)
    WHERE finished_at IS NULL AND abandoned_at IS NULL;

-- A branch's history is found through its runs (written once per run, not once per event).
CREATE INDEX oncewire_runs_branch ON oncewire_runs (scope, branch, turn);

-- The history. `id` is the scope-wide cursor: it is drawn by the append trigger once the
-- scope's lock is held, so that a cursor read under the exclusive lock is never overtaken by
-- an event that commits later with a smaller id. `seq` orders one run's chain.
CREATE SEQUENCE oncewire_run_events_id_seq;

-- Keyless runs that a key was adopted over (`oncewire runs adopt-key`): each pinned at its
-- head, the pin MACed with the key, so that a ledger opened with the key still verifies them
-- (with the keyless algorithm) and nobody without the key can add or re-hash one.
CREATE TABLE oncewire_run_key_pins (
    run_id     TEXT COLLATE "C" PRIMARY KEY REFERENCES oncewire_runs (run_id),
    key_id     TEXT             NOT NULL,
    head_seq   BIGINT           NOT NULL,
    head_hash  TEXT             NOT NULL,
    mac        TEXT             NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE oncewire_run_events (
    id              BIGINT           PRIMARY KEY,
    run_id          TEXT COLLATE "C" NOT NULL REFERENCES oncewire_runs (run_id),
    scope           TEXT             NOT NULL,
    branch          TEXT             NOT NULL,
    seq             BIGINT           NOT NULL CHECK (seq >= 1),
    type            TEXT             NOT NULL,
    idempotency_key TEXT             NOT NULL,
    request_digest  TEXT             NOT NULL,
    terminal        BOOLEAN          NOT NULL DEFAULT FALSE,
    payload         TEXT             NOT NULL,
    prev_hash       TEXT             NOT NULL,
    hash            TEXT             NOT NULL,
    at              DOUBLE PRECISION NOT NULL,
    CONSTRAINT oncewire_run_events_seq UNIQUE (run_id, seq),
    CONSTRAINT oncewire_run_events_key UNIQUE (run_id, idempotency_key)
);

ALTER SEQUENCE oncewire_run_events_id_seq OWNED BY oncewire_run_events.id;

-- At most one terminal event per run.
CREATE UNIQUE INDEX oncewire_run_events_one_terminal ON oncewire_run_events (run_id)
    WHERE terminal;

-- Phases (reviews, repairs): at most one open per run.
CREATE TABLE oncewire_run_phases (
    run_id        TEXT COLLATE "C" NOT NULL REFERENCES oncewire_runs (run_id),
    phase_id      TEXT             NOT NULL,
    kind          TEXT             NOT NULL,
    status        TEXT             NOT NULL,
    verdict       TEXT,
    candidate_id  TEXT,
    body          TEXT             NOT NULL,
    result        TEXT,
    actions_bound BOOLEAN          NOT NULL DEFAULT FALSE,
    opened_seq    BIGINT           NOT NULL,
    closed_seq    BIGINT,
    opened_at     DOUBLE PRECISION NOT NULL,
    closed_at     DOUBLE PRECISION,
    PRIMARY KEY (run_id, phase_id),
    CONSTRAINT oncewire_run_phases_closed CHECK ((status = 'open') = (closed_seq IS NULL))
);

CREATE UNIQUE INDEX oncewire_run_phases_one_open ON oncewire_run_phases (run_id)
    WHERE status = 'open';

CREATE TABLE oncewire_run_findings (
    run_id       TEXT COLLATE "C" NOT NULL REFERENCES oncewire_runs (run_id),
    finding_id   TEXT COLLATE "C" NOT NULL,
    phase_id     TEXT NOT NULL,
    candidate_id TEXT NOT NULL,
    severity     TEXT NOT NULL,
    body         TEXT NOT NULL,
    PRIMARY KEY (run_id, finding_id)
);

-- Tool calls made inside a run: proposed before they run, resolved after.
CREATE TABLE oncewire_run_actions (
    run_id            TEXT COLLATE "C" NOT NULL REFERENCES oncewire_runs (run_id),
    action_id         TEXT   NOT NULL,
    phase_id          TEXT,
    kind              TEXT   NOT NULL,
    arguments         TEXT   NOT NULL,
    arguments_digest  TEXT   NOT NULL,
    side_effect_class TEXT   NOT NULL,
    resource_keys     TEXT   NOT NULL,
    effect_key        TEXT,
    status            TEXT   NOT NULL,
    result            TEXT,
    proposed_seq      BIGINT NOT NULL,
    resolved_seq      BIGINT,
    PRIMARY KEY (run_id, action_id),
    CONSTRAINT oncewire_run_actions_resolved CHECK ((status = 'proposed') = (resolved_seq IS NULL))
);

-- Branches of a scope. `view` lists the visible segments [branch, after_id, upto_id|null].
CREATE TABLE oncewire_run_branches (
    scope      TEXT             NOT NULL,
    branch     TEXT             NOT NULL,
    parent     TEXT,
    view       TEXT             NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (scope, branch)
);

-- Cursors into a scope's history, with the branch's view at that cursor.
CREATE TABLE oncewire_run_checkpoints (
    checkpoint_id TEXT             PRIMARY KEY,
    scope         TEXT             NOT NULL,
    branch        TEXT             NOT NULL,
    cursor        BIGINT           NOT NULL CHECK (cursor >= 0),
    view          TEXT             NOT NULL,
    reason        TEXT             NOT NULL,
    metadata      TEXT             NOT NULL,
    created_at    DOUBLE PRECISION NOT NULL
);

-- Reverts: a branch shown again up to a checkpoint; the tail stays stored.
CREATE TABLE oncewire_run_reverts (
    id            BIGSERIAL        PRIMARY KEY,
    scope         TEXT             NOT NULL,
    branch        TEXT             NOT NULL,
    checkpoint_id TEXT             NOT NULL REFERENCES oncewire_run_checkpoints (checkpoint_id),
    hidden_after  BIGINT           NOT NULL,
    hidden_upto   BIGINT           NOT NULL,
    abandoned     TEXT             NOT NULL,
    created_at    DOUBLE PRECISION NOT NULL
);

-- A revert barrier: a deliberate hold on a scope, with states.
CREATE TABLE oncewire_run_barriers (
    scope        TEXT             NOT NULL,
    operation_id TEXT             NOT NULL,
    branch       TEXT,
    state        TEXT             NOT NULL
                 CHECK (state IN ('reverting', 'recovery_required', 'resolved')),
    created_at   DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (scope, operation_id)
);

CREATE UNIQUE INDEX oncewire_run_barriers_one_held ON oncewire_run_barriers (scope)
    WHERE state <> 'resolved';

-- Taking or moving a held barrier waits for every append in flight in its scope, and every
-- later append waits for it: an append either precedes the barrier or sees it.
CREATE FUNCTION oncewire_run_barriers_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state <> 'resolved' THEN
        PERFORM oncewire_run_scope_lock(NEW.scope, TRUE);
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER oncewire_run_barriers_hold BEFORE INSERT OR UPDATE ON oncewire_run_barriers
    FOR EACH ROW EXECUTE FUNCTION oncewire_run_barriers_hold();

-- An event extends its run's head (the run row is locked, so appends to one run are serial),
-- never ends a run while a phase is open, and, while a barrier holds the scope, is only late
-- evidence of an admitted action or the release of a run a revert hid.
CREATE FUNCTION oncewire_run_events_append() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    head RECORD;
BEGIN
    SELECT scope, branch, head_seq, head_hash INTO head
        FROM oncewire_runs WHERE run_id = NEW.run_id FOR UPDATE;
    IF NOT FOUND OR head.head_seq + 1 <> NEW.seq OR head.head_hash <> NEW.prev_hash
            OR head.scope <> NEW.scope OR head.branch <> NEW.branch THEN
        RAISE EXCEPTION 'oncewire: an event that does not extend the run''s head'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.terminal AND EXISTS (
            SELECT 1 FROM oncewire_run_phases WHERE run_id = NEW.run_id AND status = 'open') THEN
        RAISE EXCEPTION 'oncewire: a terminal event while a phase is open'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    PERFORM oncewire_run_scope_lock(NEW.scope, FALSE);
    IF NEW.type NOT IN ('action_resolved', 'run_abandoned') AND EXISTS (
            SELECT 1 FROM oncewire_run_barriers
            WHERE scope = NEW.scope AND state <> 'resolved') THEN
        RAISE EXCEPTION 'oncewire: a revert barrier holds this scope'
            USING ERRCODE = 'integrity_constraint_violation',
                  CONSTRAINT = 'oncewire_run_barriers_one_held';
    END IF;
    NEW.id := nextval('oncewire_run_events_id_seq');
    RETURN NEW;
END;
$$;

CREATE TRIGGER oncewire_run_events_append BEFORE INSERT ON oncewire_run_events
    FOR EACH ROW EXECUTE FUNCTION oncewire_run_events_append();

-- History is append-only.
CREATE FUNCTION oncewire_run_events_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'oncewire: run events are append-only'
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$;

CREATE TRIGGER oncewire_run_events_no_update BEFORE UPDATE ON oncewire_run_events
    FOR EACH ROW EXECUTE FUNCTION oncewire_run_events_refuse();

CREATE TRIGGER oncewire_run_events_no_delete BEFORE DELETE ON oncewire_run_events
    FOR EACH ROW EXECUTE FUNCTION oncewire_run_events_refuse();

CREATE TRIGGER oncewire_run_events_no_truncate BEFORE TRUNCATE ON oncewire_run_events
    FOR EACH STATEMENT EXECUTE FUNCTION oncewire_run_events_refuse();

-- Completion deliveries: the final message and its manifest, committed together, published
-- after. Recovery may settle status, review status and the recovery note, never the bytes.
CREATE TABLE oncewire_run_deliveries (
    delivery_id      TEXT COLLATE "C" PRIMARY KEY,
    idempotency_key  TEXT             NOT NULL UNIQUE,
    request_digest   TEXT             NOT NULL,
    scope            TEXT             NOT NULL,
    branch           TEXT             NOT NULL,
    turn             TEXT,
    run_id           TEXT COLLATE "C",
    content          TEXT             NOT NULL,
    content_sha256   TEXT             NOT NULL,
    manifest         TEXT             NOT NULL,
    manifest_sha256  TEXT             NOT NULL,
    review_status    TEXT             NOT NULL,
    status           TEXT             NOT NULL CHECK (status IN ('committed', 'published')),
    recovery         TEXT,
    owner            TEXT,
    lease_expires_at DOUBLE PRECISION,
    created_at       DOUBLE PRECISION NOT NULL,
    published_at     DOUBLE PRECISION,
    CONSTRAINT oncewire_run_deliveries_published
        CHECK ((status = 'published') = (published_at IS NOT NULL))
);

CREATE INDEX oncewire_run_deliveries_committed ON oncewire_run_deliveries (created_at)
    WHERE status = 'committed';

CREATE FUNCTION oncewire_run_deliveries_bytes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.content IS DISTINCT FROM OLD.content OR NEW.manifest IS DISTINCT FROM OLD.manifest
            OR NEW.content_sha256 IS DISTINCT FROM OLD.content_sha256
            OR NEW.manifest_sha256 IS DISTINCT FROM OLD.manifest_sha256 THEN
        RAISE EXCEPTION 'oncewire: a delivery''s message and manifest never change'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER oncewire_run_deliveries_bytes BEFORE UPDATE ON oncewire_run_deliveries
    FOR EACH ROW EXECUTE FUNCTION oncewire_run_deliveries_bytes();

-- What each reconciliation did to each row it looked at.
CREATE TABLE oncewire_run_reports (
    id          BIGSERIAL        PRIMARY KEY,
    pass_id     TEXT             NOT NULL,
    subject     TEXT             NOT NULL CHECK (subject IN ('run', 'delivery')),
    subject_id  TEXT             NOT NULL,
    run_id      TEXT COLLATE "C",
    owner       TEXT             NOT NULL,
    outcome     TEXT             NOT NULL,
    status      TEXT,
    reason      TEXT,
    error       TEXT,
    created_at  DOUBLE PRECISION NOT NULL
);

-- Named leases: one holder at a time for something only one process may do (a chat gateway
-- polls a bot from one process: bot:{platform}:{bot}). fence grows by one at every change of
-- holder, so a holder that lost the lease is refused by its fence, never by its clock. A lease
-- given back keeps its row and its fence, with no owner.
CREATE TABLE oncewire_leases (
    name       TEXT PRIMARY KEY,
    owner      TEXT,
    fence      BIGINT           NOT NULL CHECK (fence >= 1),
    expires_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);

-- LangGraph checkpoints (oncewire.langgraph.OncewireSaver), in the ledger's own store so that a
-- checkpoint, its writes and the caller's rows can commit in one transaction.
--
-- Each thread's history is a hash chain (oncewire_lg_chain): one entry per checkpoint put, per
-- batch of writes and per erasure (prune, delete_for_runs), each hashing the one before it and a
-- material that names the digests of the rows it wrote. A checkpoint or write row points at the
-- entry that wrote it (seq). Ids compare bytewise (COLLATE "C"): the newest checkpoint is the
-- greatest id, as on SQLite. oncewire_lg_threads holds each chain's head. Writing to a thread
-- needs its lease (oncewire_leases, name "langgraph.thread:" || thread_id) under its fence.
CREATE TABLE oncewire_lg_threads (
    thread_id  TEXT COLLATE "C" PRIMARY KEY,
    chain      TEXT NOT NULL CHECK (chain IN ('sha256', 'hmac-sha256')),
    key_id     TEXT,
    head_seq   BIGINT NOT NULL CHECK (head_seq >= 1),
    head_hash  TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE oncewire_lg_chain (
    thread_id  TEXT COLLATE "C" NOT NULL,
    seq        BIGINT NOT NULL CHECK (seq >= 1),
    kind       TEXT NOT NULL CHECK (kind IN ('checkpoint', 'writes', 'erase')),
    material   TEXT NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (thread_id, seq)
);

CREATE TABLE oncewire_lg_checkpoints (
    thread_id            TEXT COLLATE "C" NOT NULL,
    checkpoint_ns        TEXT COLLATE "C" NOT NULL,
    checkpoint_id        TEXT COLLATE "C" NOT NULL,
    parent_checkpoint_id TEXT,
    seq                  BIGINT NOT NULL,
    type                 TEXT NOT NULL,
    checkpoint           BYTEA NOT NULL,
    metadata_type        TEXT NOT NULL,
    metadata             BYTEA NOT NULL,
    run_id               TEXT,
    created_at           DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX oncewire_lg_checkpoints_run ON oncewire_lg_checkpoints (run_id)
    WHERE run_id IS NOT NULL;

CREATE TABLE oncewire_lg_writes (
    thread_id     TEXT COLLATE "C" NOT NULL,
    checkpoint_ns TEXT COLLATE "C" NOT NULL,
    checkpoint_id TEXT COLLATE "C" NOT NULL,
    task_id       TEXT COLLATE "C" NOT NULL,
    idx           BIGINT NOT NULL,
    channel       TEXT NOT NULL,
    type          TEXT NOT NULL,
    value         BYTEA NOT NULL,
    task_path     TEXT NOT NULL,
    seq           BIGINT NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);

-- The runs durable_invoke accepted: the input is recorded before the first node runs, so a run
-- whose process died is listed (oncewire langgraph pending) and resumed, never lost.
CREATE TABLE oncewire_lg_runs (
    thread_id  TEXT COLLATE "C" PRIMARY KEY,
    state      TEXT NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    graph      TEXT,
    input_type TEXT NOT NULL,
    input      BYTEA NOT NULL,
    config     TEXT NOT NULL,
    owner      TEXT NOT NULL,
    attempts   BIGINT NOT NULL CHECK (attempts >= 1),
    error      TEXT,
    started_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX oncewire_lg_runs_state ON oncewire_lg_runs (state, thread_id);

-- OpenAI Agents SDK runs (oncewire.agents.run): each model response under (run_key, step),
-- recorded before anything acts on it (migration 0014).
CREATE TABLE oncewire_agent_steps (
    run_key        TEXT NOT NULL,
    step           INTEGER NOT NULL CHECK (step >= 0),
    request_digest TEXT NOT NULL,
    response       TEXT NOT NULL,
    created_at     DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (run_key, step)
);

-- The OpenAI Agents SDK's sessions (oncewire.agents.OncewireSession): each session's items
-- in insertion order, numbered after the session's last_seq under its row's lock; 0015.
CREATE TABLE oncewire_agents_sessions (
    session_id TEXT COLLATE "C" PRIMARY KEY,
    last_seq   BIGINT NOT NULL CHECK (last_seq >= 0),
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE oncewire_agents_items (
    session_id TEXT COLLATE "C" NOT NULL,
    seq        BIGINT NOT NULL CHECK (seq >= 1),
    item       TEXT NOT NULL, -- canonical JSON
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (session_id, seq)
);
