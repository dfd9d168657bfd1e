-- OpenAI Agents SDK runs (oncewire.agents.run): each model response of a run, recorded under
-- (run_key, step) before anything acts on it, so that a run resumed with the same run_key is
-- given the recorded responses instead of calling the model again. run_key is the caller's key
-- for a top-level run, and the effect key of the tool call for a run nested inside a tool (an
-- agent used as a tool). request_digest is the sha256 of the request the response answered
-- (instructions and input items): a resumed run that asks something else is refused.
CREATE TABLE oncewire_agent_steps (
    run_key        TEXT NOT NULL,
    step           INTEGER NOT NULL CHECK (step >= 0),
    request_digest TEXT NOT NULL,
    response       TEXT NOT NULL,
    created_at     REAL NOT NULL,
    PRIMARY KEY (run_key, step)
);
