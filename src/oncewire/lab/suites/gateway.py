"""Suite ``gateway``: the real ``oncewire gateway run`` process, SIGKILLed and started again.

Each scenario runs in a folder of its own: a platform fake (the fake Telegram Bot API, the fake
Discord, or the fake generic webhook platform, which cannot edit) and the fake model server as
child processes, a store on the lab's backend (a SQLite file, or a fresh schema of the
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
* ``completed_not_ledgered`` (seed 002 crash cell C1, webhook platform): the crash point
  ``replies.committed_not_sent``, the answer and its reply record committed, the delivery not
  started; the restart sends it once, unmarked, without asking the model again;
* ``killed_with_send_held`` (C2, webhook platform): the answer is committed, its send parked on
  the platform (never applied) when the gateway is killed; the restart delivers it once,
  without asking the model again (marked: the gateway cannot rule out that the parked send
  landed);
* ``crash_point_send_in_flight``: the same window reached by the crash point
  ``replies.send_in_flight`` armed in the gateway process, which kills itself there;
* ``killed_with_final_edit_held`` (C3, Telegram, streaming; ``..._on_discord`` the same on
  Discord, as for C5 and C6): the edit showing the whole answer is parked (never applied) when
  the gateway is killed; after the restart the user sees one unmarked answer in that message
  (the edit replayed, or the unfinished turn resumed onto it: the model asked again only if
  the answer was not committed at the kill);
* ``killed_with_send_ack_lost`` (C4, webhook platform): the platform accepted the send, its
  acknowledgement died with the gateway; after the restart the user sees the answer, and a
  second copy only marked;
* ``killed_with_final_edit_ack_lost`` (C5, Telegram, streaming): the platform applied the edit
  showing the whole answer, its acknowledgement parked; the answer is committed meanwhile (a
  parked preview does not hold the commit back), then the kill; the restart replays the edit
  ("not modified"): one unmarked answer, the model asked once;
* ``killed_with_whole_answer_previewed`` (C6, the seed's LIVE GAP cell 2): a preview shows the
  whole answer while the model's stream stays open, nothing persisted, when the gateway is
  killed; the restart resumes the turn with the recovery note, the model answers again and that
  answer is edited into the same message: the text the user saw first was never an answer;
* ``idle_restart``: everything answered and delivered, SIGKILL and a restart: it sends nothing
  and asks the model nothing (seed audit A2);
* ``armed_*``: every registered ``replies.*`` crash point armed in a streaming gateway in turn.
  The restart answers once: at most one unmarked copy, a marked copy or a leftover piece of the
  answer only where the record holds an ambiguous send. A point the gateway's path does not
  reach is reported as not applicable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from oncewire.lab.framework import LabContext, ScenarioResult, Suite
from oncewire.lab.gateway_rig import GatewayRig, RigError, missing_gateway_extra
from oncewire.lab.suites.gateway_cells import CELLS, HELD
from oncewire.lab.suites.gateway_verdict import (
    KILLED,
    Scenario,
    check_answer,
    died_at,
    killed,
    text_answer,
)

__all__ = [
    "SCENARIOS",
    "SUITE",
    "Scenario",
    "armed",
    "check_answer",
    "crash_point_scenarios",
    "run_gateway",
]

IDLE_SECONDS = 1.5  # how long an idle restart is watched for a send or a model request


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
    killed(result, rig.kill9())
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
    killed(result, rig.kill9())
    result.before = rig.snapshot()
    rig.start()
    rig.wait_inbound("delivered")
    check_answer(result, rig, PREVIEWED, "exact")
    result.require(len(rig.model_requests()) == 2, "the model was not asked exactly twice")


def crash_point_send_in_flight(rig: GatewayRig, result: ScenarioResult, folder: Path) -> None:
    token = folder / "crash.token"
    rig.start(arm="replies.send_in_flight", token=token)
    rig.inject("question")
    died_at(result, rig, "replies.send_in_flight", token)
    result.before = rig.snapshot()
    result.require(rig.visible() == [], "the send was shown although the process died first")
    rig.start()
    rig.wait_inbound("delivered")
    check_answer(result, rig, HELD, "one_copy")
    result.require(len(rig.model_requests()) == 1, "the committed answer was asked for again")


IDLE = "Everything is answered before the restart."


def idle_restart(rig: GatewayRig, result: ScenarioResult, folder: Path) -> None:
    rig.start()
    rig.inject("one question")
    rig.wait_inbound("delivered")
    killed(result, rig.kill9())  # unclean: nothing in flight, but no drain either
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
        killed(result, KILLED if code is None else code)
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
            (text_answer(STREAMED, chunk_chars=8, delay_per_chunk=0.03),) * 2,
        )
        for name in crash.registry()
        if name.startswith("replies.")
    )


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "plain_message",
        "one message answered once",
        plain_message,
        (text_answer(PLAIN, chunk_chars=6),),
    ),
    Scenario(
        "killed_while_model_hangs",
        "SIGKILL while the model stream hangs; the restart answers once",
        killed_while_model_hangs,
        ({"kind": "hang", "seconds": 600}, text_answer(HUNG)),
    ),
    Scenario(
        "killed_mid_preview",
        "SIGKILL while a preview shows half the answer; the restart completes that message",
        killed_mid_preview,
        (
            {"kind": "stall_mid_stream", "text": PREVIEWED, "after_chars": 20, "seconds": 600},
            text_answer(PREVIEWED, chunk_chars=8),
        ),
    ),
    *CELLS,
    Scenario(
        "crash_point_send_in_flight",
        "replies.send_in_flight armed in the gateway; delivered once after the restart",
        crash_point_send_in_flight,
        (text_answer(HELD),),
        streaming=False,
    ),
    Scenario(
        "idle_restart",
        "SIGKILL and a restart with nothing pending: no send, no model request",
        idle_restart,
        (text_answer(IDLE),),
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
    missing = missing_gateway_extra("the gateway suite")
    if missing is not None:
        result.skipped = str(missing)
        return result
    started = time.monotonic()
    folder = ctx.scenario_dir("gateway", scenario.name)
    db = _store(ctx, folder, f"gateway/{scenario.name}")
    rig = GatewayRig(
        folder, db, list(scenario.script), streaming=scenario.streaming, platform=scenario.platform
    )
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
        "platform": rig.platform,
        "gateway_starts": rig.starts,
        "exit_codes": [p.exit_code for p in result.processes],
        "visible": [(m["text"], m["marked"]) for m in after.get("visible", [])],
        "model_requests": after.get("model_requests"),
    }
    result.duration_seconds = time.monotonic() - started
    return result


def run_gateway(ctx: LabContext) -> Iterator[ScenarioResult]:
    for scenario in SCENARIOS + crash_point_scenarios():
        ctx.progress.update(f"gateway: {scenario.name}")
        yield run_scenario(ctx, scenario)


SUITE = Suite(
    "gateway",
    "the real gateway process SIGKILLed mid-turn and restarted, checked on screen and in the store",
    run_gateway,
    key_numbers=("platform", "gateway_starts", "exit_codes", "model_requests"),
)
