"""A turn's tool calls as effects: T3 records them, the dispatcher runs them, T4 resolves them.

When a completed model response asks for tool calls, **T3** is one transaction: the model step
(``record_step_in_tx``, its calls with their arguments as the model wrote them) and per call
``propose_action_in_tx(..., dispatch=(tool.kind, arguments))``, which accepts the outbox effect
``turn/{inbound}/s{step}/{index}`` with it. A call to an unknown tool, or whose arguments are not
a JSON object, is proposed and resolved ``failed`` in the same transaction and never dispatched.

The worker then waits for each effect to be terminal, reading the store (the truth, whichever
process ran the sink), and ends the wait at once when the turn is interrupted. **T4** is
``resolve_action`` with what the sink answered. An effect ``dead`` or cancelled after an attempt
that may have run is told to the model as "outcome unknown" and left unresolved: nothing
truthful can be recorded, and the turn can then only end ``outcome_unknown``.

A resumed turn rebuilds its conversation from the recorded steps (:meth:`ToolCalls.replay`): a
resolved call's recorded result, an unresolved one's effect as the outbox holds it. A ``done``
effect is read back, never run again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from oncewire.core import crash
from oncewire.core.canonical import digest
from oncewire.core.errors import InvalidState
from oncewire.gateway.model_results import Interrupt, ModelResponse
from oncewire.gateway.tools import (
    ToolRegistry,
    assistant_message,
    call_from_record,
    parse_arguments,
    recorded_calls,
    tool_content,
)
from oncewire.ledger import Ledger
from oncewire.runs.records import WORLD_CHANGING
from oncewire.runs.turn import action_id, effect_key, run_id
from oncewire.storage.records import TERMINAL_STATES, Effect, EffectState
from oncewire.toolcalls import UNKNOWN_OUTCOME

__all__ = ["Conversation", "ToolCalls", "ToolWaitInterrupted", "response_digest", "usage"]

log = logging.getLogger("oncewire.gateway.turn")

STEP_RECORDED = crash.register(
    "gateway.step_recorded_before_dispatch",
    "T3 committed (the model step and its tool calls' effects accepted); the dispatcher not "
    "woken, no effect claimed",
)
TOOL_DONE = crash.register(
    "gateway.tool_done_before_resolve",
    "a tool call's effect is done (its result recorded by the dispatcher); T4 not committed",
)


class ToolCalls:
    """T3, the wait and T4 for one gateway's tools; one instance serves every worker thread."""

    def __init__(self, ledger: Ledger, tools: ToolRegistry, *, poll_seconds: float) -> None:
        self.ledger = ledger
        self.tools = tools
        self.poll_seconds = poll_seconds  # how often a waiting turn reads its effect
        self._kinds = frozenset(tools.sinks())  # the effect kinds this gateway runs

    def record(self, loop: Conversation, response: ModelResponse) -> list[dict[str, Any]]:
        """T3: the step and a proposal per call (an effect for each valid one), one commit."""
        step = loop.steps + 1
        calls = recorded_calls(response.tool_calls, step)
        turn = self.ledger.runs.turn
        with self.ledger.transaction() as tx:
            turn.record_step_in_tx(
                tx,
                loop.inbound_id,
                step,
                request_digest=digest({"messages": loop.messages}),
                response_digest=response_digest(response),
                usage=usage(response),
                finish_reason=response.finish_reason,
                tool_calls=calls,
                text=response.text,
                fence=loop.fence,
            )
            for index, call in enumerate(calls):
                tool = self.tools.get(call["name"])
                arguments, problem = parse_arguments(call["arguments"])
                if tool is None:
                    known = ", ".join(self.tools.names()) or "none"
                    problem = f"there is no tool named {call['name']!r} (the tools: {known})"
                if tool is None or problem is not None:
                    turn.propose_action_in_tx(
                        tx,
                        loop.inbound_id,
                        step,
                        index,
                        tool_call_id=call["id"],
                        name=call["name"],
                        arguments=call["arguments"],
                        side_effect_class="read_only",  # nothing runs
                        fence=loop.fence,
                    )
                    turn.resolve_action_in_tx(
                        tx,
                        loop.inbound_id,
                        step,
                        index,
                        status="failed",
                        result={"error": problem},
                        fence=loop.fence,
                    )
                    continue
                turn.propose_action_in_tx(
                    tx,
                    loop.inbound_id,
                    step,
                    index,
                    tool_call_id=call["id"],
                    name=call["name"],
                    arguments=arguments,
                    side_effect_class=tool.side_effect,
                    dispatch=(tool.kind, arguments),
                    max_attempts=tool.max_attempts,
                    fence=loop.fence,
                )
        loop.steps = step
        STEP_RECORDED.hit()
        log.info(
            "turn tools inbound=%s step=%s calls=%s",
            loop.inbound_id,
            step,
            ",".join(c["name"] for c in calls),
        )
        return calls

    def replay(self, loop: Conversation, interrupt: Interrupt) -> None:
        """A resumed turn's recorded steps back into its conversation: each call's recorded
        resolution, or (unresolved) its effect as the outbox holds it, waited for and then
        resolved; nothing that is done runs again."""
        resolved: dict[str, dict[str, Any]] = {}
        steps: dict[int, tuple[str, list[dict[str, Any]]]] = {}
        for event in self.ledger.runs.events(run_id(loop.inbound_id)):
            request = event.payload.get("request") or {}
            if event.type == "step_recorded":
                calls = list(request.get("tool_calls") or [])
                steps[int(request["step"])] = (str(request.get("text") or ""), calls)
            elif event.type == "action_resolved":
                resolved[str(request["action_id"])] = request
        for step in sorted(steps):
            text, recorded = steps[step]
            calls = [call_from_record(call) for call in recorded]
            loop.messages.append(assistant_message(text, calls))
            for index, call in enumerate(calls):
                known = resolved.get(action_id(step, index))
                if known is not None:
                    content = tool_content(str(known["status"]), known.get("result"))
                else:
                    content = self.outcome(loop, step, index, call, interrupt)
                loop.messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": content}
                )

    def outcome(
        self, loop: Conversation, step: int, index: int, call: dict[str, Any], interrupt: Interrupt
    ) -> str:
        """What the model is told of call ``index`` of ``step``: its resolution if T3
        recorded one, else its effect once terminal (then T4)."""
        key = effect_key(loop.inbound_id, step, index)
        effect = self.ledger.effects.find(key)
        if effect is None:
            # Refused in T3 (unknown tool, bad arguments): resolved there, read it back.
            for event in reversed(self.ledger.runs.events(run_id(loop.inbound_id))):
                request = event.payload.get("request") or {}
                if event.type == "action_resolved" and request.get("action_id") == action_id(
                    step, index
                ):
                    return tool_content(str(request["status"]), request.get("result"))
            return tool_content("failed", {"error": "the call was not recorded"})
        if effect.state not in TERMINAL_STATES and effect.kind not in self._kinds:
            effect = self._cancel_orphan(effect)
        effect = self._await(effect, interrupt)
        if effect.state is EffectState.DONE:
            TOOL_DONE.hit()
            result = None if effect.result_json is None else json.loads(effect.result_json)
            status = "succeeded"
        elif effect.state is EffectState.REJECTED:
            result = {"error": f"the tool refused the call: {effect.last_error or 'no reason'}"}
            status = "failed"
        elif effect.maybe_sent:
            # Dead or cancelled after an attempt that may have run: nothing truthful to resolve.
            tool = self.tools.get(call["name"])
            side_effect = tool.side_effect if tool is not None else "unknown"
            if side_effect in WORLD_CHANGING:
                loop.unknown.append(action_id(step, index))
            log.warning(
                "turn tool outcome unknown inbound=%s key=%s (%s)",
                loop.inbound_id,
                key,
                effect.last_error,
            )
            return f"{UNKNOWN_OUTCOME} ({effect.last_error or effect.state})"
        else:
            result = {"error": f"the tool did not run: {effect.last_error or effect.state}"}
            status = "not_run"
        self.ledger.runs.turn.resolve_action(
            loop.inbound_id, step, index, status=status, result=result, fence=loop.fence
        )
        return tool_content(status, result)

    def _cancel_orphan(self, effect: Effect) -> Effect:
        """An unfinished call of a tool this gateway no longer runs (a resumed turn, its tool
        gone from the configuration): cancelled, so that the turn can answer instead of
        holding its session for ever. Cancelled while claimed, it counts as maybe sent."""
        reason = f"the tool of kind {effect.kind!r} is not configured in this gateway"
        log.warning("turn tool cancelled key=%s: %s", effect.key, reason)
        try:
            return self.ledger.effects.cancel(effect.key, reason=reason)
        except InvalidState:
            return self.ledger.effects.get(effect.key)  # it ended meanwhile

    def _await(self, effect: Effect, interrupt: Interrupt) -> Effect:
        """``effect`` once terminal, read from the store (_Interrupted if the turn is)."""
        woken = threading.Event()  # the turn is interrupted, or the store saw a commit
        interrupt.on_interrupt(woken.set)
        unsubscribe = self.ledger.store.subscribe_settled(woken.set)
        try:
            while effect.state not in TERMINAL_STATES:
                woken.wait(self.poll_seconds)
                woken.clear()
                if interrupt.is_set():
                    raise ToolWaitInterrupted(effect.key)
                effect = self.ledger.effects.get(effect.key)
        finally:
            unsubscribe()
        return effect


class ToolWaitInterrupted(Exception):
    """The turn was interrupted while it waited for a tool's effect."""


@dataclass
class Conversation:
    """One turn's conversation as it goes: its messages, the steps recorded so far, and the
    world-changing calls whose outcome is unknown (left unresolved)."""

    inbound_id: int
    fence: int
    steps: int
    messages: list[dict[str, Any]]
    unknown: list[str] = dataclasses.field(default_factory=list)
    stopped: bool = False  # the last response asked for tools past max_steps


def response_digest(response: ModelResponse) -> str:
    used: dict[str, Any] = {"text": response.text, "finish_reason": response.finish_reason}
    if response.tool_calls:
        used["tool_calls"] = [[c.id, c.name, c.arguments] for c in response.tool_calls]
    return digest(used)


def usage(response: ModelResponse) -> dict[str, Any]:
    return {} if response.usage is None else dataclasses.asdict(response.usage)
