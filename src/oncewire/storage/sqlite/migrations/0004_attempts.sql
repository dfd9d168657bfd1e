-- The attempt history: one row per attempt closed, written in the transaction that closes it
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

-- Not-sent attempts in a row: a NotSent answer gives its attempt back (it does not count
-- against max_attempts), so this is what bounds a receiver that keeps turning an effect away
-- (RetryPolicy.max_not_sent); a charged attempt and an operator's retry reset it.
ALTER TABLE oncewire_effects ADD COLUMN not_sent INTEGER NOT NULL DEFAULT 0 CHECK (not_sent >= 0);
