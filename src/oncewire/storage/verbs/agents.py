"""The verbs of durable OpenAI Agents SDK runs, written once (statements in
``storage/sql/agents.sql``).

A step is recorded once: ``PRIMARY KEY (run_key, step)`` holds it, and a second record of the
same step (a process that raced another for it, or a resumed run that called the model before
it learnt the step was there) gets the stored one back, never a second row.
"""

from __future__ import annotations

from oncewire.storage.agents import AgentStep
from oncewire.storage.driver import Driver, Transaction

__all__ = ["AgentVerbs"]


class AgentVerbs:
    """Record and read the model responses of a run, by ``(run_key, step)``."""

    db: Driver

    def agent_record_step_in_tx(
        self,
        tx: Transaction,
        *,
        run_key: str,
        step: int,
        request_digest: str,
        response_json: str,
        now: float,
    ) -> tuple[AgentStep, bool]:
        """Record step ``step`` of ``run_key`` in the caller's transaction; the stored step
        and whether this call stored it (False: it was already recorded, and what is returned
        is what was)."""
        db, q = self.db, self.db.queries
        with db.in_tx(tx, "recording an agent run's step") as conn:
            inserted = db.run(
                conn,
                q.agent_record_step,
                run_key=run_key,
                step=step,
                request_digest=request_digest,
                response=response_json,
                now=now,
            )
            row = db.one(conn, q.agent_get_step, run_key=run_key, step=step)
        assert row is not None  # inserted, or the row the insert conflicted with
        return AgentStep.from_row(row), bool(inserted)

    def agent_list_steps(self, run_key: str) -> list[AgentStep]:
        """Every recorded step of ``run_key``, in order."""
        rows = self.db.read(self.db.queries.agent_list_steps, run_key=run_key)
        return [AgentStep.from_row(row) for row in rows]
