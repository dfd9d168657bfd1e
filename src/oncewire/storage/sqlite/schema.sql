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
