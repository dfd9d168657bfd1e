"""``oncewire.agents.run``: an OpenAI Agents SDK run that survives its process.

:func:`run`, :func:`run_sync` and :func:`run_streamed` are ``agents.Runner.run``,
``run_sync`` and ``run_streamed`` with a ``ledger`` and a ``run_key``: the SDK's own loop runs
the agent, inside a durable scope (:mod:`oncewire.agents.scope`). A few places of the SDK are
seen through it (:mod:`oncewire.agents.patches`), and only inside such a scope (everywhere else
the SDK is untouched):

* the model the run loop resolves for each turn is wrapped in a
  :class:`~oncewire.agents.scope.DurableModel`: each response recorded under
  ``(run_key, step)`` before anything acts on it, and a recorded step returned instead of
  calling the model again;
* a function tool's invocation is an effect performed once (:mod:`oncewire.agents.tools`),
  and so is a call of the SDK's local shell and apply-patch tools (:mod:`oncewire.agents.local`);
* each ``Runner.run`` records in the scope the durable run gives it: a run started while
  another of the same scope is in progress (a guardrail's agent) has steps of its own.

So the same call again with the same ``run_key``, after the process died anywhere, replays what
was recorded and continues where the run was: no recorded model step is requested again, no
tool whose effect is done runs again, and a tool that may have run is retried as a flagged
redelivery. Agents reached by handoff, agents used as tools and the agents guardrails run
resolve their models and tools through the same places, so they are durable as well.

A ``session=`` that is an :class:`~oncewire.agents.OncewireSession` is given to the SDK as the
run's view of it (:mod:`oncewire.agents.memory`): the session as the run found it, and the
items the run adds written with its step records, each once however often the run is resumed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from oncewire.core.errors import ConfigurationError, WrongType
from oncewire.core.extras import refusal
from oncewire.dispatch.retry import RetryPolicy
from oncewire.ledger import Ledger

try:
    from agents import Agent, Runner
    from agents.result import RunResult, RunResultStreaming
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("agents", "oncewire.agents", exc) from exc

from oncewire.agents import memory, patches
from oncewire.agents import scope as scopes
from oncewire.agents.session import OncewireSession

__all__ = ["run", "run_streamed", "run_sync"]


def _scope(
    ledger: Ledger | str,
    run_key: str,
    *,
    max_attempts: int,
    retry: RetryPolicy | None,
    wait_seconds: float | None,
    concurrency: int,
    lease_seconds: float,
) -> scopes.Scope:
    if isinstance(ledger, str):
        ledger = Ledger(ledger)
    if not isinstance(ledger, Ledger):
        raise WrongType(f"ledger is an oncewire.Ledger or its path, not {type(ledger).__name__}")
    if not isinstance(run_key, str) or not run_key:
        raise ConfigurationError("run_key is the run's stable key: a non-empty string")
    if scopes.current_scope() is not None:
        raise ConfigurationError(
            "oncewire.agents.run inside a durable run: call agents.Runner.run there (it is "
            "durable already, keyed by the tool call it runs in)"
        )
    patches.install()
    return scopes.Scope(
        ledger,
        run_key,
        max_attempts=max_attempts,
        retry=retry,
        wait_seconds=wait_seconds,
        concurrency=concurrency,
        lease_seconds=lease_seconds,
    )


async def run(
    agent: Agent[Any],
    input: Any,
    *,
    ledger: Ledger | str,
    run_key: str,
    max_attempts: int = 3,
    retry: RetryPolicy | None = None,
    wait_seconds: float | None = None,
    concurrency: int = 8,
    lease_seconds: float = 30.0,
    **runner_kwargs: Any,
) -> RunResult:
    """``await Runner.run(agent, input, **runner_kwargs)``, durable under ``run_key`` on
    ``ledger`` (see the module docstring). ``max_attempts`` bounds the attempts of a tool that
    raises; ``retry`` is the dispatcher's schedule between them; ``wait_seconds`` bounds the
    wait for one tool call (None: until it ends), then
    :class:`~oncewire.toolcalls.ToolCallPending`; ``concurrency`` tools of the run's calls run
    at once in this process, and as many of each run nested inside a tool (an agent used as a
    tool), which never waits for a slot its parent holds; ``lease_seconds`` is each claim's
    lease. Runs with other settings get dispatchers of their own."""
    scope = _scope(
        ledger,
        run_key,
        max_attempts=max_attempts,
        retry=retry,
        wait_seconds=wait_seconds,
        concurrency=concurrency,
        lease_seconds=lease_seconds,
    )
    session = _remember(scope, runner_kwargs)
    token = scopes.enter(scope)
    try:
        result = await Runner.run(agent, input, **runner_kwargs)
    except scopes.RunDiverged:
        raise
    except BaseException:
        if session is not None:
            await asyncio.to_thread(session.flush)
        raise
    finally:
        scopes.leave(token)
    if session is not None:
        await asyncio.to_thread(session.flush)
    return result


def run_sync(
    agent: Agent[Any],
    input: Any,
    *,
    ledger: Ledger | str,
    run_key: str,
    max_attempts: int = 3,
    retry: RetryPolicy | None = None,
    wait_seconds: float | None = None,
    concurrency: int = 8,
    lease_seconds: float = 30.0,
    **runner_kwargs: Any,
) -> RunResult:
    """:func:`run` as ``Runner.run_sync``: for a caller without an event loop."""
    scope = _scope(
        ledger,
        run_key,
        max_attempts=max_attempts,
        retry=retry,
        wait_seconds=wait_seconds,
        concurrency=concurrency,
        lease_seconds=lease_seconds,
    )
    session = _remember(scope, runner_kwargs)
    token = scopes.enter(scope)
    try:
        result = Runner.run_sync(agent, input, **runner_kwargs)
    except scopes.RunDiverged:
        raise
    except BaseException:
        if session is not None:
            session.flush()
        raise
    finally:
        scopes.leave(token)
    if session is not None:
        session.flush()
    return result


def run_streamed(
    agent: Agent[Any],
    input: Any,
    *,
    ledger: Ledger | str,
    run_key: str,
    max_attempts: int = 3,
    retry: RetryPolicy | None = None,
    wait_seconds: float | None = None,
    concurrency: int = 8,
    lease_seconds: float = 30.0,
    **runner_kwargs: Any,
) -> RunResultStreaming:
    """:func:`run` as ``Runner.run_streamed`` (called inside a running event loop; consume
    ``result.stream_events()``). A step recorded before is not streamed again: it arrives as
    one ``raw_response_event`` of type ``response.completed`` holding the whole recorded
    response, followed by the run item events of its items, as the SDK emits them for any
    step; its text is never sent again as deltas (docs/agents.md, "Streaming")."""
    scope = _scope(
        ledger,
        run_key,
        max_attempts=max_attempts,
        retry=retry,
        wait_seconds=wait_seconds,
        concurrency=concurrency,
        lease_seconds=lease_seconds,
    )
    session = _remember(scope, runner_kwargs)
    token = scopes.enter(scope)
    try:
        # The SDK starts the run's task here: it keeps a copy of the context, scope included.
        result = Runner.run_streamed(agent, input, **runner_kwargs)
    finally:
        scopes.leave(token)
    if session is not None:
        _flush_after_stream(result, session)
    return result


def _remember(scope: scopes.Scope, runner_kwargs: dict[str, Any]) -> memory.RunSession | None:
    """Give the SDK the run's view of an OncewireSession (:mod:`oncewire.agents.memory`)."""
    given = runner_kwargs.get("session")
    if given is None:
        return None
    bound = memory.bind(given, scope.ledger)
    if not isinstance(bound, OncewireSession):
        return None  # another Session: the SDK keeps it, outside the run's transactions
    view = memory.RunSession(bound, scope)
    scope.session = view
    runner_kwargs["session"] = view
    return view


def _flush_after_stream(result: RunResultStreaming, session: memory.RunSession) -> None:
    """Write the last turn's items once the streamed run's events are all consumed."""
    events = result.stream_events

    async def stream_events() -> AsyncIterator[Any]:
        diverged = False
        try:
            async for event in events():
                yield event
        except scopes.RunDiverged:
            diverged = True
            raise
        finally:
            if not diverged:
                await asyncio.to_thread(session.flush)

    object.__setattr__(result, "stream_events", stream_events)
