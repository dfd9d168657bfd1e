-- The OpenAI Agents SDK's sessions (oncewire.agents.OncewireSession): each session's
-- conversation items as canonical JSON, in the order they were added, in the ledger's own store
-- so that a durable run's records and its conversation can commit in one transaction.
--
-- A session's row holds the last sequence number it gave out (last_seq); an append raises it
-- under the row's lock and numbers its items after it, so a session's items are in insertion
-- order whoever added them, and a popped item's number is never given out again while its
-- session exists. Clearing a session removes its row and its items.
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
