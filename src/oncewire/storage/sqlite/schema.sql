-- The current schema, for a fresh install. tests prove the migrations build the same.
CREATE TABLE oncewire_effects (
    id               INTEGER PRIMARY KEY,
    key              TEXT    NOT NULL UNIQUE,
    kind             TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    digest           TEXT    NOT NULL,
    state            TEXT    NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'claimed', 'uncertain', 'done', 'rejected',
                                      'dead', 'cancelled')),
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 1),
    not_before       REAL    NOT NULL,
    deadline         REAL,
    fence            INTEGER NOT NULL DEFAULT 0 CHECK (fence >= 0),
    lease_owner      TEXT,
    lease_expires_at REAL,
    maybe_sent       INTEGER NOT NULL DEFAULT 0 CHECK (maybe_sent IN (0, 1)),
    result           TEXT,
    last_error       TEXT,
    created_at       REAL    NOT NULL,
    updated_at       REAL    NOT NULL,
    not_sent         INTEGER NOT NULL DEFAULT 0 CHECK (not_sent >= 0), -- in a row; 0004
    traceparent      TEXT, -- the accepting span's W3C traceparent; 0008
    started_fence    INTEGER NOT NULL DEFAULT 0 CHECK (started_fence >= 0), -- 0009
    recoveries       INTEGER NOT NULL DEFAULT 0 CHECK (recoveries >= 0), -- 0009
    -- A lease exists exactly while the effect is claimed.
    CHECK ((state = 'claimed') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    -- Only a done effect carries a result.
    CHECK (result IS NULL OR state = 'done')
);

-- What a dispatcher looks at: waiting effects in due order.
CREATE INDEX oncewire_effects_due ON oncewire_effects (not_before, id)
    WHERE state IN ('pending', 'uncertain');

-- What lease expiry looks at.
CREATE INDEX oncewire_effects_leases ON oncewire_effects (lease_expires_at)
    WHERE state = 'claimed';

-- Waiting effects an owner died on while their sink ran (0009): claimed first, alone.
CREATE INDEX oncewire_effects_suspects ON oncewire_effects (not_before, id)
    WHERE state IN ('pending', 'uncertain') AND recoveries > 0;

-- The attempt history (0004): one row per attempt closed, written in the transaction that
-- closes it
-- (a settlement, the release of a claim whose owner died or whose lease expired, the cancel
-- of an effect in flight). The fence is unique per claim, so it keys the row and orders an
-- effect's attempts oldest first.
CREATE TABLE oncewire_attempts (
    effect_id   INTEGER NOT NULL REFERENCES oncewire_effects (id) ON DELETE CASCADE,
    fence       INTEGER NOT NULL CHECK (fence >= 0),
    attempt     INTEGER NOT NULL CHECK (attempt >= 0),
    owner       TEXT,
    redelivery  INTEGER NOT NULL DEFAULT 0 CHECK (redelivery IN (0, 1)),
    outcome     TEXT    NOT NULL,
    state       TEXT    NOT NULL
                CHECK (state IN ('pending', 'claimed', 'uncertain', 'done', 'rejected',
                                 'dead', 'cancelled')),
    error       TEXT,
    started_at  REAL,
    finished_at REAL    NOT NULL,
    PRIMARY KEY (effect_id, fence)
) WITHOUT ROWID;

