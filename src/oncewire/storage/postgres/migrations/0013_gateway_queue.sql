-- What the gateway's scheduler asks at each look: each session's oldest message still waiting
-- (received), found with one index probe per message read. Without this, proving that a
-- received message is its session's oldest walked every earlier message of the chat.
CREATE INDEX oncewire_inbound_received ON oncewire_inbound (platform, bot, chat, thread, id)
    WHERE status = 'received';

-- Where a Discord backfill starts: a platform's messages admitted lately, read without the
-- rest of the inbox.
CREATE INDEX oncewire_inbound_recent ON oncewire_inbound (platform, created_at);

-- Wake a gateway's scheduler when the inbox changes (a message admitted, a session's turn
-- answered or superseded) and its reply thread when a reply becomes deliverable by anyone
-- (committed with no lease: committed by a caller that does not deliver it, or given back
-- with a retry time). Delivered at commit, coalesced per transaction.
CREATE FUNCTION oncewire_notify_inbound() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('oncewire_inbound', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER oncewire_inbound_notify
    AFTER INSERT OR UPDATE OF status ON oncewire_inbound
    FOR EACH STATEMENT EXECUTE FUNCTION oncewire_notify_inbound();

CREATE FUNCTION oncewire_notify_replies() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('oncewire_replies', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER oncewire_replies_notify
    AFTER INSERT OR UPDATE ON oncewire_replies
    FOR EACH ROW WHEN (NEW.state = 'committed' AND NEW.lease_owner IS NULL)
    EXECUTE FUNCTION oncewire_notify_replies();
