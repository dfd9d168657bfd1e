-- The model responses of OpenAI Agents SDK runs (oncewire_agent_steps), written once for every
-- dialect.

-- name: agent_record_step
-- Record one step's response; nothing inserted (rowcount 0) when the step is already recorded.
INSERT INTO oncewire_agent_steps (run_key, step, request_digest, response, created_at)
VALUES (:run_key, :step, :request_digest, :response, :now)
ON CONFLICT (run_key, step) DO NOTHING

-- name: agent_get_step
SELECT run_key, step, request_digest, response, created_at
  FROM oncewire_agent_steps WHERE run_key = :run_key AND step = :step

-- name: agent_list_steps
SELECT run_key, step, request_digest, response, created_at
  FROM oncewire_agent_steps WHERE run_key = :run_key ORDER BY step
