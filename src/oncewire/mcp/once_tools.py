"""Tools of an ``mcp`` SDK server that run each call once per key: :func:`once`.

::

    server = MCPServer("tickets")
    receipts = oncewire.Receipts("tickets.db")

    @server.tool()
    @oncewire.mcp.once(receipts)
    def create_ticket(title: str) -> dict[str, int]:
        tx = oncewire.mcp.current_call().tx        # the receipt's transaction
        row = tx.execute("INSERT INTO tickets (title) VALUES (:t) RETURNING id", {"t": title})
        return {"ticket": row.fetchone()[0]}

    oncewire.mcp.declare_deduplicates(server)     # capabilities.experimental says so

Invariant: for one key, the tool's body commits at most once, together with its receipt (the
call's result, converted to the ``CallToolResult`` the SDK would send). A call's key is
``params._meta["io.oncewire/idempotency-key"]``, else SEP-3182's ``params.idempotencyKey``
(``key=`` takes it from the arguments instead). The key is bound to the payload ``{"tool":
name, "arguments": arguments}`` as the request sent them: a repeat replays the stored result
without running the body; another payload under the key is refused as a tool error that names
the conflict, and nothing stored changes. A call without a key runs as the SDK runs it
(nothing deduplicated, nothing stored) unless ``required=True`` refuses it.

``once`` goes under ``@server.tool()``: the SDK reads the decorated function's signature (its
parameters, their annotations and its return annotation make the tool's input and output
schemas), and the wrapper keeps it. To read the request, the wrapper asks the SDK for the
tool's :class:`~mcp.server.mcpserver.Context` through a keyword-only parameter it adds
(``oncewire_context``, which the SDK fills and leaves out of the schema), or uses the tool's own
``Context`` parameter when it has one.

(This module is not named ``once``: importing a package's submodule binds its name on the
package, and ``oncewire.mcp.once`` is the decorator.)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

from oncewire.aio.receipts import AsyncReceipts
from oncewire.core.canonical import loads
from oncewire.core.errors import ConfigurationError, PayloadConflict
from oncewire.core.extras import refusal
from oncewire.core.limits import MAX_KEY_CHARS, check_name
from oncewire.mcp import call as calls
from oncewire.mcp.call import ToolCall
from oncewire.mcp.protocol import DEDUPLICATES, IDEMPOTENCY_KEY, REDELIVERY, SEP_IDEMPOTENCY_KEY
from oncewire.receipts.service import Receipts

try:
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.mcpserver.utilities.context_injection import find_context_parameter
    from mcp.types import CallToolResult, InputRequiredResult, ServerCapabilities
except ImportError as exc:  # pragma: no cover - the bare install test covers it
    raise refusal("mcp", "oncewire.mcp.once", exc) from exc

__all__ = ["DEDUPLICATES_VERSION", "declare_deduplicates", "once", "runs_once"]

F = TypeVar("F", bound=Callable[..., Any])
KeyOf = Callable[[Mapping[str, Any]], "str | None"]

DEDUPLICATES_VERSION = 1
CONTEXT_PARAMETER = "oncewire_context"  # the parameter the wrapper adds when the tool has none
_ONCE_MARK = "__oncewire_once__"
_DECLARED_MARK = "_oncewire_deduplicates"

logger = logging.getLogger("oncewire.mcp")


def once(
    receipts: Receipts | AsyncReceipts,
    *,
    key: KeyOf | None = None,
    required: bool = False,
) -> Callable[[F], F]:
    """A decorator, under ``@server.tool()``, that runs the tool's body once per key.

    ``receipts`` is the server's receipt store (a :class:`~oncewire.Receipts`, or an open
    :class:`~oncewire.aio.AsyncReceipts`); the same store serves sync and ``async def`` tools.
    ``key(arguments)``, when given, returns the call's key from its arguments (``None`` to fall
    back to the request's key). ``required=True`` refuses a call without a key, as a tool error,
    instead of running it as the SDK would.
    """
    if not isinstance(receipts, Receipts | AsyncReceipts):
        raise ConfigurationError(
            f"once() takes a Receipts or an AsyncReceipts, not {type(receipts).__name__}"
        )
    if key is not None and not callable(key):
        raise ConfigurationError(f"once(key=...) takes a function of the arguments, not {key!r}")

    def decorate(fn: F) -> F:
        return cast(F, _Once(receipts, key, bool(required)).wrap(fn))

    return decorate


def runs_once(fn: Callable[..., Any]) -> bool:
    """True for a function decorated with :func:`once`."""
    return bool(getattr(fn, _ONCE_MARK, False))


def declare_deduplicates(server: MCPServer[Any]) -> None:
    """Advertise ``capabilities.experimental["io.oncewire/deduplicates"] = {"version": 1}``.

    A proxy that reads it may redeliver a call whose outcome it does not know, flagged, instead
    of answering "outcome unknown": so every tool of the server must be safe to repeat. Call it
    after registering the tools: a tool that neither runs once (:func:`once`) nor is annotated
    ``readOnlyHint`` is a :class:`~oncewire.errors.ConfigurationError` here; one registered
    later withholds the capability (logged as a warning) rather than advertise it falsely.
    Declaring twice changes nothing.
    """
    if not isinstance(server, MCPServer):
        raise ConfigurationError(
            f"declare_deduplicates() takes an mcp MCPServer, not {type(server).__name__}"
        )
    unsafe = _tools_not_running_once(server)
    if unsafe:
        raise ConfigurationError(
            "declare_deduplicates(): these tools neither run once (oncewire.mcp.once) nor are "
            f"annotated readOnlyHint, so a redelivery could repeat them: {', '.join(unsafe)}"
        )
    # The SDK has no public seam for experimental capabilities on an MCPServer: its initialize
    # and server/discover answers both come from the low-level server's get_capabilities.
    lowlevel = server._lowlevel_server
    if getattr(lowlevel, _DECLARED_MARK, False):
        return
    original = lowlevel.get_capabilities

    @functools.wraps(original)
    def get_capabilities(*args: Any, **kwargs: Any) -> ServerCapabilities:
        capabilities = original(*args, **kwargs)
        unsafe = _tools_not_running_once(server)
        if unsafe:
            logger.warning(
                "server %r does not advertise %s: tools %s were registered after "
                "declare_deduplicates() and do not run once",
                server.name,
                DEDUPLICATES,
                ", ".join(unsafe),
            )
            return capabilities
        experimental = dict(capabilities.experimental or {})
        experimental[DEDUPLICATES] = {"version": DEDUPLICATES_VERSION}
        return capabilities.model_copy(update={"experimental": experimental})

    lowlevel.get_capabilities = get_capabilities  # type: ignore[method-assign]
    setattr(lowlevel, _DECLARED_MARK, True)


def _tools_not_running_once(server: MCPServer[Any]) -> list[str]:
    unsafe = []
    for tool in server._tool_manager.list_tools():
        read_only = tool.annotations is not None and tool.annotations.read_only_hint is True
        if not read_only and not runs_once(tool.fn):
            unsafe.append(tool.name)
    return sorted(unsafe)


class _NotFinal(Exception):
    """The body asked the client for input (an ``InputRequiredResult``): the call is not
    finished, so its writes roll back with the receipt, and the request is passed on."""

    def __init__(self, result: InputRequiredResult) -> None:
        super().__init__("input required")
        self.result = result


@dataclasses.dataclass
class _Once:
    receipts: Receipts | AsyncReceipts
    key_of: KeyOf | None
    required: bool
    _async: AsyncReceipts | None = None

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        signature, context_name, added = _signature_with_context(fn)
        fallback_name = getattr(fn, "__name__", "tool")

        def begin(kwargs: dict[str, Any]) -> tuple[ToolCall, Context[Any, Any]]:
            context = kwargs.pop(context_name) if added else kwargs[context_name]
            return self._call_of(context, fallback_name), context

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_tool(**kwargs: Any) -> Any:
                call, context = begin(kwargs)
                if call.key is None:
                    token = calls.enter(call)
                    try:
                        return await fn(**kwargs)
                    finally:
                        calls.leave(token)
                return await self._run_async(call, context, lambda: fn(**kwargs))

            wrapper: Callable[..., Any] = async_tool
        else:

            @functools.wraps(fn)
            def sync_tool(**kwargs: Any) -> Any:
                call, context = begin(kwargs)  # on the SDK's worker thread
                if call.key is None:
                    token = calls.enter(call)
                    try:
                        return fn(**kwargs)
                    finally:
                        calls.leave(token)
                return self._run_sync(call, context, lambda: fn(**kwargs))

            wrapper = sync_tool
        wrapper.__signature__ = signature  # type: ignore[attr-defined]
        wrapper.__annotations__ = _annotations(signature)
        setattr(wrapper, _ONCE_MARK, True)
        return wrapper

    def _call_of(self, context: Context[Any, Any], fallback_name: str) -> ToolCall:
        try:
            params: Mapping[str, Any] = context.request_context.params or {}
        except ValueError:  # called outside a request (server.call_tool without a context)
            params = {}
        name = params.get("name")
        tool = name if isinstance(name, str) else fallback_name
        arguments = params.get("arguments")
        arguments = arguments if isinstance(arguments, Mapping) else {}
        meta = params.get("_meta")
        meta = meta if isinstance(meta, Mapping) else {}
        key: object = None
        if self.key_of is not None:
            key = self.key_of(arguments)
        if key is None:
            key = meta.get(IDEMPOTENCY_KEY, params.get(SEP_IDEMPOTENCY_KEY))
        checked: str | None = None
        if key is None:
            if self.required:
                raise ToolError(
                    f"{tool} runs each call once and needs an idempotency key: send one in "
                    f"params._meta[{IDEMPOTENCY_KEY!r}]; the call was not run"
                )
        else:
            try:
                checked = check_name("an idempotency key", key, MAX_KEY_CHARS)
            except ConfigurationError as exc:
                raise ToolError(f"{exc}; the call was not run") from None
        return ToolCall(
            tool=tool,
            arguments=arguments,
            key=checked,
            redelivery=meta.get(REDELIVERY) is True,
        )

    def _run_sync(
        self, call: ToolCall, context: Context[Any, Any], body: Callable[[], Any]
    ) -> CallToolResult | InputRequiredResult:
        receipts = self.receipts.sync if isinstance(self.receipts, AsyncReceipts) else self.receipts
        convert = _converter(context, call.tool)

        def work(tx: Any) -> Any:
            token = calls.enter(dataclasses.replace(call, tx=tx))
            try:
                result = body()
            finally:
                calls.leave(token)
            return _stored(convert(result))

        assert call.key is not None
        try:
            outcome = receipts.run_once(call.key, call.payload, work)
        except _NotFinal as passed:
            return passed.result
        except PayloadConflict as exc:
            if exc.key != call.key:  # the body's own receipts, not this call's
                raise
            raise ToolError(_conflict(receipts, call, exc)) from None
        except ConfigurationError as exc:  # a payload too large to store, before any work
            raise ToolError(f"{exc}; the call was not run") from None
        return _replayed(outcome.result)

    async def _run_async(
        self, call: ToolCall, context: Context[Any, Any], body: Callable[[], Awaitable[Any]]
    ) -> CallToolResult | InputRequiredResult:
        receipts = self._async_receipts()
        convert = _converter(context, call.tool)

        async def work(tx: Any) -> Any:
            token = calls.enter(dataclasses.replace(call, tx=tx))
            try:
                result = await body()
            finally:
                calls.leave(token)
            return _stored(convert(result))

        assert call.key is not None
        try:
            outcome = await receipts.run_once(call.key, call.payload, work)
        except _NotFinal as passed:
            return passed.result
        except PayloadConflict as exc:
            if exc.key != call.key:
                raise
            raise ToolError(_conflict(receipts.sync, call, exc)) from None
        except ConfigurationError as exc:
            raise ToolError(f"{exc}; the call was not run") from None
        return _replayed(outcome.result)

    def _async_receipts(self) -> AsyncReceipts:
        if isinstance(self.receipts, AsyncReceipts):
            return self.receipts
        if self._async is None:  # one pool of receipt threads for this tool's calls
            self._async = AsyncReceipts(self.receipts)
        return self._async


def _signature_with_context(fn: Callable[..., Any]) -> tuple[inspect.Signature, str, bool]:
    """The signature the SDK should read: ``fn``'s own (annotations evaluated, as the SDK
    evaluates them), plus a keyword-only ``Context`` parameter when ``fn`` has none."""
    if not callable(fn):
        raise ConfigurationError(f"once() decorates a tool function, not {fn!r}")
    try:
        signature = inspect.signature(fn, eval_str=True)
    except NameError as exc:
        raise ConfigurationError(
            f"once(): the annotations of {getattr(fn, '__name__', fn)!r} cannot be evaluated "
            f"({exc}); the SDK needs them for the tool's schema"
        ) from exc
    existing = find_context_parameter(fn)
    if existing is not None:
        return signature, existing, False
    if CONTEXT_PARAMETER in signature.parameters:
        raise ConfigurationError(
            f"once(): {fn.__name__!r} has a parameter named {CONTEXT_PARAMETER!r} that is not "
            "annotated Context; oncewire adds a parameter of that name to read the request"
        )
    parameters = list(signature.parameters.values())
    added = inspect.Parameter(CONTEXT_PARAMETER, inspect.Parameter.KEYWORD_ONLY, annotation=Context)
    at = len(parameters)
    if parameters and parameters[-1].kind is inspect.Parameter.VAR_KEYWORD:
        at -= 1
    parameters.insert(at, added)
    return signature.replace(parameters=parameters), CONTEXT_PARAMETER, True


def _annotations(signature: inspect.Signature) -> dict[str, Any]:
    found = {
        p.name: p.annotation
        for p in signature.parameters.values()
        if p.annotation is not inspect.Parameter.empty
    }
    if signature.return_annotation is not inspect.Signature.empty:
        found["return"] = signature.return_annotation
    return found


def _converter(context: Context[Any, Any], name: str) -> Callable[[Any], Any]:
    """The SDK's own conversion of this tool's return value into its ``CallToolResult``, so
    that what the receipt stores is what the SDK sends (and a replay sends the same)."""
    tool = context.mcp_server._tool_manager.get_tool(name)
    if tool is None:  # pragma: no cover - the SDK only calls registered tools
        raise ToolError(f"unknown tool {name!r}")
    return tool.fn_metadata.convert_result


def _stored(result: Any) -> Any:
    if isinstance(result, InputRequiredResult):
        raise _NotFinal(result)
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def _replayed(stored: Any) -> CallToolResult:
    return CallToolResult.model_validate(stored)


def _conflict(receipts: Receipts, call: ToolCall, exc: PayloadConflict) -> str:
    try:
        bound = loads(receipts.get(exc.key).payload_json)
    except Exception:  # the refusal stands on its own; what the key is bound to is a detail
        bound = None
    if isinstance(bound, dict) and bound.get("tool") != call.tool:
        what = f"a call of {bound.get('tool')!r}"
    else:
        what = f"a call of {call.tool!r} with other arguments"
    return (
        f"payload conflict: the idempotency key {exc.key!r} was already used for {what} "
        f"(payload {exc.stored_digest[:12]}, this call's {exc.offered_digest[:12]}); this "
        "call was not run and nothing was changed. Send a new key for a new call."
    )
