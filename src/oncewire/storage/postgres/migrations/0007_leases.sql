-- Named leases: one holder at a time for something only one process may do (a chat gateway
-- polls a bot from one process: bot:{platform}:{bot}). fence grows by one at every change of
-- holder, so a holder that lost the lease is refused by its fence, never by its clock. A lease
-- given back keeps its row and its fence, with no owner.
CREATE TABLE oncewire_leases (
    name       TEXT PRIMARY KEY,
    owner      TEXT,
    fence      BIGINT           NOT NULL CHECK (fence >= 1),
    expires_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
