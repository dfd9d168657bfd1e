"""The turn preset's named commands: ``ledger.runs.turn``.

A turn is named by its inbound message: its run id is ``turn:{inbound}`` and each command's
idempotency key is derived from what it records (``step:3``, ``propose:s3/0``, ...), so a caller
that repeats a command after a crash replays it instead of inventing a new key. Every command
has an ``_in_tx`` twin that writes in the caller's transaction, so that a turn's start, steps,
tool calls and terminal commit together with the inbox and reply ledgers' rows of the same
moment (or not at all).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from oncewire.core.canonical import digest
from oncewire.core.errors import (
    ConfigurationError,
    RunConflict,
    RunNotFound,
)
from oncewire.core.limits import MAX_KEY_CHARS, check_name
from oncewire.runs import append
from oncewire.runs.append import RunContext
from oncewire.runs.records import CommandResult
from oncewire.runs.turn.table import (
    action_id,
    effect_key,
    run_id,
    session_branch,
    session_scope,
)
from oncewire.runs.turn.takeover import take_over_in_tx
from oncewire.runs.views import event_view, run_view
from oncewire.storage import RunStore, Transaction
from oncewire.storage.twins import own_transaction

__all__ = ["TurnCommands", "TurnSession", "text_sha256"]


def text_sha256(text: str) -> str:
    """The digest a turn's terminal records for a reply's text: sha256 of its UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class TurnSession:
    """A chat session, ``(platform, bot, chat, thread)``: the run ledger's scope (the chat) and
    branch (the thread; the chat's root branch without one). At most one turn is active on a
    session at a time, held by the ledger's one-active-run-per-branch index."""

    platform: str
    bot: str
    chat: str
    thread: str = ""

    def __post_init__(self) -> None:
        # The inbox's rules for the same four fields, so that every admitted message's session
        # can be named, and a bad one is refused before anything is written.
        for name in ("platform", "bot", "chat", "thread"):
            check_name(
                f"the session's {name}", getattr(self, name), MAX_KEY_CHARS, empty=name == "thread"
            )

    @property
    def scope(self) -> str:
        return session_scope(self.platform, self.bot, self.chat)

    @property
    def branch(self) -> str:
        return session_branch(self.platform, self.bot, self.chat, self.thread)

    def as_dict(self) -> dict[str, str]:
        return {
            "platform": self.platform,
            "bot": self.bot,
            "chat": self.chat,
            "thread": self.thread,
        }


