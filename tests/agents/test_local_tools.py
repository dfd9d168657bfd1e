"""The SDK's local tools in a durable run, on both backends: a ShellTool with a local executor, a
LocalShellTool and an ApplyPatchTool. Each call is an effect keyed by the run and the model's
call id, performed once: an uninterrupted run records one effect per call, and the same call
again with the run's key answers from the store without running the command (or the editor)
again; an executor that keeps raising is told to the model as an unknown outcome, one that
refuses the call as a refusal, once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, ApplyPatchTool, LocalShellTool, Runner, ShellTool
from agents.editor import ApplyPatchOperation, ApplyPatchResult
from agents.items import ModelResponse, ToolCallOutputItem
from agents.testing import ModelStep, ScriptedModel, assistant_message
from agents.tool import ShellCallOutcome, ShellCommandOutput, ShellResult
from agents.usage import Usage
from openai.types.responses import ResponseApplyPatchToolCall, ResponseFunctionShellToolCall
from openai.types.responses.response_output_item import LocalShellCall

import oncewire
from oncewire import agents as durable
from oncewire.agents.responses import replay_events
from oncewire.dispatch.retry import RetryPolicy
from oncewire.storage.records import EffectState

RETRY = RetryPolicy(base_seconds=0.01, cap_seconds=0.05)


def _calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _answering(call: Any, output_type: str) -> list[Any]:
    items = call.input if isinstance(call.input, list) else []
    outputs = [i for i in items if isinstance(i, dict) and i.get("type") == output_type]
    return [assistant_message(f"done after {len(outputs)}")] if outputs else []


def _step(answer: Any, mode: str) -> ModelStep:
    """A scripted step answering ``answer(call)``; streamed (the SDK's automatic streaming does
    not stream shell calls) as one ``response.completed`` with the whole response."""
    if mode != "streamed":
        return ModelStep.respond(answer)

    async def stream(call: Any) -> AsyncIterator[Any]:
        for event in replay_events(ModelResponse(answer(call), Usage(), "resp-1")):
            yield event

    return ModelStep.stream(stream)


def _shell_call(call_id: str, command: str) -> ResponseFunctionShellToolCall:
    return ResponseFunctionShellToolCall(
        id=f"sh-{call_id}",
        call_id=call_id,
        type="shell_call",
        status="completed",
        action={"commands": [command]},  # type: ignore[arg-type]
    )


def _shell_agent(executor: Any, mode: str = "sync") -> Agent[Any]:
    def answer(call: Any) -> Any:
        return _answering(call, "shell_call_output") or [
            _shell_call("shell-1", "echo one"),
            _shell_call("shell-2", "echo two"),
        ]

    model = ScriptedModel([_step(answer, mode) for _ in range(2)])
    return Agent(name="ops", model=model, tools=[ShellTool(executor=executor)])


def _outputs(result: Any) -> list[Any]:
    return [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]


def _run(agent: Agent[Any], ledger: oncewire.Ledger, run_key: str, mode: str) -> Any:
    if mode == "sync":
        return durable.run_sync(agent, "go", ledger=ledger, run_key=run_key, retry=RETRY)

    async def streamed() -> Any:
        result = durable.run_streamed(agent, "go", ledger=ledger, run_key=run_key, retry=RETRY)
        async for _ in result.stream_events():
            pass
        return result

    if mode == "streamed":
        return asyncio.run(streamed())
    return asyncio.run(durable.run(agent, "go", ledger=ledger, run_key=run_key, retry=RETRY))


def _effects(ledger: oncewire.Ledger) -> dict[str, EffectState]:
    return {e.key: e.state for e in ledger.effects.list(limit=100)}


@pytest.mark.parametrize("mode", ["sync", "async", "streamed"])
def test_each_shell_call_is_one_effect_and_a_second_call_does_not_run_the_commands_again(
    tmp_path: Path, db: str, mode: str
) -> None:
    log = tmp_path / "ran.log"

    def executor(request: Any) -> str:
        attempt = durable.current_attempt()
        with open(log, "a") as out:
            out.write(f"{attempt.key} {attempt.redelivery} {request.data.action.commands[0]}\n")
        return f"ran {request.data.action.commands[0]}"

    ledger = oncewire.Ledger(db)
    try:
        first = _run(_shell_agent(executor, mode), ledger, "shell-run", mode)
        again = _run(_shell_agent(executor, mode), ledger, "shell-run", mode)
        assert first.final_output == again.final_output == "done after 2"
        assert _outputs(first) == _outputs(again) == ["ran echo one", "ran echo two"]
        assert _calls(log) == [
            "agents/shell-run/shell-1 False echo one",
            "agents/shell-run/shell-2 False echo two",
        ]
        assert _effects(ledger) == {
            "agents/shell-run/shell-1": EffectState.DONE,
            "agents/shell-run/shell-2": EffectState.DONE,
        }
        effect = ledger.effects.get("agents/shell-run/shell-1")
        assert effect.kind == "agents.tool"
        assert effect.payload["tool"] == "shell"
        assert effect.payload["arguments"]["commands"] == ["echo one"]
    finally:
        ledger.close()


def test_a_structured_shell_result_is_given_back_as_the_same_result(db: str) -> None:
    runs: list[str] = []

    async def executor(request: Any) -> ShellResult:
        runs.append(request.data.call_id)
        command = request.data.action.commands[0]
        return ShellResult(
            output=[
                ShellCommandOutput(
                    stdout=f"out of {command}",
                    stderr="warned",
                    outcome=ShellCallOutcome(type="exit", exit_code=3),
                    command=command,
                )
            ],
            provider_data={"host": "here"},
        )

    ledger = oncewire.Ledger(db)
    try:
        first = _run(_shell_agent(executor), ledger, "structured", "async")
        again = _run(_shell_agent(executor), ledger, "structured", "async")
        assert runs == ["shell-1", "shell-2"]
        raw = [item.raw_item for item in first.new_items if isinstance(item, ToolCallOutputItem)]
        assert raw == [
            item.raw_item for item in again.new_items if isinstance(item, ToolCallOutputItem)
        ]
        assert raw[0]["output"][0]["outcome"] == {"type": "exit", "exit_code": 3}
        assert raw[0]["provider_data"] == {"host": "here"}
    finally:
        ledger.close()


def test_a_shell_executor_that_keeps_raising_is_told_as_an_unknown_outcome_once(
    db: str,
) -> None:
    attempts: list[bool] = []

    def executor(request: Any) -> str:
        attempts.append(durable.current_attempt().redelivery)
        raise ConnectionError("the host hung up")

    ledger = oncewire.Ledger(db)
    try:
        first = _run(_shell_agent(executor), ledger, "raising", "sync")
        assert attempts == [False, True, True] * 2  # max_attempts per call, flagged after one
        again = _run(_shell_agent(executor), ledger, "raising", "sync")
        assert len(attempts) == 6
        failed = [item.raw_item for item in first.new_items if isinstance(item, ToolCallOutputItem)]
        assert [raw["status"] for raw in failed] == ["failed", "failed"]
        assert all("outcome unknown" in str(output) for output in _outputs(first))
        assert _outputs(first) == _outputs(again)
        assert {e.state for e in ledger.effects.list(limit=10)} == {EffectState.DEAD}
    finally:
        ledger.close()


def test_each_local_shell_call_is_one_effect_performed_once(tmp_path: Path, db: str) -> None:
    log = tmp_path / "ran.log"

    def executor(request: Any) -> str:
        with open(log, "a") as out:
            out.write(durable.current_attempt().key + "\n")
        return "listed " + " ".join(request.data.action.command)

    def answer(call: Any) -> Any:
        return _answering(call, "local_shell_call_output") or [
            LocalShellCall(
                id="ls-1",
                call_id="local-1",
                type="local_shell_call",
                status="completed",
                action={"type": "exec", "command": ["ls", "-l"], "env": {}},  # type: ignore[arg-type]
            )
        ]

    def build() -> Agent[Any]:
        model = ScriptedModel([_step(answer, "sync") for _ in range(2)])
        return Agent(name="ops", model=model, tools=[LocalShellTool(executor=executor)])

    ledger = oncewire.Ledger(db)
    try:
        for _ in range(2):
            result = _run(build(), ledger, "local-run", "sync")
            assert result.final_output == "done after 1"
            assert _outputs(result) == ["listed ls -l"]
        assert _calls(log) == ["agents/local-run/local-1"]
        assert _effects(ledger) == {"agents/local-run/local-1": EffectState.DONE}
    finally:
        ledger.close()


@pytest.mark.parametrize("tool", ["local_shell", "apply_patch"])
def test_a_refused_local_call_is_rejected_once_and_the_run_goes_on(db: str, tool: str) -> None:
    refusals: list[str] = []

    def refuse(*_: Any) -> Any:
        refusals.append(durable.current_attempt().key)
        raise durable.ToolRefused("not on this host")

    if tool == "local_shell":
        item: Any = LocalShellCall(
            id="ls-1",
            call_id="c-1",
            type="local_shell_call",
            status="completed",
            action={"type": "exec", "command": ["rm", "-rf", "/"], "env": {}},  # type: ignore[arg-type]
        )
        tools: list[Any] = [LocalShellTool(executor=refuse)]
    else:
        item = ResponseApplyPatchToolCall(
            id="ap-1",
            call_id="c-1",
            type="apply_patch_call",
            status="completed",
            operation={"type": "delete_file", "path": "keep.txt"},  # type: ignore[arg-type]
        )
        editor = Editor(Path("."))
        editor.delete_file = refuse  # type: ignore[method-assign]
        tools = [ApplyPatchTool(editor=editor)]

    def build() -> Agent[Any]:
        def answer(call: Any) -> Any:
            return _answering(call, f"{tool}_call_output") or [item]

        model = ScriptedModel([_step(answer, "sync") for _ in range(2)])
        return Agent(name="ops", model=model, tools=tools)

    ledger = oncewire.Ledger(db)
    try:
        results = [_run(build(), ledger, "refused", "sync") for _ in range(2)]
        assert refusals == ["agents/refused/c-1"]
        told = "error: the tool refused the call: not on this host"
        assert [_outputs(result) for result in results] == [[told], [told]]
        assert results[0].final_output == "done after 1"
        if tool == "apply_patch":
            raw = [i.raw_item for i in results[0].new_items if isinstance(i, ToolCallOutputItem)]
            assert raw[0]["status"] == "failed"
        assert _effects(ledger) == {"agents/refused/c-1": EffectState.REJECTED}
    finally:
        ledger.close()


class Editor:
    """An apply_patch editor writing into ``folder``, counting its operations."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.operations: list[tuple[str, str, str]] = []

    def create_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        self.operations.append(("create", operation.path, durable.current_attempt().key))
        (self.folder / operation.path).write_text(operation.diff or "")
        return ApplyPatchResult(output=f"created {operation.path}")

    def update_file(self, operation: ApplyPatchOperation) -> str:
        self.operations.append(("update", operation.path, durable.current_attempt().key))
        with open(self.folder / operation.path, "a") as out:
            out.write(operation.diff or "")
        return f"updated {operation.path}"

    async def delete_file(self, operation: ApplyPatchOperation) -> None:
        self.operations.append(("delete", operation.path, durable.current_attempt().key))
        (self.folder / operation.path).unlink()