-- The attempts closed lately, across every effect (the dashboard's chart); 0010.
CREATE INDEX oncewire_attempts_finished ON oncewire_attempts (finished_at);

CREATE TABLE oncewire_receipts (
    key        TEXT PRIMARY KEY,
    digest     TEXT NOT NULL,
    payload    TEXT NOT NULL,
    result     TEXT,
    created_at REAL NOT NULL,
    expires_at REAL
);

CREATE INDEX oncewire_receipts_expiry ON oncewire_receipts (expires_at)
    WHERE expires_at IS NOT NULL;


CREATE TABLE oncewire_inbound (
    id                  INTEGER PRIMARY KEY,
    platform            TEXT    NOT NULL,
    bot                 TEXT    NOT NULL,
    chat                TEXT    NOT NULL,
    thread              TEXT    NOT NULL DEFAULT '',
    platform_message_id TEXT    NOT NULL,
    payload             TEXT    NOT NULL,
    digest              TEXT    NOT NULL,
    status              TEXT    NOT NULL DEFAULT 'received'
                        CHECK (status IN ('received', 'answering', 'answered', 'delivered',
                                          'quarantined', 'superseded', 'merged')),
    deliveries          INTEGER NOT NULL DEFAULT 1 CHECK (deliveries >= 1),
    attempts            INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error          TEXT,
    created_at          REAL    NOT NULL,
    updated_at          REAL    NOT NULL,
    -- The inbound message whose reply answers a superseded or merged one; 0006
    answered_by         INTEGER REFERENCES oncewire_inbound (id)
                        CHECK ((answered_by IS NULL) = (status NOT IN ('superseded', 'merged'))),
    -- A platform message is admitted once, whatever re-delivers it.
    UNIQUE (platform, bot, chat, thread, platform_message_id)
);

-- What recovery asks: admitted but unanswered, answered but undelivered.
CREATE INDEX oncewire_inbound_open ON oncewire_inbound (status, id)
    WHERE status IN ('received', 'answering', 'answered');

-- A session's earlier messages, newest first (the gateway's chat history for the model); 0010.
CREATE INDEX oncewire_inbound_session ON oncewire_inbound (platform, bot, chat, thread, id);

-- Each session's oldest message still waiting (the gateway's scheduler); 0013.
CREATE INDEX oncewire_inbound_received ON oncewire_inbound (platform, bot, chat, thread, id)
    WHERE status = 'received';

-- A platform's messages admitted lately (where a Discord backfill starts); 0013.
CREATE INDEX oncewire_inbound_recent ON oncewire_inbound (platform, created_at);

CREATE TABLE oncewire_replies (
    id               INTEGER PRIMARY KEY,
    inbound_id       INTEGER NOT NULL UNIQUE REFERENCES oncewire_inbound (id),
    platform         TEXT    NOT NULL,
    bot              TEXT    NOT NULL,
    chat             TEXT    NOT NULL,
    thread           TEXT    NOT NULL DEFAULT '',
    reply_to         TEXT,
    format           TEXT    NOT NULL DEFAULT 'plain',
    cap              INTEGER NOT NULL CHECK (cap >= 1),
    unit             TEXT    NOT NULL CHECK (unit IN ('utf16', 'codepoints')),
    state            TEXT    NOT NULL DEFAULT 'open'
                     CHECK (state IN ('open', 'committed', 'delivered', 'dead', 'withdrawn')),
    final_text       TEXT,
    plan             TEXT,
    marked           INTEGER NOT NULL DEFAULT 0 CHECK (marked IN (0, 1)),
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 1),
    not_before       REAL    NOT NULL,
    lease_owner      TEXT,
    lease_expires_at REAL,
    last_error       TEXT,
    created_at       REAL    NOT NULL,
    updated_at       REAL    NOT NULL,
    -- The final text and its chunk plan arrive together, and only an open reply lacks them.
    CHECK ((final_text IS NULL) = (plan IS NULL)),
    CHECK (state IN ('open', 'dead') OR final_text IS NOT NULL)
);

-- What the reply engine looks at: committed replies in due order.
CREATE INDEX oncewire_replies_due ON oncewire_replies (not_before, id)
    WHERE state = 'committed';

CREATE TABLE oncewire_reply_ops (
    id          INTEGER PRIMARY KEY,
    reply_id    INTEGER NOT NULL REFERENCES oncewire_replies (id),
    seq         INTEGER NOT NULL,
    slot        INTEGER NOT NULL CHECK (slot >= -1),
    kind        TEXT    NOT NULL CHECK (kind IN ('send', 'edit', 'delete')),
    body        TEXT    NOT NULL,
    marked      INTEGER NOT NULL DEFAULT 0 CHECK (marked IN (0, 1)),
    state       TEXT    NOT NULL DEFAULT 'planned'
                CHECK (state IN ('planned', 'in_flight', 'acked', 'refused', 'ambiguous',
                                 'gone')),
    message_id  TEXT,
    retry_after REAL,
    error       TEXT,
    created_at  REAL    NOT NULL,
    updated_at  REAL    NOT NULL,
    UNIQUE (reply_id, seq),
    -- An acknowledged operation names the platform message it made or touched.
    CHECK (state <> 'acked' OR message_id IS NOT NULL),
    -- Edits and deletes always target a recorded message.
    CHECK (kind = 'send' OR message_id IS NOT NULL)
);

