"""A durable run's scope, and the model that answers from its record.

A :class:`Scope` is one durable run as the code inside it sees it (a context variable): the
ledger, the key its steps and tool calls are recorded under, and how many model responses it
has had. :func:`oncewire.agents.run` opens one keyed by the caller's ``run_key``; a tool call
performed inside it opens one keyed by the call's effect key (one level deeper: its tool calls
are performed by the dispatcher of that depth, :mod:`oncewire.agents.tools`), so that a run
inside a tool (an agent used as a tool, or a ``Runner.run`` a tool makes) is durable too, its
steps counted apart from its parent's and the same on every redelivery.

Every ``Runner.run`` started in a scope asks it for the scope to record in
(:meth:`Scope.begin_run`): the scope itself when none of its runs is in progress (the durable
run's own run, a tool's run, runs a tool makes one after another); else a scope of its own,
keyed by what started it (the guardrail's name, or the agent's) and how many such runs the
scope started before (:func:`nested_key`). So a guardrail's agent, running concurrently with
the model call of the run it guards, never shares its step numbers, and gets the same key on
every attempt of the run.

:class:`DurableModel` wraps each model the SDK resolves in a scope. A call is step ``n`` of its
scope, ``n`` being how many responses the scope has had (a failed call the SDK retries keeps its
number). When step ``n`` is recorded, its response is returned and the model is not called;
else the model is called and its response recorded, with one effect accepted per call of a
function tool it asks for, in one transaction, before the SDK sees it (:data:`STEP_RECORDED`).
A recorded step answered a request of the same agent, with the same instructions, input items
and tool names (:class:`oncewire.agents.responses.Request`), or the run is refused
(:class:`RunDiverged`) instead of replaying an answer to another question. A run with a
session (:mod:`oncewire.agents.memory`) appends the session items added since its last step in
the same transaction, and step 0's record keeps the session's length as the run found it.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from oncewire.core import crash
from oncewire.core.errors import OncewireError
from oncewire.core.extras import refusal
from oncewire.dispatch.retry import RetryPolicy
from oncewire.ledger import Ledger
from oncewire.storage import AgentStore
from oncewire.storage.agents import AgentStep
from oncewire.toolcalls import parse_arguments

try:
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.tool import FunctionTool
    from openai.types.responses import (
        ResponseCompletedEvent,
        ResponseFunctionToolCall,
        ResponseOutputItemDoneEvent,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("agents", "oncewire.agents", exc) from exc

from oncewire.agents import memory, responses

__all__ = [
    "KIND",
    "STEP_RECORDED",
    "DurableModel",
    "RunDiverged",
    "Scope",
    "call_key",
    "current_scope",
    "nested_key",
]

KIND = "agents.tool"  # the effect kind of every function tool call of a durable run

STEP_RECORDED = crash.register(
    "agents.step_recorded",
    "a model response and its function tool calls' effects are committed; the SDK has not "
    "seen the response",
)

_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar(
    "oncewire_agents_scope", default=None
)


class RunDiverged(OncewireError):
    """A resumed run asked its model something other than what the recorded step answered:
    the agent, its instructions, its tools' answers or the run's input changed under the same
    ``run_key``. Nothing is replayed for a question it did not answer."""

    code = "agents_run_diverged"

    def __init__(self, run_key: str, step: int) -> None:
        super().__init__(
            f"step {step} of the agent run {run_key!r} was recorded for another request (the "
            "agent, its instructions, its tools or the input items differ); start a new "
            "run_key, or delete the steps",
            run_key=run_key,
            step=step,
        )
        self.run_key = run_key
        self.step = step


def call_key(scope_key: str, call_id: str) -> str:
    """The effect key of tool call ``call_id`` in the run (or tool call) ``scope_key``."""
    return f"agents/{quote(scope_key, safe='')}/{quote(call_id, safe='')}"


def nested_key(scope_key: str, label: str, ordinal: int) -> str:
    """The key of the ``ordinal``-th run labelled ``label`` started in ``scope_key`` while
    another of its runs was in progress. Its ``#`` (quoted in any call id) keeps it apart from
    every :func:`call_key`."""
    return f"agents/{quote(scope_key, safe='')}/{quote(label, safe=':')}#{ordinal}"


@dataclass
class Scope:
    """One durable run (or a tool call's run inside it); see the module docstring."""

    ledger: Ledger
    key: str
    max_attempts: int = 3
    retry: RetryPolicy | None = None
    wait_seconds: float | None = None
    concurrency: int = 8
    lease_seconds: float = 30.0
    depth: int = 0  # how many tool calls' performing this scope is inside
    steps: int = 0  # the responses this scope has had
    recorded: dict[int, AgentStep] | None = None
    session: Any = None  # the run's RunSession (oncewire.agents.memory), top-level runs only
    running: bool = False  # a run recording in this scope is in progress
    _ordinals: dict[str, int] = field(default_factory=dict)  # runs of each label started
    _models: dict[tuple[int, str], DurableModel] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _child(self, key: str, depth: int) -> Scope:
        return Scope(
            self.ledger,
            key,
            max_attempts=self.max_attempts,
            retry=self.retry,
            wait_seconds=self.wait_seconds,
            concurrency=self.concurrency,
            lease_seconds=self.lease_seconds,
            depth=depth,
        )

    def inside(self, key: str) -> Scope:
        """The scope of a run inside the tool call whose effect key is ``key``."""
        return self._child(key, self.depth + 1)

    def begin_run(self, label: str) -> Scope:
        """The scope a ``Runner.run`` starting now records its steps in (see the module
        docstring); :meth:`end_run` of it when that run ends."""
        with self._lock:
            if not self.running:
                self.running = True
                return self
            ordinal = self._ordinals.get(label, 0)
            self._ordinals[label] = ordinal + 1
        nested = self._child(nested_key(self.key, label, ordinal), self.depth)
        nested.running = True
        return nested

    def end_run(self) -> None:
        """The run :meth:`begin_run` gave this scope to has ended."""
        with self._lock:
            self.running = False

    def model(self, inner: Model, agent: str) -> Model:
        """``inner`` answering from this scope's record for the agent named ``agent`` (one
        wrapper per model and agent, kept)."""
        if isinstance(inner, DurableModel):
            return inner
        with self._lock:
            wrapper = self._models.get((id(inner), agent))
            if wrapper is None or wrapper.inner is not inner:
                wrapper = self._models[(id(inner), agent)] = DurableModel(inner, self, agent)
            return wrapper

    async def recorded_step(self, step: int) -> AgentStep | None:
        if self.recorded is None:
            listed = await asyncio.to_thread(self.ledger.store.agent_list_steps, self.key)
            self.recorded = {row.step: row for row in listed}
        return self.recorded.get(step)

    def record(
        self, step: int, digest: str, response: ModelResponse, tools: list[Any]
    ) -> AgentStep:
        """Record ``response`` as step ``step`` and accept its function tool calls' effects,
        in one transaction; the step as stored (another process's, if it was first)."""
        names = {tool.name for tool in tools if isinstance(tool, FunctionTool)}
        store: AgentStore = self.ledger.store
        session = self.session
        response_json = responses.encode_response(response)
        if session is not None and step == 0:
            response_json = memory.with_base(response_json, session)
        written = 0
        with self.ledger.transaction() as tx:
            stored, inserted = store.agent_record_step_in_tx(
                tx.store_transaction,
                run_key=self.key,
                step=step,
                request_digest=digest,
                response_json=response_json,
                now=self.ledger.clock.now(),
            )
            if session is not None:
                # The items the run added since its last step (its input, the turn before)
                # are committed with this step, or were by the process that recorded it.
                written = len(session.pending)
                if inserted:
                    written = session.write_in_tx(tx.store_transaction)
            for item in response.output:
                if not isinstance(item, ResponseFunctionToolCall) or item.name not in names:
                    continue  # hosted tools, handoffs, and calls the SDK will refuse
                if not item.call_id or getattr(item, "namespace", None):
                    continue
                arguments, problem = parse_arguments(item.arguments or "")
                if problem is None:
                    tx.accept(
                        call_key(self.key, item.call_id),
                        KIND,
                        {"tool": item.name, "arguments": arguments},
                        max_attempts=self.max_attempts,
                    )
        if session is not None:
            session.written(written)
        if self.recorded is not None:
            self.recorded[step] = stored
        return stored


def current_scope() -> Scope | None:
    """The durable run the calling code is inside, if any."""
    return _SCOPE.get()


def enter(scope: Scope | None) -> contextvars.Token[Scope | None]:
    return _SCOPE.set(scope)


def leave(token: contextvars.Token[Scope | None]) -> None:
    _SCOPE.reset(token)


class DurableModel(Model):
    """A model answering from its scope's record first (see the module docstring)."""

    def __init__(self, inner: Model, scope: Scope, agent: str) -> None:
        self.inner = inner
        self.scope = scope
        self.agent = agent

    async def close(self) -> None:
        await self.inner.close()

    async def _cleanup_on_run_end(self, owner: object) -> None:
        await self.inner._cleanup_on_run_end(owner)

    def get_retry_advice(self, request: Any) -> Any:
        return self.inner.get_retry_advice(request)

    def _request(
        self, system_instructions: str | None, input: Any, tools: list[Any], handoffs: list[Any]
    ) -> responses.Request:
        return responses.Request(self.agent, system_instructions, input, tools, handoffs)

    async def _replayed(self, request: responses.Request) -> tuple[int, ModelResponse | None]:
        step = self.scope.steps
        stored = await self.scope.recorded_step(step)
        if stored is None:
            return step, None
        if not request.answered_by(stored.request_digest):
            raise RunDiverged(self.scope.key, step)
        return step, responses.decode_response(stored.response_json)

    async def _record(
        self, step: int, request: responses.Request, response: ModelResponse, tools: list[Any]
    ) -> ModelResponse:
        stored = await asyncio.to_thread(self.scope.record, step, request.digest, response, tools)
        STEP_RECORDED.hit()
        if not request.answered_by(stored.request_digest):
            raise RunDiverged(self.scope.key, step)
        return responses.decode_response(stored.response_json)

    async def get_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        request = self._request(system_instructions, input, tools, handoffs)
        step, replayed = await self._replayed(request)
        if replayed is None:
            fresh = await self.inner.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )
            replayed = await self._record(step, request, fresh, tools)
        self.scope.steps = step + 1
        return replayed

    async def stream_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> AsyncIterator[Any]:
        request = self._request(system_instructions, input, tools, handoffs)
        step, replayed = await self._replayed(request)
        if replayed is not None:
            self.scope.steps = step + 1
            for event in responses.replay_events(replayed):
                yield event
            return
        items: list[Any] = []
        stream = self.inner.stream_response(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )
        try:
            async for event in stream:
                if isinstance(event, ResponseOutputItemDoneEvent):
                    items.append(event.item)
                if isinstance(event, ResponseCompletedEvent):
                    fresh = responses.completed_response(event, items)
                    stored = await self._record(step, request, fresh, tools)
                    self.scope.steps = step + 1
                    if json.loads(responses.encode_response(fresh)) != json.loads(
                        responses.encode_response(stored)
                    ):
                        # Another process recorded this step first: the SDK acts on its answer.
                        for replay in responses.replay_events(stored):
                            yield replay
                        return
                yield event
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
