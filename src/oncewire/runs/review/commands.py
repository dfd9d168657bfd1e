"""The review preset's named commands: ``ledger.runs.review``, thin wrappers over
:meth:`Runs.execute <oncewire.runs.service.Runs.execute>`.

Each builds the request the review workflow's table expects; the generic ``execute`` appends the
event (or replays it) and the guards in :mod:`oncewire.runs.review.table` decide.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from oncewire.core.errors import ConfigurationError
from oncewire.runs.append import RunContext, effect_acceptor
from oncewire.runs.records import CommandResult
from oncewire.storage import Transaction

__all__ = ["CommandRunner", "ReviewCommands"]


class CommandRunner(Protocol):
    """What the preset needs of the run ledger (:class:`oncewire.runs.service.Runs`)."""

    context: RunContext

    def execute(
        self,
        run_id: str,
        command: str,
        request: dict[str, Any],
        *,
        key: str,
        owner: str | None = None,
        fence: int | None = None,
        lease_seconds: float | None = None,
        also_in_tx: Callable[[Transaction], None] | None = None,
    ) -> CommandResult: ...


class ReviewCommands:
    """The review workflow's commands on a run ledger: ``ledger.runs.review``."""

    def __init__(self, runs: CommandRunner) -> None:
        self._runs = runs

    def record_candidate(
        self,
        run_id: str,
        *,
        key: str,
        candidate_id: str,
        snapshot_sha256: str,
        evidence_sha256: str,
        artifact_set_sha256: str,
        artifact_ids: Sequence[str] = (),
        version_ids: Sequence[str] = (),
        fence: int | None = None,
    ) -> CommandResult:
        candidate = {
            "candidate_id": candidate_id,
            "snapshot_sha256": snapshot_sha256,
            "evidence_sha256": evidence_sha256,
            "artifact_set_sha256": artifact_set_sha256,
            "artifact_ids": list(artifact_ids),
            "version_ids": list(version_ids),
        }
        return self._runs.execute(
            run_id, "record_candidate", {"candidate": candidate}, key=key, fence=fence
        )

    def start_review(
        self,
        run_id: str,
        *,
        key: str,
        review_id: str,
        candidate_id: str,
        evidence_sha256: str,
        attempt: int = 1,
        reviewer: dict[str, Any] | None = None,
        fence: int | None = None,
    ) -> CommandResult:
        request = {
            "review_id": review_id,
            "candidate_id": candidate_id,
            "evidence_sha256": evidence_sha256,
            "attempt": attempt,
            "reviewer": reviewer or {},
        }
        return self._runs.execute(run_id, "start_review", request, key=key, fence=fence)

    def complete_review(
        self,
        run_id: str,
        *,
        key: str,
        review_id: str,
        verdict: str,
        status: str = "completed",
        assessment: dict[str, Any] | None = None,
        findings: Sequence[dict[str, Any]] = (),
        usage: dict[str, Any] | None = None,
        fence: int | None = None,
    ) -> CommandResult:
        request = {
            "review_id": review_id,
            "status": status,
            "verdict": verdict,
            "assessment": assessment or {},
            "findings": [dict(f) for f in findings],
            "usage": usage or {},
        }
        return self._runs.execute(run_id, "complete_review", request, key=key, fence=fence)

    def start_repair(
        self,
        run_id: str,
        *,
        key: str,
        repair_id: str,
        finding_ids: Sequence[str] = (),
        checkpoint_id: str | None = None,
        fence: int | None = None,
    ) -> CommandResult:
        request = {
            "repair_id": repair_id,
            "finding_ids": list(finding_ids),
            "checkpoint_id": checkpoint_id,
        }
        return self._runs.execute(run_id, "start_repair", request, key=key, fence=fence)

    def bind_actions(
        self, run_id: str, *, key: str, repair_id: str, fence: int | None = None
    ) -> CommandResult:
        """Declare that the open repair records its tool calls in the action ledger."""
        return self._runs.execute(
            run_id, "bind_actions", {"repair_id": repair_id}, key=key, fence=fence
        )

    def complete_repair(
        self,
        run_id: str,
        *,
        key: str,
        repair_id: str,
        status: str = "completed",
        candidate: dict[str, Any] | None = None,
        fence: int | None = None,
    ) -> CommandResult:
        request: dict[str, Any] = {"repair_id": repair_id, "status": status}
        if candidate is not None:
            request["candidate"] = candidate
        return self._runs.execute(run_id, "complete_repair", request, key=key, fence=fence)

    def propose_action(
        self,
        run_id: str,
        *,
        key: str,
        action_id: str,
        kind: str,
        arguments: Any,
        side_effect_class: str,
        resource_keys: Sequence[str] = (),
        effect_key: str | None = None,
        dispatch: tuple[str, Any] | None = None,
        fence: int | None = None,
    ) -> CommandResult:
        """Record a tool call before it runs.

        ``effect_key`` links an effect of the outbox that performs it (its state is then read
        from the outbox, not copied here). With ``dispatch=(effect_kind, payload)`` that effect
        is accepted in the same transaction as the proposal: both commit, or neither.
        """
        if dispatch is not None and effect_key is None:
            raise ConfigurationError("dispatch needs the effect_key to accept it under")
        request = {
            "action_id": action_id,
            "kind": kind,
            "arguments": arguments,
            "side_effect_class": side_effect_class,
            "resource_keys": list(resource_keys),
            "effect_key": effect_key,
        }
        also = effect_acceptor(self._runs.context, effect_key, dispatch)
        return self._runs.execute(
            run_id, "propose_action", request, key=key, fence=fence, also_in_tx=also
        )

    def resolve_action(
        self,
        run_id: str,
        *,
        key: str,
        action_id: str,
        status: str,
        result: Any = None,
        fence: int | None = None,
    ) -> CommandResult:
        """Record how a proposed tool call ended (admitted even while a revert holds the scope)."""
        request = {"action_id": action_id, "status": status, "result": result}
        return self._runs.execute(run_id, "resolve_action", request, key=key, fence=fence)

    def terminate(
        self,
        run_id: str,
        *,
        key: str,
        status: str,
        reason: str,
        fence: int | None = None,
    ) -> CommandResult:
        return self._runs.execute(
            run_id, "terminate", {"status": status, "reason": reason}, key=key, fence=fence
        )
