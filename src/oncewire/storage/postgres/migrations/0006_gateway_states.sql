-- What a chat gateway records beside a reply: an inbound message superseded by a newer one (an
-- interrupt) or merged into a running turn (steering), linked by answered_by to the inbound
-- message whose reply answers it; a reply withdrawn (its previews deleted); and an edit or
-- delete whose target message someone else deleted ('gone').
ALTER TABLE oncewire_inbound
    ADD COLUMN answered_by BIGINT REFERENCES oncewire_inbound (id),
    DROP CONSTRAINT oncewire_inbound_status_check,
    ADD CONSTRAINT oncewire_inbound_status_check
        CHECK (status IN ('received', 'answering', 'answered', 'delivered', 'quarantined',
                          'superseded', 'merged')),
    ADD CONSTRAINT oncewire_inbound_answered_by
        CHECK ((answered_by IS NULL) = (status NOT IN ('superseded', 'merged')));

ALTER TABLE oncewire_replies
    DROP CONSTRAINT oncewire_replies_state_check,
    ADD CONSTRAINT oncewire_replies_state_check
        CHECK (state IN ('open', 'committed', 'delivered', 'dead', 'withdrawn'));

ALTER TABLE oncewire_reply_ops
    DROP CONSTRAINT oncewire_reply_ops_state_check,
    ADD CONSTRAINT oncewire_reply_ops_state_check
        CHECK (state IN ('planned', 'in_flight', 'acked', 'refused', 'ambiguous', 'gone'));
