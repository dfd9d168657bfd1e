"""Suite ``gateway``: the real ``oncewire gateway run`` process, SIGKILLed and started again.

Each scenario runs in a folder of its own: the fake Telegram Bot API and the fake model server
as child processes, a store on the lab's backend (a SQLite file, or a fresh schema of the
PostgreSQL database given to the lab), and the gateway in a process group of its own
(:class:`~oncewire.lab.gateway_rig.GatewayRig`). The user writes through the fake's control
route; the gateway is killed from outside with SIGKILL (or kills itself at an armed crash
point), then started again on the same store. Every verdict is read from the fake's chat
journal (what the user sees), the fake model's request journal (what was asked) and the
store's rows read directly, never from the gateway's output:

* ``plain_message``: one message, answered once, the model asked once;
* ``killed_while_model_hangs``: killed while the model's stream sends nothing; the restart
  resumes the turn and the user sees one complete, unmarked answer;
* ``killed_mid_preview``: killed while a recorded preview shows half of the answer and the
  stream stalls; the restart edits that same message into the complete answer;
* ``killed_with_send_held``: the answer is committed, its send parked on the platform (never
  applied) when the gateway is killed; the restart delivers it once, without asking the model
  again (marked: the gateway cannot rule out that the parked send landed);
* ``crash_point_send_in_flight``: the same window reached by the crash point
  ``replies.send_in_flight`` armed in the gateway process, which kills itself there;
* ``killed_with_send_ack_lost``: the platform accepted the send, its acknowledgement died with
  the gateway; after the restart the user sees the answer, and a second copy only marked;
* ``idle_restart``: everything answered and delivered, SIGKILL and a restart: it sends nothing
  and asks the model nothing (seed audit A2);
* ``armed_*``: every registered ``replies.*`` crash point armed in a streaming gateway in turn.
  The restart answers once: at most one unmarked copy, a marked copy or a leftover piece of the
  answer only where the record holds an ambiguous send. A point the gateway's path does not
  reach is reported as not applicable.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oncewire.lab.framework import LabContext, ScenarioResult, Suite
from oncewire.lab.gateway_rig import GatewayRig, RigError, missing_gateway_extra

__all__ = [
    "SCENARIOS",
    "SUITE",
    "Scenario",
    "armed",
    "check_answer",
    "crash_point_scenarios",
    "run_gateway",
]

KILLED = -signal.SIGKILL
IDLE_SECONDS = 1.5  # how long an idle restart is watched for a send or a model request
EXPECTATIONS = ("exact", "one_copy", "marked_dupes")


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    run: Callable[[GatewayRig, ScenarioResult, Path], None]
    script: tuple[dict[str, Any], ...]
    streaming: bool = True


def check_answer(
    result: ScenarioResult,
    rig: GatewayRig,
    answer: str,
    expect: str,
    inbound_id: int = 1,
    *,
    leftovers: bool = False,
) -> None:
    """The message was answered once with ``answer`` and delivered, as the store says, and the
    user sees it: ``exact``, one unmarked message; ``one_copy``, one message (marked only where
    the gateway could not rule out an earlier copy); ``marked_dupes``, at most one unmarked
    copy and every other message a marked copy. A marked copy needs an ambiguous send in the
    record. No partial answer is left on screen, unless ``leftovers`` allows a piece of the
    answer where the record holds an ambiguous send (a send whose acknowledgement was lost
    leaves a message nobody can edit: its id was never recorded)."""
    if expect not in EXPECTATIONS:
        raise ValueError(f"unknown expectation {expect!r}")
    inbound = {row["id"]: row for row in rig.inbound()}
    row = inbound.get(inbound_id)
    result.require(
        row is not None and row["status"] == "delivered",
        f"inbound {inbound_id} is {row and row['status']}, not delivered",
    )
    replies = [r for r in rig.replies() if r["inbound_id"] == inbound_id]
    result.require(len(replies) == 1, f"{len(replies)} reply records for inbound {inbound_id}")
    for reply in replies:
        result.require(reply["state"] == "delivered", f"the reply is {reply['state']}")
        result.require(reply["final_text"] == answer, f"committed {reply['final_text']!r}")
    runs = [r for r in rig.runs() if r["run_id"] == f"turn:{inbound_id}"]
    result.require(
        [r["status"] for r in runs] == ["answered"], f"the turn's run is {runs or 'missing'}"
    )
    terminated = rig.run_events(f"turn:{inbound_id}").count("run_terminated")
    result.require(terminated == 1, f"the turn terminated {terminated} times")

    shown = rig.visible()
    seen = [(m.text, m.marked) for m in shown]
    ambiguous = [o for o in rig.reply_ops() if o["state"] == "ambiguous"]
    others = [m for m in shown if m.text != answer]
    pieces = [m for m in others if m.text and answer.startswith(m.text)]
    if leftovers and ambiguous:
        result.require(pieces == others, f"a message that is no piece of the answer: {seen}")
    else:
        result.require(not others, f"a partial or other message: {seen}")
    copies = [m for m in shown if m.text == answer]
    unmarked = [m for m in copies if not m.marked]
    if expect == "exact":
        result.require(seen == [(answer, False)], f"expected one unmarked answer, saw {seen}")
    elif expect == "one_copy":
        result.require(len(copies) == 1, f"expected one copy of the answer, saw {seen}")
    else:
        result.require(bool(copies), f"the answer is not visible: {seen}")
        result.require(len(unmarked) <= 1, f"{len(unmarked)} unmarked copies: {seen}")
    if any(m.marked for m in shown):
        result.require(bool(ambiguous), "a marked copy with no ambiguous send in the record")


def _killed(result: ScenarioResult, code: int) -> None:
    result.require(code == KILLED, f"the gateway was not killed by SIGKILL (exit {code})")


def _send_parked(rig: GatewayRig) -> bool:
    return "park" in rig.faults_fired()


# -- scenarios -------------------------------------------------------------------------------
PLAIN = "Hello from the model, streamed in small pieces."


def plain_message(rig: GatewayRig, result: ScenarioResult, folder: Path) -> None:
    rig.start()
    rig.inject("hi there")
    rig.wait_inbound("delivered")
    check_answer(result, rig, PLAIN, "exact")
    requests = rig.model_requests()
    result.require(len(requests) == 1, f"the model was asked {len(requests)} times")
    if requests:
        last = requests[0]["body"]["messages"][-1]
        result.require(last == {"role": "user", "content": "hi there"}, f"asked {last}")
    result.require(rig.terminate() == 0, "the gateway did not drain to exit 0 on SIGTERM")


HUNG = "The complete answer, after the restart."


def killed_while_model_hangs(rig: GatewayRig, result: ScenarioResult, folder: Path) -> None:
    rig.start()
    rig.inject("a question the model hangs on")
    rig.wait(lambda: len(rig.model_requests()) == 1, "the model request")
    _killed(result, rig.kill9())
    result.before = rig.snapshot()
    result.require(rig.visible() == [], "something was shown before the answer existed")
    rig.start()
    rig.wait_inbound("delivered")
    check_answer(result, rig, HUNG, "exact")
    requests = rig.model_requests()
    result.require(len(requests) == 2, f"the model was asked {len(requests)} times, not twice")
    result.require(
        [row["attempts"] for row in rig.inbound()] == [2], "the turn did not start exactly twice"
    )
    result.require(
        rig.run_events("turn:1")
        == ["run_started", "run_resumed", "step_recorded", "run_terminated"],
        f"run events {rig.run_events('turn:1')}",
    )


PREVIEWED = "Half of an answer that stalls, and then the whole of it."


def killed_mid_preview(rig: GatewayRig, result: ScenarioResult, folder: Path) -> None:
    rig.start()
    rig.inject("a question answered slowly")

    def preview_recorded() -> bool:
        return any(o["kind"] == "send" and o["state"] == "acked" for o in rig.reply_ops())

    # The preview's send is acknowledged in the record: the restart knows which message to edit.
    rig.wait(preview_recorded, "the preview to be recorded")
    shown = [m.text for m in rig.visible()]
    result.require(
        len(shown) == 1 and shown[0] != PREVIEWED and PREVIEWED.startswith(shown[0]),
        f"the preview does not show part of the answer: {shown}",
    )
    _killed(result, rig.kill9())
    result.before = rig.snapshot()
    rig.start()
    rig.wait_inbound("delivered")
    check_answer(result, rig, PREVIEWED, "exact")
    result.require(len(rig.model_requests()) == 2, "the model was not asked exactly twice")


HELD = "An answer whose send was cut short."


def killed_with_send_held(rig: GatewayRig, result: ScenarioResult, folder: Path) -> None:
    rig.start_fakes()
    # The send parks on the platform before it is applied (never, while the scenario runs).
    rig.fault("hold", op="send", hold_seconds=600, name="park")
    rig.start()
    rig.inject("question")
    rig.wait(lambda: _send_parked(rig), "the send to park on the platform")
    _killed(result, rig.kill9())
    result.before = rig.snapshot()
    statuses = [row["status"] for row in rig.inbound()]
    result.require(statuses == ["answered"], f"before the restart the inbound is {statuses}")
    result.require(rig.visible() == [], "the parked send was shown before the restart")
    rig.start()
    rig.wait_inbound("delivered")
    check_answer(result, rig, HELD, "one_copy")
    result.require(len(rig.model_requests()) == 1, "the committed answer was asked for again")


def crash_point_send_in_flight(rig: GatewayRig, result: ScenarioResult, folder: Path) -> None:
    token = folder / "crash.token"
    rig.start(arm="replies.send_in_flight", token=token)
    rig.inject("question")
    code = rig.wait_exit(20.0)
    result.require(token.exists(), "replies.send_in_flight was never reached in the gateway")
    if code is None:
        code = rig.kill9()
        result.require(False, "the armed gateway did not kill itself")
    _killed(result, code)
    result.before = rig.snapshot()
    result.require(rig.visible() == [], "the send was shown although the process died first")
    rig.start()
    rig.wait_inbound("delivered")
    check_answer(result, rig, HELD, "one_copy")
    result.require(len(rig.model_requests()) == 1, "the committed answer was asked for again")


ACK_LOST = "An answer whose acknowledgement was lost."


def killed_with_send_ack_lost(rig: GatewayRig, result: ScenarioResult, folder: Path) -> None:
    rig.start_fakes()
    # The platform applies the send, then parks its acknowledgement.
    rig.fault("hold_after", op="send", hold_seconds=600, name="park")
    rig.start()
    rig.inject("question")
    rig.wait(lambda: _send_parked(rig), "the send's acknowledgement to park")
    _killed(result, rig.kill9())
    result.before = rig.snapshot()
    result.require(
        [(m.text, m.marked) for m in rig.visible()] == [(ACK_LOST, False)],
        "the accepted send is not what the user sees before the restart",
    )
    rig.start()
    rig.wait_inbound("delivered")
    check_answer(result, rig, ACK_LOST, "marked_dupes")
    result.require(len(rig.model_requests()) == 1, "the committed answer was asked for again")


IDLE = "Everything is answered before the restart."


def idle_restart(rig: GatewayRig, result: ScenarioResult, folder: Path) -> None:
    rig.start()
    rig.inject("one question")
    rig.wait_inbound("delivered")
    _killed(result, rig.kill9())  # unclean: nothing in flight, but no drain either
    result.before = rig.snapshot()
    operations, requests = rig.operations(), len(rig.model_requests())
    rig.start()
    time.sleep(IDLE_SECONDS)  # a restart that re-ran anything would send or ask by now
    result.require(rig.operations() == operations, "the idle restart touched the chat")
    result.require(len(rig.model_requests()) == requests, "the idle restart asked the model")
    result.require(rig.terminate() == 0, "the idle gateway did not drain to exit 0")
    check_answer(result, rig, IDLE, "exact")


STREAMED = "A streamed answer in several pieces, long enough to be previewed more than once."


def armed(point: str) -> Callable[[GatewayRig, ScenarioResult, Path], None]:
    """A scenario that arms ``point`` in the gateway (streaming on): if the gateway reaches it,
    it dies there, and the restart must answer once; a point the gateway's path never reaches
    is reported as not applicable, never as a pass."""

    def run(rig: GatewayRig, result: ScenarioResult, folder: Path) -> None:
        token = folder / "crash.token"
        rig.start(arm=point, token=token)
        rig.inject("a question answered in a stream")

        def settled() -> bool:
            gateway = rig.gateway
            died = gateway is not None and gateway.poll() is not None
            return died or any(row["status"] == "delivered" for row in rig.inbound())

        rig.wait(settled, f"the gateway to die at {point} or to deliver")
        if not token.exists():
            result.skipped = f"{point} is not reached on the gateway's path"
            return
        code = rig.wait_exit(10.0)
        result.require(code is not None, f"the gateway went on after {point} fired")
        _killed(result, KILLED if code is None else code)
        result.before = rig.snapshot()
        rig.start()
        rig.wait_inbound("delivered")
        check_answer(result, rig, STREAMED, "marked_dupes", leftovers=True)
        asked = len(rig.model_requests())
        result.require(asked <= 2, f"the model was asked {asked} times for one message")

    return run


def crash_point_scenarios() -> tuple[Scenario, ...]:
    """One scenario per registered ``replies.*`` crash point, from the registry: a point added
    to the reply engine joins the suite without new code here."""
    import oncewire.replies  # noqa: F401  (registers the replies crash points)
    from oncewire.core import crash

    return tuple(
        Scenario(
            f"armed_{name.removeprefix('replies.')}",
            f"{name} armed in the gateway; answered once after the restart",
            armed(name),
            (_text(STREAMED, chunk_chars=8, delay_per_chunk=0.03),) * 2,
        )
        for name in crash.registry()
        if name.startswith("replies.")
    )


def _text(text: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "text", "text": text, **extra}


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "plain_message",
        "one message answered once",
        plain_message,
        (_text(PLAIN, chunk_chars=6),),
    ),
    Scenario(
        "killed_while_model_hangs",
        "SIGKILL while the model stream hangs; the restart answers once",
        killed_while_model_hangs,
        ({"kind": "hang", "seconds": 600}, _text(HUNG)),
    ),
    Scenario(
        "killed_mid_preview",
        "SIGKILL while a preview shows half the answer; the restart completes that message",
        killed_mid_preview,
        (
            {"kind": "stall_mid_stream", "text": PREVIEWED, "after_chars": 20, "seconds": 600},
            _text(PREVIEWED, chunk_chars=8),
        ),
    ),
    Scenario(
        "killed_with_send_held",
        "SIGKILL with the committed answer's send parked; delivered once after the restart",
        killed_with_send_held,
        (_text(HELD),),
        streaming=False,
    ),
    Scenario(
        "crash_point_send_in_flight",
        "replies.send_in_flight armed in the gateway; delivered once after the restart",
        crash_point_send_in_flight,
        (_text(HELD),),
        streaming=False,
    ),
    Scenario(
        "killed_with_send_ack_lost",
        "SIGKILL with the send accepted and its acknowledgement lost; a second copy only marked",
        killed_with_send_ack_lost,
        (_text(ACK_LOST),),
        streaming=False,
    ),
    Scenario(
        "idle_restart",
        "SIGKILL and a restart with nothing pending: no send, no model request",
        idle_restart,
        (_text(IDLE),),
    ),
)


def _store(ctx: LabContext, folder: Path, key: str) -> str:
    """The gateway's store on the lab's backend: a file in ``folder``, or a fresh schema."""
    if ctx.backend.name == "sqlite":
        return str(folder / "gateway.db")
    pair = ctx.backend.pair(folder)
    ctx.pairs[key] = pair
    return pair.caller


def run_scenario(ctx: LabContext, scenario: Scenario) -> ScenarioResult:
    name = f"{scenario.name}[{ctx.backend.name}]"
    result = ScenarioResult(name)
    missing = missing_gateway_extra()
    if missing:
        result.skipped = f"needs pip install 'oncewire[gateway]' ({', '.join(missing)} missing)"
        return result
    started = time.monotonic()
    folder = ctx.scenario_dir("gateway", scenario.name)
    db = _store(ctx, folder, f"gateway/{scenario.name}")
    rig = GatewayRig(folder, db, list(scenario.script), streaming=scenario.streaming)
    try:
        scenario.run(rig, result, folder)
    except RigError as exc:
        result.require(False, f"{exc}")
    finally:
        rig.close()
        result.processes = list(rig.processes)
    try:
        result.after = rig.snapshot()
    except Exception as exc:  # the evidence is best kept; a store that cannot be read says so
        result.require(False, f"the store could not be read after the run: {exc}")
    after = result.after or {}
    result.summary = {
        "description": scenario.description,
        "gateway_starts": rig.starts,
        "exit_codes": [p.exit_code for p in result.processes],
        "visible": [(m["text"], m["marked"]) for m in after.get("visible", [])],
        "model_requests": after.get("model_requests"),
    }
    result.duration_seconds = time.monotonic() - started
    return result


def run_gateway(ctx: LabContext) -> list[ScenarioResult]:
    results = []
    for scenario in SCENARIOS + crash_point_scenarios():
        ctx.progress.update(f"gateway: {scenario.name}")
        results.append(run_scenario(ctx, scenario))
    return results


SUITE = Suite(
    "gateway",
    "the real gateway process SIGKILLed mid-turn and restarted, checked on screen and in the store",
    run_gateway,
)
