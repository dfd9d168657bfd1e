-- What the gateway's scheduler asks at each look: each session's oldest message still waiting
-- (received), found with one index probe per message read. Without this, proving that a
-- received message is its session's oldest walked every earlier message of the chat.
CREATE INDEX oncewire_inbound_received ON oncewire_inbound (platform, bot, chat, thread, id)
    WHERE status = 'received';

-- Where a Discord backfill starts: a platform's messages admitted lately, read without the
-- rest of the inbox.
CREATE INDEX oncewire_inbound_recent ON oncewire_inbound (platform, created_at);
