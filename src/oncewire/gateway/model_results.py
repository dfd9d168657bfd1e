"""What a model call gives back: a complete answer, deltas on the way, or one typed failure.

The seam between the gateway and a model backend: :class:`ModelClient` is what any backend
implements (:class:`oncewire.gateway.model.OpenAIChatClient` is the first), and the types here
are all a caller sees of it. Nothing here does I/O or imports httpx2.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from oncewire.core.errors import OncewireError

__all__ = [
    "Delta",
    "DeltaCallback",
    "Interrupt",
    "ModelBroken",
    "ModelClient",
    "ModelFailure",
    "ModelInterrupted",
    "ModelNotSent",
    "ModelRateLimited",
    "ModelRejected",
    "ModelResponse",
    "ModelUnavailable",
    "ToolCall",
    "Usage",
]

DeltaCallback = Callable[["Delta"], None]


@dataclass(frozen=True)
class Delta:
    """A piece of an answer as it streams: text for previews, or reasoning shown by some models."""

    text: str = ""
    reasoning: str = ""


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for; ``arguments`` is the JSON text exactly as the model wrote it
    (it may be invalid JSON: telling the model so is the caller's job)."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


@dataclass(frozen=True)
class ModelResponse:
    """A complete answer: the server sent a ``finish_reason``. Tool calls are present whatever
    ``finish_reason`` says (some servers say ``stop``)."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str
    usage: Usage | None
    completion_id: str | None
    request_id: str | None
    reasoning: str = ""


class ModelFailure(OncewireError):
    """The model call failed; nothing of it is an answer."""

    code = "model_failure"

    def __init__(self, message: str | None = None, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.request_id: str | None = fields.get("request_id")


class ModelRateLimited(ModelFailure):
    """The model service refused the request for now (429)."""

    code = "model_rate_limited"

    def __init__(self, message: str, *, retry_after_seconds: float | None, **fields: Any) -> None:
        super().__init__(message, retry_after_seconds=retry_after_seconds, **fields)
        self.retry_after_seconds = retry_after_seconds


class ModelNotSent(ModelFailure):
    """The request never left: it is safe to send again."""

    code = "model_not_sent"


class ModelBroken(ModelFailure):
    """The answer did not complete (no finish_reason); text that arrived is not an answer."""

    code = "model_broken"


class ModelRejected(ModelFailure):
    """The model service refused this request for good (4xx); sending it again will not help."""

    code = "model_rejected"


class ModelUnavailable(ModelFailure):
    """The model service failed (5xx, 408 or 409); a later attempt may succeed."""

    code = "model_unavailable"


class ModelInterrupted(ModelFailure):
    """The call was interrupted from another thread before it returned."""

    code = "model_interrupted"


class Interrupt:
    """A one-shot flag another thread raises to end one model call promptly. Once raised, the
    call raises :class:`ModelInterrupted` (a complete answer that raced with it is dropped)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._raised = False
        self._hooks: list[Callable[[], None]] = []

    def interrupt(self) -> None:
        with self._lock:
            self._raised = True
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    def is_set(self) -> bool:
        with self._lock:
            return self._raised

    def on_interrupt(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` when interrupted (at once if that already happened)."""
        with self._lock:
            if not self._raised:
                self._hooks.append(hook)
                return
        hook()


class ModelClient(Protocol):
    """What the gateway asks of a model backend."""

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_delta: DeltaCallback | None = None,
        interrupt: Interrupt | None = None,
    ) -> ModelResponse: ...
