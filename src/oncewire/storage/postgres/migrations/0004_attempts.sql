-- The attempt history: one row per attempt closed, written in the transaction that closes it
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
