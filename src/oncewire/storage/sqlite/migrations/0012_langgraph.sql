-- LangGraph checkpoints (oncewire.langgraph.OncewireSaver), in the ledger's own store so that a
-- checkpoint, its writes and the caller's rows can commit in one transaction.
--
-- Each thread's history is a hash chain (oncewire_lg_chain): one entry per checkpoint put, per
-- batch of writes and per erasure (prune, delete_for_runs), each hashing the one before it and a
-- material that names the digests of the rows it wrote. A checkpoint or write row points at the
-- entry that wrote it (seq). oncewire_lg_threads holds each chain's head. Writing to a thread
-- needs its lease (oncewire_leases, name "langgraph.thread:" || thread_id) under its fence.
CREATE TABLE oncewire_lg_threads (
    thread_id  TEXT PRIMARY KEY,
    chain      TEXT NOT NULL CHECK (chain IN ('sha256', 'hmac-sha256')),
    key_id     TEXT,
    head_seq   INTEGER NOT NULL CHECK (head_seq >= 1),
    head_hash  TEXT NOT NULL,
    updated_at REAL NOT NULL
);

CREATE TABLE oncewire_lg_chain (
    thread_id  TEXT NOT NULL,
    seq        INTEGER NOT NULL CHECK (seq >= 1),
    kind       TEXT NOT NULL CHECK (kind IN ('checkpoint', 'writes', 'erase')),
    material   TEXT NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (thread_id, seq)
);

CREATE TABLE oncewire_lg_checkpoints (
    thread_id            TEXT NOT NULL,
    checkpoint_ns        TEXT NOT NULL,
    checkpoint_id        TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    seq                  INTEGER NOT NULL,
    type                 TEXT NOT NULL,
    checkpoint           BLOB NOT NULL,
    metadata_type        TEXT NOT NULL,
    metadata             BLOB NOT NULL,
    run_id               TEXT,
    created_at           REAL NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX oncewire_lg_checkpoints_run ON oncewire_lg_checkpoints (run_id)
    WHERE run_id IS NOT NULL;

CREATE TABLE oncewire_lg_writes (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id       TEXT NOT NULL,
    idx           INTEGER NOT NULL,
    channel       TEXT NOT NULL,
    type          TEXT NOT NULL,
    value         BLOB NOT NULL,
    task_path     TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);

-- The runs durable_invoke accepted: the input is recorded before the first node runs, so a run
-- whose process died is listed (oncewire langgraph pending) and resumed, never lost.
CREATE TABLE oncewire_lg_runs (
    thread_id  TEXT PRIMARY KEY,
    state      TEXT NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    graph      TEXT,
    input_type TEXT NOT NULL,
    input      BLOB NOT NULL,
    config     TEXT NOT NULL,
    owner      TEXT NOT NULL,
    attempts   INTEGER NOT NULL CHECK (attempts >= 1),
    error      TEXT,
    started_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX oncewire_lg_runs_state ON oncewire_lg_runs (state, thread_id);
