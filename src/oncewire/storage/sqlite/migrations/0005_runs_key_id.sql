-- Which key chains a run. `key_id` is a fingerprint of the HMAC key (an HMAC of a fixed label,
-- never the key itself; NULL for a keyless run or one written before this migration), so that a
-- ledger opened with another key is told apart from a tampered history.
ALTER TABLE oncewire_runs ADD COLUMN key_id TEXT;

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
