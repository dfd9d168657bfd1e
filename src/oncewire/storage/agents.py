"""Records of the OpenAI Agents SDK integration's table: one model response per step of a run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["AgentStep"]


@dataclass(frozen=True, slots=True)
class AgentStep:
    """One model response of a run, recorded before anything acted on it.

    ``run_key`` is the caller's key of a top-level run (or the tool call's effect key for a run
    nested inside a tool), ``step`` counts the run's model responses from 0,
    ``request_digest`` is the sha256 of the request it answered and ``response_json`` the
    response as :mod:`oncewire.agents.responses` writes it."""

    run_key: str
    step: int
    request_digest: str
    response_json: str
    created_at: float

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> AgentStep:
        run_key, step, digest, response, created_at = row
        return cls(str(run_key), int(step), str(digest), str(response), float(created_at))
