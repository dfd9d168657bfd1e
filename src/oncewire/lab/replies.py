"""Suite ``replies``: the reply engine killed with SIGKILL at each of its crash windows.

Each cell runs the application process (:mod:`oncewire.lab.replies_worker`) on a fresh folder
(its database and the fake platforms' journals) and kills it, either at an armed crash point
or, from outside, while the fake platform parks an operation (``hold``: before the platform
accepts it, so it is never seen; ``hold_after``: after it is accepted and journaled). The lab
then restarts the process on the same folder (which re-delivers the inbound message, as a
platform does after a reconnect), and once more with nothing in flight, and reads the journals
and the database directly:

* the process died from SIGKILL, and the restart recognised the inbound as a re-delivery;
* exactly one complete visible reply equal to the committed (and persisted) text; a second
  copy only where a send may really have landed, and then marked; no partial copy left;
* an unclean restart with nothing in flight sends nothing.

Two cells are the cases a peer gateway lists as known failures: a streamed first send whose
acknowledgement is lost (``sent_ack_lost_streamed_first_send``) and a streamed answer fully
visible before the process dies with the final text not committed
(``preview_visible_not_committed``).
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from oncewire.effects.ledger import Ledger
from oncewire.lab.framework import LabContext, ProcessRecord, ScenarioResult, suite
from oncewire.lab.replies_rig import check_reply, footer, snapshot
from oncewire.platforms.fake import ChatView

__all__ = ["CELLS", "MODULE", "CrashCell", "run_cell", "run_replies"]

MODULE = "oncewire.lab.replies_worker"
KILLED = -signal.SIGKILL
HOLD_WAIT_SECONDS = 30.0


@dataclass(frozen=True)
class CrashCell:
    name: str
    platform: str
    mode: str  # off, one (whole answer in one stream delta) or many
    size: str  # short or long (over both caps)
    kill: str  # a crash point name, or "hold" / "hold_after" (killed from outside)
    expect: str  # exact, one_copy or marked_dupes (see replies_rig.check_reply)
    seed_gap: bool = False  # one of the peer gateway's known failures

    @property
    def cell_id(self) -> str:
        return f"{self.name}[{self.platform}-{self.mode}-{self.size}]"


CELLS: tuple[CrashCell, ...] = (
    CrashCell("committed_not_sent", "fk_ne", "off", "short", "replies.committed_not_sent", "exact"),
    CrashCell("committed_not_sent", "fk_tg", "off", "long", "replies.committed_not_sent", "exact"),
    CrashCell("committed_not_sent", "fk_dc", "many", "long", "replies.committed_not_sent", "exact"),
    CrashCell("send_in_flight", "fk_ne", "off", "short", "replies.send_in_flight", "one_copy"),
    CrashCell("send_in_flight", "fk_tg", "off", "short", "replies.send_in_flight", "one_copy"),
    CrashCell("send_in_flight", "fk_dc", "many", "short", "replies.send_in_flight", "one_copy"),
    CrashCell("sent_ack_lost", "fk_ne", "off", "short", "replies.sent_ack_lost", "marked_dupes"),
    # The last of the three chunks of a long reply (the marker's room is reserved in each): its
    # ghost completes the first copy, and the marked resend is the only extra message.
    CrashCell("sent_ack_lost", "fk_tg", "off", "long", "replies.sent_ack_lost@3", "marked_dupes"),
    CrashCell(
        "sent_ack_lost_streamed_first_send",
        "fk_tg",
        "one",
        "short",
        "replies.sent_ack_lost",
        "marked_dupes",
        seed_gap=True,
    ),
    CrashCell("edit_ack_lost", "fk_tg", "many", "short", "replies.edit_ack_lost", "exact"),
    CrashCell(
        "preview_visible_not_committed",
        "fk_tg",
        "many",
        "short",
        "replies.preview_visible_not_committed",
        "exact",
        seed_gap=True,
    ),
    CrashCell(
        "preview_visible_not_committed",
        "fk_dc",
        "many",
        "long",
        "replies.preview_visible_not_committed",
        "exact",
        seed_gap=True,
    ),
    CrashCell(
        "preview_visible_not_committed",
        "fk_tg",
        "one",
        "short",
        "replies.preview_visible_not_committed",
        "exact",
        seed_gap=True,
    ),
    CrashCell(
        "commit_before_commit", "fk_ne", "off", "short", "replies.commit_before_commit", "exact"
    ),
    CrashCell("hold_send_never_seen", "fk_ne", "off", "short", "hold", "one_copy"),
    CrashCell("hold_send_never_seen", "fk_tg", "off", "short", "hold", "one_copy"),
    CrashCell("hold_after_send_accepted", "fk_ne", "off", "short", "hold_after", "marked_dupes"),
    CrashCell("hold_after_send_accepted", "fk_tg", "off", "short", "hold_after", "marked_dupes"),
    CrashCell(
        "hold_after_stream_fully_visible", "fk_tg", "many", "short", "hold_after", "exact", True
    ),
)


def _args(folder: Path, cell: CrashCell, aid: str, chat: str) -> list[str]:
    return [
        "--directory",
        str(folder),
        "--platform",
        cell.platform,
        "--chat",
        chat,
        "--message-id",
        "in-1",
        "--aid",
        aid,
        "--size",
        cell.size,
        "--mode",
        cell.mode,
    ]


def _kill_while_parked(
    ctx: LabContext, folder: Path, cell: CrashCell, args: list[str], aid: str
) -> ProcessRecord:
    fault = {"kind": cell.kill, "platform": cell.platform, "contains": footer(aid), "name": "park"}
    started = time.monotonic()
    process = ctx.spawn("answer", [*args, "--fault", json.dumps(fault)], module=MODULE)
    deadline = started + HOLD_WAIT_SECONDS
    parked = False
    while time.monotonic() < deadline and process.poll() is None:
        if any(f.get("fault") == "park" for f in ChatView(sorted(folder.glob("*.jsonl"))).faults):
            parked = True
            break
        time.sleep(0.02)
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=30)
    return ProcessRecord(
        role="answer",
        argv=[MODULE, "answer", *args],
        pid=process.pid,
        exit_code=process.returncode,
        response={"parked": parked, "stdout": stdout[-500:]},
        stderr=stderr[-4000:],
        duration_seconds=round(time.monotonic() - started, 4),
        armed=cell.kill,
    )


def run_cell(ctx: LabContext, cell: CrashCell) -> ScenarioResult:
    result = ScenarioResult(cell.cell_id)
    started = time.monotonic()
    folder = ctx.scenario_dir("replies", cell.cell_id.replace("[", "-").rstrip("]"))
    aid = f"A-{cell.name}-{cell.platform}-{cell.mode}"
    chat = f"k-{cell.name}"
    args = _args(folder, cell, aid, chat)
    if cell.kill in ("hold", "hold_after"):
        first = _kill_while_parked(ctx, folder, cell, args, aid)
        result.require(bool(first.response["parked"]), f"the platform never parked: {first.stderr}")
    else:
        first = ctx.child(
            "answer", args, arm=cell.kill, token=folder / "crash.token", module=MODULE
        )
        result.require((folder / "crash.token").exists(), f"{cell.kill} was never reached")
    result.processes.append(first)
    result.require(
        first.exit_code == KILLED, f"expected SIGKILL, got {first.exit_code}: {first.stderr}"
    )

    with Ledger(str(folder / "app.db")) as ledger:
        result.before = {**snapshot(ledger), "visible": _visible(folder, cell, chat)}
    second = ctx.child("answer", args, module=MODULE)
    result.processes.append(second)
    result.require(second.exit_code == 0, f"the restart failed: {second.stderr[-800:]}")
    response = second.response if isinstance(second.response, dict) else {}
    result.require(response.get("new") is False, "the re-delivered inbound was admitted as new")

    operations = len(ChatView(sorted(folder.glob("*.jsonl"))).operations)
    idle = ctx.child("answer", args, module=MODULE)
    result.processes.append(idle)
    result.require(idle.exit_code == 0, f"the idle restart failed: {idle.stderr[-800:]}")
    after_ops = len(ChatView(sorted(folder.glob("*.jsonl"))).operations)
    result.require(after_ops == operations, "an idle restart touched the chat")

    with Ledger(str(folder / "app.db")) as ledger:
        inbound = ledger.inbound.list(limit=10)
        result.require(len(inbound) == 1, f"inbound rows: {len(inbound)}")
        if inbound:
            for failure in check_reply(
                folder, ledger, cell.platform, chat, aid, inbound[0].id, cell.expect
            ):
                result.require(False, failure)
            result.require(inbound[0].deliveries == 3, "re-deliveries were not counted")
        result.after = {**snapshot(ledger), "visible": _visible(folder, cell, chat)}
    result.summary = {
        "kill": cell.kill,
        "expect": cell.expect,
        "seed_gap": cell.seed_gap,
        "crash_exit": first.exit_code,
        "visible_messages": len(result.after["visible"]),
        "marked_messages": sum(1 for m in result.after["visible"] if m["marked"]),
    }
    result.duration_seconds = time.monotonic() - started
    return result


def _visible(folder: Path, cell: CrashCell, chat: str) -> list[dict[str, object]]:
    from oncewire.lab.replies_rig import PROFILES

    profile = PROFILES[cell.platform]
    return [
        {
            "message_id": m.message_id,
            "edits": m.edits,
            "marked": profile.strip_marker(m.text)[1],
            "chars": len(m.text),
        }
        for m in ChatView(sorted(folder.glob("*.jsonl"))).visible(cell.platform, chat)
    ]


@suite("replies", "the reply engine killed at each crash window, restarted, checked on screen")
def run_replies(ctx: LabContext) -> list[ScenarioResult]:
    results = []
    for cell in CELLS:
        ctx.progress.update(f"replies: {cell.cell_id}")
        results.append(run_cell(ctx, cell))
    return results
