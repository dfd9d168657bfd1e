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
    CONSTRAINT oncewire_effects_lease_iff_claimed
        CHECK ((state = 'claimed') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT oncewire_effects_result_only_done CHECK (result IS NULL OR state = 'done')
);

CREATE INDEX oncewire_effects_due ON oncewire_effects (not_before, id)
    WHERE state IN ('pending', 'uncertain');

CREATE INDEX oncewire_effects_leases ON oncewire_effects (lease_expires_at)
    WHERE state = 'claimed';

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
                                          'quarantined')),
    deliveries          INTEGER          NOT NULL DEFAULT 1 CHECK (deliveries >= 1),
    attempts            INTEGER          NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error          TEXT,
    created_at          DOUBLE PRECISION NOT NULL,
    updated_at          DOUBLE PRECISION NOT NULL,
    -- A platform message is admitted once, whatever re-delivers it.
    CONSTRAINT oncewire_inbound_once UNIQUE (platform, bot, chat, thread, platform_message_id)
);

-- What recovery asks: admitted but unanswered, answered but undelivered.
CREATE INDEX oncewire_inbound_open ON oncewire_inbound (status, id)
    WHERE status IN ('received', 'answering', 'answered');

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
                     CHECK (state IN ('open', 'committed', 'delivered', 'dead')),
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

CREATE TABLE oncewire_reply_ops (
    id          BIGSERIAL        PRIMARY KEY,
    reply_id    BIGINT           NOT NULL REFERENCES oncewire_replies (id),
    seq         INTEGER          NOT NULL,
    slot        INTEGER          NOT NULL CHECK (slot >= -1),
    kind        TEXT             NOT NULL CHECK (kind IN ('send', 'edit', 'delete')),
    body        TEXT             NOT NULL,
    marked      BOOLEAN          NOT NULL DEFAULT FALSE,
    state       TEXT             NOT NULL DEFAULT 'planned'
                CHECK (state IN ('planned', 'in_flight', 'acked', 'refused', 'ambiguous')),
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

-- One visible message per slot: a slot is acknowledged as sent at most once.
CREATE UNIQUE INDEX oncewire_reply_ops_one_send ON oncewire_reply_ops (reply_id, slot)
    WHERE kind = 'send' AND state = 'acked';
