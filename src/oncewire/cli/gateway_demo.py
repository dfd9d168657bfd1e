"""``oncewire gateway demo``: watch the gateway survive a SIGKILL mid-reply, with no token.

The demo runs the real ``oncewire gateway run`` process between the fake Telegram Bot API and
the fake model server (:class:`~oncewire.lab.gateway_rig.GatewayRig`), on a temporary SQLite
store. Its verdict is the ``gateway`` lab suite's, read from the fake's chat journal and the
store, not from the gateway's output.
"""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path

import click

from oncewire.lab.framework import ScenarioResult
from oncewire.lab.gateway_rig import GatewayRig, RigError, missing_gateway_extra
from oncewire.lab.suites.gateway import check_answer

__all__ = ["demo"]

QUESTION = "Why does a chat bot need a durable reply ledger?"
ANSWER = (
    "Because a process can die at any moment: between asking the model and answering, or "
    "between committing an answer and sending it. The ledger records each step, so a "
    "restart finishes the reply exactly once instead of losing it or sending it twice."
)
HALF = 60  # characters the model streams before its stream hangs
EXIT_FAILED = 1


@click.command("demo")
@click.option(
    "--keep",
    "keep",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Keep the store, the gateway.toml, the gateway's logs and the fakes' journals in DIR "
    "(a new or empty directory) instead of a temporary one.",
)
def demo(keep: Path | None) -> None:
    """Watch a real gateway answer once through a SIGKILL, without any token.

    \b
    Starts a fake Telegram Bot API and a fake model server (local processes), then a real
    "oncewire gateway run" on a new SQLite store. The user sends a message; the model streams
    half an answer into the chat and hangs; the gateway is killed with SIGKILL mid-reply and
    started again on the same store. The chat is shown as the user sees it before and after,
    then the verdict: answered once, no duplicate. Nothing leaves this machine.

    Exit 0 when the verdict holds, 1 otherwise (or when a process does not start).

    \b
    Example:
      oncewire gateway demo
      oncewire gateway demo --keep ./demo   # then: oncewire gateway status --db ./demo/gateway.db
    """
    missing = missing_gateway_extra("oncewire gateway demo")
    if missing is not None:
        click.echo(f"error: {missing} [{missing.code}]", err=True)
        raise click.exceptions.Exit(EXIT_FAILED)
    if keep is not None:
        if keep.exists() and any(keep.iterdir()):
            raise click.UsageError(f"--keep {keep} is not empty; choose a new directory")
        keep.mkdir(parents=True, exist_ok=True)
        _run(keep)
        click.echo(f"kept: {keep} (gateway.db, gateway.toml, gateway-*.log, telegram/, model/)")
        return
    with tempfile.TemporaryDirectory(prefix="oncewire-demo-") as folder:
        _run(Path(folder))


def _step(text: str) -> None:
    click.echo(f"-> {text}")


def _detail(text: str) -> None:
    click.echo(f"   {text}")


def _show_chat(rig: GatewayRig) -> None:
    shown = rig.visible()
    click.echo(f"   user: {QUESTION}")
    if not shown:
        click.echo("   bot:  (nothing yet)")
    for message in shown:
        mark = " [marked: possible duplicate]" if message.marked else ""
        lines = textwrap.wrap(message.text + mark, 80) or [""]
        click.echo(f"   bot:  {lines[0]}")
        for line in lines[1:]:
            click.echo(f"         {line}")


def _run(folder: Path) -> None:
    script = [
        {"kind": "stall_mid_stream", "text": ANSWER, "after_chars": HALF, "seconds": 600},
        {"kind": "text", "text": ANSWER, "chunk_chars": 12, "delay_per_chunk": 0.02},
    ]
    db = folder / "gateway.db"
    result = ScenarioResult("demo")
    with GatewayRig(folder, str(db), script) as rig:
        try:
            _step("starting a fake Telegram Bot API and a fake model server (local processes)")
            rig.start_fakes()
            _step(f"starting `oncewire gateway run` on a new SQLite store: {db}")
            pid = rig.start()
            _detail(f"the gateway is ready (pid {pid})")
            _step("the user sends a message")
            rig.inject(QUESTION)
            rig.wait(lambda: len(rig.model_requests()) == 1, "the gateway to ask the model")
            _detail("the gateway admitted it and asked the model, which streams half an answer")
            _detail("and then hangs")

            def preview_recorded() -> bool:
                ops = rig.reply_ops()
                return any(o["kind"] == "send" and o["state"] == "acked" for o in ops)

            rig.wait(preview_recorded, "the preview to reach the chat")
            _step("the chat, as the user sees it now (a preview of the answer):")
            _show_chat(rig)
            _step(f"SIGKILL to the gateway's process group (pid {pid}): no drain, no cleanup")
            code = rig.kill9()
            _detail(f"the gateway exited with {code}")
            for row in rig.inbound():
                _detail(f"the store says: message {row['id']} is {row['status']}")
            pid = rig.start()
            _step(f"the gateway starts again on the same store (pid {pid})")
            _detail("it finds the turn the dead process left and resumes it")
            rig.wait_inbound("delivered")
            _step("the chat, as the user sees it after the restart:")
            _show_chat(rig)
            rig.terminate()
        except RigError as exc:
            result.require(False, str(exc))
        if result.passed:
            check_answer(result, rig, ANSWER, "exact")
        asked = len(rig.model_requests())
    if not result.passed:
        click.echo("verdict: FAILED")
        for failure in result.failures:
            click.echo(f"  {failure}")
        raise click.exceptions.Exit(EXIT_FAILED)
    click.echo(
        "verdict: answered once, no duplicate (one message, edited from the preview into the "
        f"complete answer; the model was asked {asked} times: the hung stream and the resumed "
        "turn)"
    )
