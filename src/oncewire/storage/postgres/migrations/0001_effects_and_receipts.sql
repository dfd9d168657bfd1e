-- The outbox (effects) and the receiver's receipts.
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
