-- A session's earlier messages, newest first (the gateway's chat history for the model): without
-- this, each turn read every message of its chat and sorted them.
-- IF NOT EXISTS: an earlier oncewire numbered this migration 0010 on SQLite, and a store it
-- migrated has these indexes already (recorded as version 10).
CREATE INDEX IF NOT EXISTS oncewire_inbound_session ON oncewire_inbound (platform, bot, chat, thread, id);

-- The attempts closed lately, across every effect (the dashboard's chart): without this, each
-- overview read the whole attempt history.
CREATE INDEX IF NOT EXISTS oncewire_attempts_finished ON oncewire_attempts (finished_at);
