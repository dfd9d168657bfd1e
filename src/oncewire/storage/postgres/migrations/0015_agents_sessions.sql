-- The OpenAI Agents SDK's sessions (oncewire.agents.OncewireSession): each session's
-- conversation items as canonical JSON, in the order they were added, in the ledger's own store
-- so that a durable run's records and its conversation can commit in one transaction.
--
-- A session's row holds the last sequence number it gave out (last_seq); an append raises it
-- under the row's lock and numbers its items after it, so a session's items are in insertion
-- order whoever added them, and a popped item's number is never given out again while its
-- session exists. A pop or a clear locks the row first, so two pops never take the same item
-- and a clear never misses an item that an append committed while it waited. Clearing a
-- session removes its row and its items. Ids compare bytewise (COLLATE "C"), as on SQLite.
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
