"""Seed 002's crash matrix (GATEWAY.md §1.5) as ``gateway`` lab scenarios: C1-C6.

Each cell kills the real gateway between the model's completion and the platform's
acknowledgement and judges the restart from the evidence (:func:`check_answer`, and
:func:`check_asked` for what the model was asked). C2 and C4 run on the generic webhook
platform, which cannot edit (a parked send: one copy; an applied send whose acknowledgement was
lost: the original and a marked copy); C3, C5 and C6, the cells the seed sets on a streaming
platform, run once per platform of :data:`STREAMING_PLATFORMS`, Telegram and Discord, each the
same scenario function on another fake (the parked operation an ``editMessageText`` on one, a
``PATCH`` of the message on the other); C1 has no window of its own in oncewire (the answer and
its reply record commit in one transaction), so the crash point ``replies.committed_not_sent``
stands for it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from oncewire.lab.framework import ScenarioResult
from oncewire.lab.gateway_rig import GatewayRig
from oncewire.lab.suites.gateway_verdict import (
    Scenario,
    check_answer,
    check_asked,
    died_at,
    killed,
    parked,
    shows,
    text_answer,
)

__all__ = ["CELLS", "HELD", "STREAMING_PLATFORMS"]

# The editable platforms the streaming cells run on: the first keeps the cell's plain name.
STREAMING_PLATFORMS = ("telegram", "discord")
PLATFORM_NAMES = {"telegram": "Telegram", "discord": "Discord"}
Run = Callable[[GatewayRig, ScenarioResult, Path], None]

HELD = "An answer whose send was cut short."


def killed_with_send_held(rig: GatewayRig, result: ScenarioResult, folder: Path) -> None:
    rig.start_fakes()
    # The send parks on the platform before it is applied (never, while the scenario runs).
    rig.fault("hold", op="send", hold_seconds=600, name="park")
    rig.start()
    rig.inject("question")
    rig.wait(lambda: parked(rig), "the send to park on the platform")
    killed(result, rig.kill9())
    result.before = rig.snapshot()
    statuses = [row["status"] for row in rig.inbound()]
    result.require(statuses == ["answered"], f"before the restart the inbound is {statuses}")
    result.require(rig.visible() == [], "the parked send was shown before the restart")
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
    rig.wait(
        lambda: parked(rig) and shows(rig, ACK_LOST),
        "the send to be shown and its acknowledgement to park",
    )
    killed(result, rig.kill9())
    result.before = rig.snapshot()
    rig.start()
    rig.wait_inbound("delivered")
    check_answer(result, rig, ACK_LOST, "marked_dupes")
    result.require(len(rig.model_requests()) == 1, "the committed answer was asked for again")


COMMITTED = "An answer committed, its delivery not started."


def completed_not_ledgered(rig: GatewayRig, result: ScenarioResult, folder: Path) -> None:
    token = folder / "crash.token"
    rig.start(arm="replies.committed_not_sent", token=token)
    rig.inject("question")
    died_at(result, rig, "replies.committed_not_sent", token)
    result.before = rig.snapshot()
    committed = [r["final_text"] for r in rig.replies()]
    result.require(committed == [COMMITTED], f"at the kill the store holds {committed}")
    result.require(rig.visible() == [], "something was shown before the delivery started")
    # The point is hit on the turn's thread right after its commit; the reply thread, woken by
    # that commit, can have recorded the start of the send before the SIGKILL lands. Then the
    # first attempt may have reached the platform as far as anyone can know, and one copy,
    # marked, is the honest delivery; with no send recorded, one unmarked copy is the only one.
    begun = rig.reply_ops()
    result.details["ops_at_kill"] = begun
    rig.start()
    rig.wait_inbound("delivered")
    check_answer(result, rig, COMMITTED, "one_copy" if begun else "exact")
    result.require(len(rig.model_requests()) == 1, "the committed answer was asked for again")


FINAL_EDIT = "A streamed answer whose last edit is parked on the platform."
# ~1.6 s of stream: even on a busy host the first preview shows only a prefix, so the whole
# answer first appears in an edit of a recorded message (a send whose acknowledgement is lost
# leaves a message nobody can edit).
PACED = {"chunk_chars": 4, "delay_per_chunk": 0.1}


def killed_with_final_edit_held(rig: GatewayRig, result: ScenarioResult, folder: Path) -> None:
    rig.start_fakes()
    # The edit that would show the whole answer parks before it is applied.
    rig.fault("hold", op="edit", contains=FINAL_EDIT, hold_seconds=600, name="park")
    rig.start()
    rig.inject("question")
    rig.wait(lambda: parked(rig), "the edit showing the whole answer to park")
    before = rig.visible()
    shown = [m.text for m in before]
    result.require(
        len(shown) == 1 and FINAL_EDIT.startswith(shown[0]) and shown[0] != FINAL_EDIT,
        f"before the kill the preview is not a prefix of the answer: {shown}",
    )
    killed(result, rig.kill9())
    result.before = rig.snapshot()
    # The turn may have committed the answer while its edit was parked, or not yet.
    committed = [r["final_text"] for r in rig.replies()] == [FINAL_EDIT]
    result.details["committed_at_kill"] = committed
    rig.start()
    rig.wait_inbound("delivered")
    # Either the parked edit is replayed (the answer was committed) or the unfinished turn is
    # resumed (the model answers the same again): one unmarked answer, in the recorded message.
    check_answer(result, rig, FINAL_EDIT, "exact")
    check_asked(result, rig, resumed=not committed)
    result.require(
        [m.message_id for m in rig.visible()] == [m.message_id for m in before],
        "the answer is not in the message that showed its preview",
    )


EDIT_ACK_LOST = "A streamed answer whose last edit was applied, its acknowledgement lost."


def killed_with_final_edit_ack_lost(rig: GatewayRig, result: ScenarioResult, folder: Path) -> None:
    rig.start_fakes()
    # The platform applies the edit showing the whole answer, then parks its acknowledgement.
    rig.fault("hold_after", op="edit", contains=EDIT_ACK_LOST, hold_seconds=600, name="park")
    rig.start()
    rig.inject("question")
    rig.wait(
        lambda: parked(rig) and shows(rig, EDIT_ACK_LOST),
        "the edit to be shown and its acknowledgement to park",
    )
    # The answer is committed while the edit is parked: a preview never holds the commit back.
    rig.wait_inbound("answered")
    killed(result, rig.kill9())
    result.before = rig.snapshot()
    rig.start()
    rig.wait_inbound("delivered")
    check_answer(result, rig, EDIT_ACK_LOST, "exact")
    check_asked(result, rig, resumed=False)


UNPERSISTED = "The whole answer, previewed while the model's stream stays open."
RESUMED = "The answer after the restart, edited over the first one."


def killed_with_whole_answer_previewed(
    rig: GatewayRig, result: ScenarioResult, folder: Path
) -> None:
    rig.start_fakes()
    rig.fault("hold_after", op="edit", contains=UNPERSISTED, hold_seconds=600, name="park")
    rig.start()
    rig.inject("question")
    rig.wait(
        lambda: parked(rig) and shows(rig, UNPERSISTED),
        "the preview of the whole answer to be shown and its acknowledgement to park",
    )
    before = rig.visible()
    result.require(rig.replies()[0]["final_text"] is None, "the stalled answer was committed")
    killed(result, rig.kill9())
    result.before = rig.snapshot()
    rig.start()
    rig.wait_inbound("delivered")
    check_answer(result, rig, RESUMED, "exact")
    after = rig.visible()
    result.require(
        [m.message_id for m in after] == [m.message_id for m in before],
        "the resumed answer is not in the message that showed the first one",
    )
    # The text the user saw first was never an answer: the turn is resumed, with the note.
    check_asked(result, rig, resumed=True)


def on_each_streaming_platform(
    name: str, cell: str, description: str, run: Run, script: tuple[dict[str, Any], ...]
) -> tuple[Scenario, ...]:
    """The scenario ``run`` once per platform of :data:`STREAMING_PLATFORMS`: ``name`` on the
    first, ``name_on_<platform>`` on the others; its description ``cell: description``, with the
    platform named after the cell."""
    return tuple(
        Scenario(
            name if platform == STREAMING_PLATFORMS[0] else f"{name}_on_{platform}",
            f"{cell} on {PLATFORM_NAMES[platform]}: {description}",
            run,
            script,
            platform=platform,
        )
        for platform in STREAMING_PLATFORMS
    )


# The seed's cells, C1 to C6 in its order, the streaming ones on each streaming platform.
CELLS: tuple[Scenario, ...] = (
    Scenario(
        "completed_not_ledgered",
        "C1: replies.committed_not_sent armed on the webhook platform; sent once, unmarked",
        completed_not_ledgered,
        (text_answer(COMMITTED),),
        platform="webhook",
    ),
    Scenario(
        "killed_with_send_held",
        "C2: SIGKILL with the committed answer's send parked on the webhook platform; "
        "delivered once after the restart",
        killed_with_send_held,
        (text_answer(HELD),),
        platform="webhook",
    ),
    *on_each_streaming_platform(
        "killed_with_final_edit_held",
        "C3",
        "SIGKILL with the edit showing the whole answer parked; one unmarked answer after",
        killed_with_final_edit_held,
        (text_answer(FINAL_EDIT, **PACED), text_answer(FINAL_EDIT, **PACED)),
    ),
    Scenario(
        "killed_with_send_ack_lost",
        "C4: SIGKILL with the send accepted on the webhook platform and its acknowledgement "
        "lost; a second copy only marked",
        killed_with_send_ack_lost,
        (text_answer(ACK_LOST),),
        platform="webhook",
    ),
    *on_each_streaming_platform(
        "killed_with_final_edit_ack_lost",
        "C5",
        "SIGKILL with the final edit applied, its acknowledgement lost, the answer committed; "
        "the edit replayed, one unmarked answer",
        killed_with_final_edit_ack_lost,
        (text_answer(EDIT_ACK_LOST, **PACED),),
    ),
    *on_each_streaming_platform(
        "killed_with_whole_answer_previewed",
        "C6",
        "SIGKILL while a preview shows the whole answer and the model's stream is open; the "
        "resumed answer is edited over it",
        killed_with_whole_answer_previewed,
        (
            {
                "kind": "stall_mid_stream",
                "text": UNPERSISTED,
                "after_chars": len(UNPERSISTED),
                "seconds": 600,
                **PACED,
            },
            text_answer(RESUMED, **PACED),
        ),
    ),
)
