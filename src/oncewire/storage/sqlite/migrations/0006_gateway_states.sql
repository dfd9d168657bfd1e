-- What a chat gateway records beside a reply: an inbound message superseded by a newer one (an
-- interrupt) or merged into a running turn (steering), linked by answered_by to the inbound
-- message whose reply answers it; a reply withdrawn (its previews deleted); and an edit or
-- delete whose target message someone else deleted ('gone').
ALTER TABLE oncewire_inbound ADD COLUMN answered_by INTEGER REFERENCES oncewire_inbound (id)
    CHECK ((answered_by IS NULL) = (status NOT IN ('superseded', 'merged')));

-- SQLite cannot alter a CHECK constraint in place. Widening one (every stored row satisfies
-- the wider check) is the documented case for rewriting the table's definition in
-- sqlite_master. The ALTER TABLE above changed the schema cookie in this transaction, so every
-- other connection reloads these definitions; RESET reloads them on this one.
PRAGMA writable_schema = ON;

UPDATE sqlite_master
   SET sql = replace(sql, '''quarantined''))',
                     '''quarantined'', ''superseded'', ''merged''))')
 WHERE type = 'table' AND name = 'oncewire_inbound';

UPDATE sqlite_master
   SET sql = replace(sql, '''delivered'', ''dead''))', '''delivered'', ''dead'', ''withdrawn''))')
 WHERE type = 'table' AND name = 'oncewire_replies';

UPDATE sqlite_master
   SET sql = replace(sql, '''refused'', ''ambiguous''))',
                     '''refused'', ''ambiguous'', ''gone''))')
 WHERE type = 'table' AND name = 'oncewire_reply_ops';

PRAGMA writable_schema = RESET;