-- One visible message per slot: a slot is acknowledged as sent at most once while its message
-- exists (a send whose message someone else deleted is 'gone').
CREATE UNIQUE INDEX oncewire_reply_ops_one_send ON oncewire_reply_ops (reply_id, slot)
    WHERE kind = 'send' AND state = 'acked';

-- Runs: an event-sourced run ledger with a hash-chained history, branches, barriers, an
-- action ledger, completion deliveries and reconciliation reports.

-- The run row: a projection of the run's events plus its lease (which is not history).
-- `state` is the compact folded state; the head event commits to its digest.
CREATE TABLE oncewire_runs (
    run_id           TEXT    PRIMARY KEY,
    scope            TEXT    NOT NULL,
    branch           TEXT    NOT NULL,
    turn             TEXT,
    workflow         TEXT    NOT NULL,
    chain            TEXT    NOT NULL CHECK (chain IN ('sha256', 'hmac-sha256')),
    status           TEXT    NOT NULL,
    terminal_reason  TEXT,
    state            TEXT    NOT NULL,
    head_seq         INTEGER NOT NULL DEFAULT 0 CHECK (head_seq >= 0),
    head_hash        TEXT    NOT NULL,
    owner            TEXT,
    fence            INTEGER NOT NULL DEFAULT 1 CHECK (fence >= 1),
    lease_expires_at REAL,
    created_at       REAL    NOT NULL,
    updated_at       REAL    NOT NULL,
    finished_at      REAL,
    abandoned_at     REAL,
    abandon_reason   TEXT,
    hidden           INTEGER NOT NULL DEFAULT 0 CHECK (hidden IN (0, 1)),
    key_id           TEXT, -- the HMAC key's fingerprint (never the key); 0005
    -- A run is finished exactly when it carries a terminal reason, and never both finished
    -- and abandoned.
    CHECK ((finished_at IS NULL) = (terminal_reason IS NULL)),
    CHECK (finished_at IS NULL OR abandoned_at IS NULL),
    CHECK ((abandoned_at IS NULL) = (abandon_reason IS NULL))
);

-- At most one active run per branch.
CREATE UNIQUE INDEX oncewire_runs_one_active_per_branch ON oncewire_runs (scope, branch)
    WHERE finished_at IS NULL AND abandoned_at IS NULL;

-- Reconciliation scans the active runs through the index above (there are few of them);
-- a lease index would cost a page write on every renewal and every terminal.

-- Keyless runs that a key was adopted over (`oncewire runs adopt-key`): each pinned at its
-- head, the pin MACed with the key, so that a ledger opened with the key still verifies them
-- (with the keyless algorithm) and nobody without the key can add or re-hash one.
CREATE TABLE oncewire_run_key_pins (
    run_id     TEXT    PRIMARY KEY REFERENCES oncewire_runs (run_id),
    key_id     TEXT    NOT NULL,
    head_seq   INTEGER NOT NULL,
    head_hash  TEXT    NOT NULL,
    mac        TEXT    NOT NULL,
    created_at REAL    NOT NULL
);

-- The history. `id` is the scope-wide cursor (it only grows); `seq` orders one run's chain.
-- `hash` covers (run, seq, type, prev_hash, payload); the payload carries the idempotency key,
-- the request digest, the request and the digest of the state after the event.
CREATE TABLE oncewire_run_events (
    id              INTEGER PRIMARY KEY,
    run_id          TEXT    NOT NULL REFERENCES oncewire_runs (run_id),
    scope           TEXT    NOT NULL,
    branch          TEXT    NOT NULL,
    seq             INTEGER NOT NULL CHECK (seq >= 1),
    type            TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    request_digest  TEXT    NOT NULL,
    terminal        INTEGER NOT NULL DEFAULT 0 CHECK (terminal IN (0, 1)),
    payload         TEXT    NOT NULL,
    prev_hash       TEXT    NOT NULL,
    hash            TEXT    NOT NULL,
    at              REAL    NOT NULL,
    UNIQUE (run_id, seq),
    UNIQUE (run_id, idempotency_key)
);

