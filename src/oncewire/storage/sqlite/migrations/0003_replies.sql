-- Inbound messages admitted once, one reply record per inbound, and every wire operation.

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
                                          'quarantined')),
    deliveries          INTEGER NOT NULL DEFAULT 1 CHECK (deliveries >= 1),
    attempts            INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error          TEXT,
    created_at          REAL    NOT NULL,
    updated_at          REAL    NOT NULL,
    -- A platform message is admitted once, whatever re-delivers it.
    UNIQUE (platform, bot, chat, thread, platform_message_id)
);

-- What recovery asks: admitted but unanswered, answered but undelivered.
CREATE INDEX oncewire_inbound_open ON oncewire_inbound (status, id)
    WHERE status IN ('received', 'answering', 'answered');

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
                     CHECK (state IN ('open', 'committed', 'delivered', 'dead')),
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
                CHECK (state IN ('planned', 'in_flight', 'acked', 'refused', 'ambiguous')),
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

-- One visible message per slot: a slot is acknowledged as sent at most once.
CREATE UNIQUE INDEX oncewire_reply_ops_one_send ON oncewire_reply_ops (reply_id, slot)
    WHERE kind = 'send' AND state = 'acked';