class TurnLedger(Protocol):
    """What the preset needs of the run ledger (:class:`oncewire.runs.service.Runs`)."""

    context: RunContext

    def start_in_tx(
        self,
        tx: Transaction,
        run_id: str,
        *,
        key: str,
        scope: str,
        branch: str | None = None,
        turn: str | None = None,
        workflow_name: str = "review",
        params: dict[str, Any] | None = None,
        owner: str | None = None,
        lease_seconds: float = ...,
    ) -> CommandResult: ...

    def execute_in_tx(
        self,
        tx: Transaction,
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


def _inbound(inbound_id: int) -> int:
    if not isinstance(inbound_id, int) or isinstance(inbound_id, bool) or inbound_id < 1:
        raise ConfigurationError("an inbound id is a positive integer")
    return inbound_id


class TurnCommands:
    """The turn workflow's commands on a run ledger: ``ledger.runs.turn``.

    Each command without ``_in_tx`` is one transaction of its own; each ``_in_tx`` twin writes
    in the caller's (``with ledger.store.transaction() as tx``). ``fence``, when given, must be
    the run's current fence (:class:`StaleFence` otherwise): a worker passes the fence it holds,
    so that once another process took the turn over its late writes are refused.
    """

    def __init__(self, runs: TurnLedger) -> None:
        self._runs = runs

    @property
    def _store(self) -> RunStore:
        return self._runs.context.store

    def _one(self, write: Callable[[Transaction], CommandResult]) -> CommandResult:
        return append.command_in_own_tx(self._store, write)

    def _execute_in_tx(
        self,
        tx: Transaction,
        inbound_id: int,
        command: str,
        request: dict[str, Any],
        *,
        key: str,
        fence: int | None,
        also_in_tx: Callable[[Transaction], None] | None = None,
    ) -> CommandResult:
        return self._runs.execute_in_tx(
            tx,
            run_id(_inbound(inbound_id)),
            command,
            request,
            key=key,
            fence=fence,
            also_in_tx=also_in_tx,
        )

    # -- start -----------------------------------------------------------------------------
    def start_in_tx(
        self,
        tx: Transaction,
        inbound_id: int,
        session: TurnSession,
        *,
        owner: str | None = None,
        lease_seconds: float | None = None,
    ) -> CommandResult:
        """:meth:`start` in the caller's transaction (the gateway's turn start writes the
        inbox's start and the reply record in the same one)."""
        if not isinstance(session, TurnSession):
            raise ConfigurationError("a turn's session is a TurnSession")
        inbound = _inbound(inbound_id)
        extra: dict[str, Any] = {} if lease_seconds is None else {"lease_seconds": lease_seconds}
        return self._runs.start_in_tx(
            tx,
            run_id(inbound),
            key="start",
            scope=session.scope,
            branch=session.branch,
            turn=str(inbound),
            workflow_name="turn",
            params={"inbound": inbound, "session": session.as_dict()},
            owner=owner,
            **extra,
        )

    start = own_transaction(
        start_in_tx,
        _one,
        """Start the turn that answers ``inbound_id`` on ``session``'s branch.

        :class:`BranchBusy` while another turn is active on the session. Starting it again
        replays the start (even after it finished); the run id is ``turn:{inbound_id}``.
        """,
    )

    # -- steps -----------------------------------------------------------------------------
    def record_step_in_tx(
        self,
        tx: Transaction,
        inbound_id: int,
        step: int,
        *,
        request_digest: str,
        response_digest: str,
        usage: dict[str, Any],
        finish_reason: str,
        tool_calls: Sequence[dict[str, Any]] = (),
        text: str = "",
        fence: int | None = None,
    ) -> CommandResult:
        request = {
            "step": step,
            "request_digest": request_digest,
            "response_digest": response_digest,
            "usage": usage,
            "finish_reason": finish_reason,
            "tool_calls": [dict(call) for call in tool_calls],
        }
        if text:  # absent when empty, so a step recorded without text keeps its request
            request["text"] = text
        return self._execute_in_tx(
            tx, inbound_id, "record_step", request, key=f"step:{step}", fence=fence
        )

    record_step = own_transaction(
        record_step_in_tx,
        _one,
        """Record a completed model step (numbered from 1, without a gap): the digests of the
        request sent and the response used, the usage, the finish reason and the tool calls
        the response asked for (each an object with at least ``id`` and ``name``), and
        ``text``, what the model said beside those calls, so that a resumed turn asks the model
        with the conversation it had (the final step's text is the reply's, not repeated here).""",
    )

    def steer_in_tx(
        self,
        tx: Transaction,
        inbound_id: int,
        *,
        by: int,
        after_step: int,
        fence: int | None = None,
    ) -> CommandResult:
        request = {"inbound": by, "after_step": after_step}
        return self._execute_in_tx(tx, inbound_id, "steer", request, key=f"steer:{by}", fence=fence)

    steer = own_transaction(
        steer_in_tx,
        _one,
        """Record that inbound ``by`` was added to the running turn after step ``after_step``
        (the latest recorded one): the turn's reply answers it too.""",
    )

    # -- tool calls ------------------------------------------------------------------------
    def propose_action_in_tx(
        self,
        tx: Transaction,
        inbound_id: int,
        step: int,
        index: int,
        *,
        tool_call_id: str,
        name: str,
        arguments: Any,
        side_effect_class: str,
        resource_keys: Sequence[str] = (),
        dispatch: tuple[str, Any] | None = None,
        max_attempts: int | None = None,
        deadline_seconds: float | None = None,
        fence: int | None = None,
    ) -> CommandResult:
        inbound = _inbound(inbound_id)
        link = None if dispatch is None else effect_key(inbound, step, index)
        request = {
            "action_id": action_id(step, index),
            "step": step,
            "index": index,
            "tool_call_id": tool_call_id,
            "kind": name,
            "arguments": arguments,
            "side_effect_class": side_effect_class,
            "resource_keys": list(resource_keys),
            "effect_key": link,
        }
        also = append.effect_acceptor(
            self._runs.context,
            link,
            dispatch,
            max_attempts=max_attempts,
            deadline_seconds=deadline_seconds,
        )
        return self._execute_in_tx(
            tx,
            inbound,
            "propose_action",
            request,
            key=f"propose:{action_id(step, index)}",
            fence=fence,
            also_in_tx=also,
        )

    propose_action = own_transaction(
        propose_action_in_tx,
        _one,
        """Record the ``index``-th tool call (from 0) of the latest step before it runs.

        With ``dispatch=(effect_kind, payload)`` its effect is accepted into the outbox under
        the key ``turn/{inbound}/s{step}/{index}`` in the same transaction as the proposal
        (``max_attempts`` and ``deadline_seconds`` are the effect's): both commit, or neither.
        """,
    )

    def resolve_action_in_tx(
        self,
        tx: Transaction,
        inbound_id: int,
        step: int,
        index: int,
        *,
        status: str,
        result: Any = None,
        fence: int | None = None,
    ) -> CommandResult:
        request = {"action_id": action_id(step, index), "status": status, "result": result}
        return self._execute_in_tx(
            tx,
            inbound_id,
            "resolve_action",
            request,
            key=f"resolve:{action_id(step, index)}",
            fence=fence,
        )

    resolve_action = own_transaction(
        resolve_action_in_tx,
        _one,
        """Record how a proposed tool call ended: ``succeeded``, ``failed`` or ``not_run``.""",
    )

    # -- interrupts and takeovers ----------------------------------------------------------
    def request_interrupt_in_tx(
        self,
        tx: Transaction,
        inbound_id: int,
        *,
        by: int | None,
        reason: str,
        fence: int | None = None,
    ) -> CommandResult:
        request = {"by": by, "reason": reason}
        key = f"interrupt:{'none' if by is None else by}"
        return self._execute_in_tx(
            tx, inbound_id, "request_interrupt", request, key=key, fence=fence
        )

    request_interrupt = own_transaction(
        request_interrupt_in_tx,
        _one,
        """Record an interrupt of the running turn (``by`` the inbound that caused it, or None).

        Refused (:class:`TransitionRefused`) once the turn finished, and once another interrupt
        is recorded: a committed answer is always delivered, and one interrupt is enough.
        """,
    )

    def resume_in_tx(
        self,
        tx: Transaction,
        inbound_id: int,
        *,
        owner: str,
        from_fence: int,
        lease_seconds: float,
        reason: str = "restart",
        dead_owners: Sequence[str] = (),
    ) -> CommandResult:
        """:meth:`resume` in the caller's transaction."""
        return take_over_in_tx(
            self._runs.context,
            tx,
            run_id(_inbound(inbound_id)),
            owner=owner,
            from_fence=from_fence,
            lease_seconds=lease_seconds,
            reason=reason,
            dead_owners=dead_owners,
        )

    resume = own_transaction(
        resume_in_tx,
        _one,
        """Take the turn over from the owner that held it under ``from_fence`` and record it
        (a ``run_resumed`` event): the run is leased to ``owner`` under ``from_fence + 1``.

        Refused while the previous owner's lease is live, unless it is named in
        ``dead_owners`` or is a process on this host that is certainly gone; a fence that moved
        on is :class:`StaleFence`. The same takeover again is a replay; another owner's
        takeover from the same fence is a :class:`RunConflict`.
        """,
    )

    # -- terminal and release --------------------------------------------------------------
    def terminate_in_tx(
        self,
        tx: Transaction,
        inbound_id: int,
        status: str,
        *,
        reason: str,
        reply_text: str | None = None,
        fence: int | None = None,
    ) -> CommandResult:
        """:meth:`terminate` in the caller's transaction (the gateway commits the reply and
        the ``answered`` terminal together)."""
        if reply_text is not None and not isinstance(reply_text, str):
            raise ConfigurationError("a reply's text must be a string")
        request = {
            "status": status,
            "reason": reason,
            "reply_sha256": None if reply_text is None else text_sha256(reply_text),
        }
        return self._execute_in_tx(
            tx, inbound_id, "terminate", request, key="terminate", fence=fence
        )

    terminate = own_transaction(
        terminate_in_tx,
        _one,
        """End the turn: ``answered`` (``reply_text`` is the committed reply's text; its sha256
        is recorded), ``interrupted`` (after a recorded interrupt), ``failed``,
        ``outcome_unknown`` or ``cancelled``. No terminal but ``outcome_unknown`` is admitted
        while a world-changing tool call is unresolved.""",
    )

    def abandon_in_tx(
        self, tx: Transaction, inbound_id: int, *, reason: str, fence: int | None = None
    ) -> CommandResult:
        ctx = self._runs.context
        name = run_id(_inbound(inbound_id))
        request = {"reason": reason}
        context = ctx.store.command_context_in_tx(tx, name, "abandon")
        if context is not None and context.prior is not None and context.run.abandoned_at:
            # A released run authorises nothing, but the release itself is still answered:
            # the same abandon again is a replay, another one a conflict.
            row, prior = context.run, context.prior
            if prior.request_digest != digest({"command": "abandon", "request": request}):
                raise RunConflict(
                    f"run {name!r} was abandoned for another reason; nothing was written",
                    run_id=name,
                    key="abandon",
                )
            audit = append.require_audit(ctx, row)
            return CommandResult(run_view(row, audit.state), event_view(prior), True)
        result = self._execute_in_tx(tx, inbound_id, "abandon", request, key="abandon", fence=fence)
        # The row says it too, as a revert's or reconciliation's release does.
        ctx.store.abandon_run_in_tx(tx, name, reason=reason, now=ctx.now())
        released = ctx.store.get_run_in_tx(tx, name)
        if released is None:  # cannot happen: it was written in this transaction
            raise RunNotFound(f"no run {name!r}", run_id=name)
        return CommandResult(run_view(released, result.run.state), result.event, False)

    abandon = own_transaction(
        abandon_in_tx,
        _one,
        """Release the turn without a terminal (its status kept; nothing follows): for a turn
        about which nothing truthful can be said.""",
    )