-- At most one terminal event per run.
CREATE UNIQUE INDEX oncewire_run_events_one_terminal ON oncewire_run_events (run_id)
    WHERE terminal = 1;

-- A branch's history is found through its runs (written once per run, not once per event).
CREATE INDEX oncewire_runs_branch ON oncewire_runs (scope, branch, turn);

-- Phases (reviews, repairs): at most one open per run.
CREATE TABLE oncewire_run_phases (
    run_id       TEXT    NOT NULL REFERENCES oncewire_runs (run_id),
    phase_id     TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    status       TEXT    NOT NULL,
    verdict      TEXT,
    candidate_id TEXT,
    body         TEXT    NOT NULL,
    result       TEXT,
    actions_bound INTEGER NOT NULL DEFAULT 0 CHECK (actions_bound IN (0, 1)),
    opened_seq   INTEGER NOT NULL,
    closed_seq   INTEGER,
    opened_at    REAL    NOT NULL,
    closed_at    REAL,
    PRIMARY KEY (run_id, phase_id),
    CHECK ((status = 'open') = (closed_seq IS NULL))
);

CREATE UNIQUE INDEX oncewire_run_phases_one_open ON oncewire_run_phases (run_id)
    WHERE status = 'open';

CREATE TABLE oncewire_run_findings (
    run_id       TEXT NOT NULL REFERENCES oncewire_runs (run_id),
    finding_id   TEXT NOT NULL,
    phase_id     TEXT NOT NULL,
    candidate_id TEXT NOT NULL,
    severity     TEXT NOT NULL,
    body         TEXT NOT NULL,
    PRIMARY KEY (run_id, finding_id)
);

-- Tool calls made inside a run: proposed before they run, resolved after.
CREATE TABLE oncewire_run_actions (
    run_id            TEXT    NOT NULL REFERENCES oncewire_runs (run_id),
    action_id         TEXT    NOT NULL,
    phase_id          TEXT,
    kind              TEXT    NOT NULL,
    arguments         TEXT    NOT NULL,
    arguments_digest  TEXT    NOT NULL,
    side_effect_class TEXT    NOT NULL,
    resource_keys     TEXT    NOT NULL,
    effect_key        TEXT,
    status            TEXT    NOT NULL,
    result            TEXT,
    proposed_seq      INTEGER NOT NULL,
    resolved_seq      INTEGER,
    PRIMARY KEY (run_id, action_id),
    CHECK ((status = 'proposed') = (resolved_seq IS NULL))
);

-- No terminal event while a phase is open, and the chain only grows at its head.
CREATE TRIGGER oncewire_run_events_append BEFORE INSERT ON oncewire_run_events
BEGIN
    SELECT RAISE(ABORT, 'oncewire: a terminal event while a phase is open')
    WHERE NEW.terminal = 1 AND EXISTS (
        SELECT 1 FROM oncewire_run_phases WHERE run_id = NEW.run_id AND status = 'open');
    SELECT RAISE(ABORT, 'oncewire: an event that does not extend the run''s head')
    WHERE NOT EXISTS (
        SELECT 1 FROM oncewire_runs
        WHERE run_id = NEW.run_id AND head_seq + 1 = NEW.seq AND head_hash = NEW.prev_hash);
END;

-- History is append-only.
CREATE TRIGGER oncewire_run_events_no_update BEFORE UPDATE ON oncewire_run_events
BEGIN
    SELECT RAISE(ABORT, 'oncewire: run events are append-only');
END;

CREATE TRIGGER oncewire_run_events_no_delete BEFORE DELETE ON oncewire_run_events
BEGIN
    SELECT RAISE(ABORT, 'oncewire: run events are append-only');
END;

-- Branches of a scope. `view` lists the visible segments [branch, after_id, upto_id|null].
CREATE TABLE oncewire_run_branches (
    scope      TEXT NOT NULL,
    branch     TEXT NOT NULL,
    parent     TEXT,
    view       TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (scope, branch)
);