@pytest.mark.parametrize("mode", ["sync", "streamed"])
def test_each_apply_patch_call_is_one_effect_and_a_second_call_does_not_edit_again(
    tmp_path: Path, db: str, mode: str
) -> None:
    def patch(call_id: str, kind: str, path: str, diff: str | None) -> Any:
        operation: dict[str, Any] = {"type": kind, "path": path}
        if diff is not None:
            operation["diff"] = diff
        return ResponseApplyPatchToolCall(
            id=f"ap-{call_id}",
            call_id=call_id,
            type="apply_patch_call",
            status="completed",
            operation=operation,  # type: ignore[arg-type]
        )

    def answer(call: Any) -> Any:
        return _answering(call, "apply_patch_call_output") or [
            patch("p-1", "create_file", "a.txt", "+one\n"),
            patch("p-2", "update_file", "a.txt", "+two\n"),
            patch("p-3", "create_file", "b.txt", "+gone\n"),
            patch("p-4", "delete_file", "b.txt", None),
        ]

    editor = Editor(tmp_path)

    def build() -> Agent[Any]:
        model = ScriptedModel([_step(answer, mode) for _ in range(2)])
        return Agent(name="editor", model=model, tools=[ApplyPatchTool(editor=editor)])

    ledger = oncewire.Ledger(db)
    try:
        first = _run(build(), ledger, "patch-run", mode)
        again = _run(build(), ledger, "patch-run", mode)
        assert first.final_output == again.final_output == "done after 4"
        told = ["created a.txt", "updated a.txt", "created b.txt", ""]
        assert _outputs(first) == _outputs(again) == told
        assert [(kind, path) for kind, path, _ in editor.operations] == [
            ("create", "a.txt"),
            ("update", "a.txt"),
            ("create", "b.txt"),
            ("delete", "b.txt"),
        ]
        assert [key for *_, key in editor.operations] == [
            f"agents/patch-run/p-{n}" for n in range(1, 5)
        ]
        assert (tmp_path / "a.txt").read_text() == "+one\n+two\n"
        assert _effects(ledger) == {
            f"agents/patch-run/p-{n}": EffectState.DONE for n in range(1, 5)
        }
    finally:
        ledger.close()


def test_a_local_tool_a_durable_run_used_runs_as_before_outside_one(db: str) -> None:
    runs: list[str] = []
    shell = ShellTool(executor=lambda request: runs.append(request.data.call_id) or "ok")

    def build() -> Agent[Any]:
        def answer(call: Any) -> Any:
            return _answering(call, "shell_call_output") or [_shell_call("s-1", "true")]

        model = ScriptedModel([_step(answer, "sync") for _ in range(2)])
        return Agent(name="ops", model=model, tools=[shell])

    ledger = oncewire.Ledger(db)
    try:
        _run(build(), ledger, "then-plain", "sync")
    finally:
        ledger.close()
    for _ in range(2):
        assert Runner.run_sync(build(), "go").final_output == "done after 1"
    assert runs == ["s-1", "s-1", "s-1"]  # the plain runs are not durable