-- Cursors into a scope's history, with the branch's view at that cursor.
CREATE TABLE oncewire_run_checkpoints (
    checkpoint_id TEXT PRIMARY KEY,
    scope         TEXT NOT NULL,
    branch        TEXT NOT NULL,
    cursor        INTEGER NOT NULL CHECK (cursor >= 0),
    view          TEXT NOT NULL,
    reason        TEXT NOT NULL,
    metadata      TEXT NOT NULL,
    created_at    REAL NOT NULL
);

-- Reverts: a branch shown again up to a checkpoint; the tail stays stored.
CREATE TABLE oncewire_run_reverts (
    id            INTEGER PRIMARY KEY,
    scope         TEXT    NOT NULL,
    branch        TEXT    NOT NULL,
    checkpoint_id TEXT    NOT NULL REFERENCES oncewire_run_checkpoints (checkpoint_id),
    hidden_after  INTEGER NOT NULL,
    hidden_upto   INTEGER NOT NULL,
    abandoned     TEXT    NOT NULL,
    created_at    REAL    NOT NULL
);

-- A revert barrier: a deliberate hold on a scope, with states.
CREATE TABLE oncewire_run_barriers (
    scope        TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    branch       TEXT,
    state        TEXT NOT NULL CHECK (state IN ('reverting', 'recovery_required', 'resolved')),
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    PRIMARY KEY (scope, operation_id)
);

CREATE UNIQUE INDEX oncewire_run_barriers_one_held ON oncewire_run_barriers (scope)
    WHERE state != 'resolved';

-- While a barrier is held, only late evidence of admitted actions (and the release of runs a
-- revert hid) is appended.
CREATE TRIGGER oncewire_run_events_barrier BEFORE INSERT ON oncewire_run_events
WHEN NEW.type NOT IN ('action_resolved', 'run_abandoned')
BEGIN
    SELECT RAISE(ABORT, 'oncewire: a revert barrier holds this scope')
    WHERE EXISTS (
        SELECT 1 FROM oncewire_run_barriers WHERE scope = NEW.scope AND state != 'resolved');
END;

-- Completion deliveries: the final message and its manifest, committed together, published
-- after. Recovery may settle status, review status and the recovery note, never the bytes.
CREATE TABLE oncewire_run_deliveries (
    delivery_id      TEXT PRIMARY KEY,
    idempotency_key  TEXT NOT NULL UNIQUE,
    request_digest   TEXT NOT NULL,
    scope            TEXT NOT NULL,
    branch           TEXT NOT NULL,
    turn             TEXT,
    run_id           TEXT,
    content          TEXT NOT NULL,
    content_sha256   TEXT NOT NULL,
    manifest         TEXT NOT NULL,
    manifest_sha256  TEXT NOT NULL,
    review_status    TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('committed', 'published')),
    recovery         TEXT,
    owner            TEXT,
    lease_expires_at REAL,
    created_at       REAL NOT NULL,
    published_at     REAL,
    CHECK ((status = 'published') = (published_at IS NOT NULL))
);

CREATE INDEX oncewire_run_deliveries_committed ON oncewire_run_deliveries (created_at)
    WHERE status = 'committed';

CREATE TRIGGER oncewire_run_deliveries_bytes BEFORE UPDATE ON oncewire_run_deliveries
WHEN NEW.content IS NOT OLD.content OR NEW.manifest IS NOT OLD.manifest
  OR NEW.content_sha256 IS NOT OLD.content_sha256
  OR NEW.manifest_sha256 IS NOT OLD.manifest_sha256
BEGIN
    SELECT RAISE(ABORT, 'oncewire: a delivery''s message and manifest never change');
END;

-- What each reconciliation did to each row it looked at.
CREATE TABLE oncewire_run_reports (
    id          INTEGER PRIMARY KEY,
    pass_id     TEXT NOT NULL,
    subject     TEXT NOT NULL CHECK (subject IN ('run', 'delivery')),
    subject_id  TEXT NOT NULL,
    run_id      TEXT,
    owner       TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    status      TEXT,
    reason      TEXT,
    error       TEXT,
    created_at  REAL NOT NULL
);

-- Named leases: one holder at a time for something only one process may do (a chat gateway
-- polls a bot from one process: bot:{platform}:{bot}). fence grows by one at every change of
-- holder, so a holder that lost the lease is refused by its fence, never by its clock. A lease
-- given back keeps its row and its fence, with no owner.
CREATE TABLE oncewire_leases (
    name       TEXT PRIMARY KEY,
    owner      TEXT,
    fence      INTEGER NOT NULL CHECK (fence >= 1),
    expires_at REAL NOT NULL,
    updated_at REAL NOT NULL
);

-- LangGraph checkpoints (oncewire.langgraph.OncewireSaver), in the ledger's own store so that a
-- checkpoint, its writes and the caller's rows can commit in one transaction.
--
-- Each thread's history is a hash chain (oncewire_lg_chain): one entry per checkpoint put, per
-- batch of writes and per erasure (prune, delete_for_runs), each hashing the one before it and a
-- material that names the digests of the rows it wrote. A checkpoint or write row points at the
-- entry that wrote it (seq). oncewire_lg_threads holds each chain's head. Writing to a thread
-- needs its lease (oncewire_leases, name "langgraph.thread:" || thread_id) under its fence.
CREATE TABLE oncewire_lg_threads (
    thread_id  TEXT PRIMARY KEY,
    chain      TEXT NOT NULL CHECK (chain IN ('sha256', 'hmac-sha256')),
    key_id     TEXT,
    head_seq   INTEGER NOT NULL CHECK (head_seq >= 1),
    head_hash  TEXT NOT NULL,
    updated_at REAL NOT NULL
);

CREATE TABLE oncewire_lg_chain (
    thread_id  TEXT NOT NULL,
    seq        INTEGER NOT NULL CHECK (seq >= 1),
    kind       TEXT NOT NULL CHECK (kind IN ('checkpoint', 'writes', 'erase')),
    material   TEXT NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (thread_id, seq)
);

CREATE TABLE oncewire_lg_checkpoints (
    thread_id            TEXT NOT NULL,
    checkpoint_ns        TEXT NOT NULL,
    checkpoint_id        TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    seq                  INTEGER NOT NULL,
    type                 TEXT NOT NULL,
    checkpoint           BLOB NOT NULL,
    metadata_type        TEXT NOT NULL,
    metadata             BLOB NOT NULL,
    run_id               TEXT,
    created_at           REAL NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX oncewire_lg_checkpoints_run ON oncewire_lg_checkpoints (run_id)
    WHERE run_id IS NOT NULL;

CREATE TABLE oncewire_lg_writes (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id       TEXT NOT NULL,
    idx           INTEGER NOT NULL,
    channel       TEXT NOT NULL,
    type          TEXT NOT NULL,
    value         BLOB NOT NULL,
    task_path     TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);

-- The runs durable_invoke accepted: the input is recorded before the first node runs, so a run
-- whose process died is listed (oncewire langgraph pending) and resumed, never lost.
CREATE TABLE oncewire_lg_runs (
    thread_id  TEXT PRIMARY KEY,
    state      TEXT NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    graph      TEXT,
    input_type TEXT NOT NULL,
    input      BLOB NOT NULL,
    config     TEXT NOT NULL,
    owner      TEXT NOT NULL,
    attempts   INTEGER NOT NULL CHECK (attempts >= 1),
    error      TEXT,
    started_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX oncewire_lg_runs_state ON oncewire_lg_runs (state, thread_id);

-- OpenAI Agents SDK runs (oncewire.agents.run): each model response under (run_key, step),
-- recorded before anything acts on it (migration 0014).
CREATE TABLE oncewire_agent_steps (
    run_key        TEXT NOT NULL,
    step           INTEGER NOT NULL CHECK (step >= 0),
    request_digest TEXT NOT NULL,
    response       TEXT NOT NULL,
    created_at     REAL NOT NULL,
    PRIMARY KEY (run_key, step)
);

-- The OpenAI Agents SDK's sessions (oncewire.agents.OncewireSession): each session's items
-- in insertion order, numbered after the session's last_seq under its row's lock; 0015.
CREATE TABLE oncewire_agents_sessions (
    session_id TEXT PRIMARY KEY,
    last_seq   INTEGER NOT NULL CHECK (last_seq >= 0),
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);

CREATE TABLE oncewire_agents_items (
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL CHECK (seq >= 1),
    item       TEXT NOT NULL, -- canonical JSON
    created_at REAL NOT NULL,
    PRIMARY KEY (session_id, seq)
);
