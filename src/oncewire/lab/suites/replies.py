"""Suite ``replies``: the reply engine killed with SIGKILL at each of its crash windows.

Each cell runs the application process (:mod:`oncewire.lab.children.replies`) on a fresh folder
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

A seeded scenario (``random_kills``) then answers a dozen inbound messages across the three
platforms, streamed or not, short or long, with a few wire faults, and kills the process at
random replies crash points and hits until it gets through. Every reply must be delivered
once; a marker, a second copy or a leftover piece may appear only where the record itself says
a send was ambiguous (a send whose acknowledgement was lost leaves a message nobody can edit).

Two cells are the cases a peer gateway lists as known failures: a streamed first send whose
acknowledgement is lost (``sent_ack_lost_streamed_first_send``) and a streamed answer fully
visible before the process dies with the final text not committed
(``preview_visible_not_committed``).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from oncewire import Ledger
from oncewire.lab.framework import LabContext, ProcessRecord, ScenarioResult, Suite
from oncewire.lab.suites.replies_rig import (
    PROFILES,
    check_reply,
    footer,
    header,
    persisted,
    snapshot,
)
from oncewire.replies import OpKind, OpState, ReplyState
from oncewire.testing.fake_platform import ChatView

__all__ = [
    "CELLS",
    "MODULE",
    "SUITE",
    "CrashCell",
    "check_many",
    "run_cell",
    "run_random_kills",
    "run_replies",
]

MODULE = "oncewire.lab.children.replies"
KILLED = -signal.SIGKILL
HOLD_WAIT_SECONDS = 30.0
RANDOM_COUNT = 12  # inbound messages in the seeded random-kill scenario
RANDOM_KILLS = 8  # armed runs (each killed when the first armed point is reached)


@dataclass(frozen=True)
class CrashCell:
    name: str
    platform: str
    mode: str  # off, one (whole answer in one stream delta) or many
    size: str  # short or long (over both caps)
    kill: str  # a crash point name, or "hold" / "hold_after" (killed from outside)
    expect: str  # exact, one_copy or marked_dupes (see suites.replies_rig.check_reply)
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


def _app_db(ctx: LabContext, folder: Path, key: str) -> str:
    """The application's store for one scenario, on the lab's backend (the fake platforms'
    journals stay files in ``folder``)."""
    pair = ctx.backend.pair(folder)
    ctx.pairs[key] = pair
    return pair.caller


def _args(folder: Path, db: str, cell: CrashCell, aid: str, chat: str) -> list[str]:
    return [
        "--directory",
        str(folder),
        "--db",
        db,
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
    db = _app_db(ctx, folder, f"replies/{cell.cell_id}")
    args = _args(folder, db, cell, aid, chat)
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

    with Ledger(db) as ledger:
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

    with Ledger(db) as ledger:
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


def run_random_kills(ctx: LabContext, *, count: int, kills: int) -> ScenarioResult:
    """Seeded: ``count`` inbound messages, the process killed ``kills`` times at random replies
    crash points and hits, restarted each time; then every reply is checked."""
    import random

    import oncewire.replies  # noqa: F401  (registers the replies crash points)
    from oncewire.core import crash

    result = ScenarioResult(f"random_kills[seed={ctx.seed},count={count}]")
    started = time.monotonic()
    folder = ctx.scenario_dir("replies", f"random-kills-{ctx.seed}")
    db = _app_db(ctx, folder, f"replies/random-kills-{ctx.seed}")
    rng = random.Random(f"replies-kills/{ctx.seed}")
    points = sorted(name for name in crash.registry() if name.startswith("replies."))
    base = ["--directory", str(folder), "--db", db, "--seed", str(ctx.seed)]
    fired = 0
    for attempt in range(kills):
        # Each armed run brings new inbound messages, so there is work in flight to kill.
        upto = max(1, count * (attempt + 1) // kills)
        # Every replies point is armed, each at its own random hit; the first reached fires.
        arm = ",".join(f"{point}@{rng.randint(1, 4)}" for point in points)
        record = ctx.child(
            "many",
            [*base, "--count", str(upto)],
            arm=arm,
            token=folder / f"crash-{attempt}.token",
            module=MODULE,
        )
        result.processes.append(record)
        if record.exit_code == KILLED:
            fired += 1
            continue
        result.require(record.exit_code == 0, f"run {attempt} failed: {record.stderr[-800:]}")
    final = ctx.child("many", [*base, "--count", str(count)], module=MODULE)
    result.processes.append(final)
    result.require(final.exit_code == 0, f"the final run failed: {final.stderr[-800:]}")
    result.require(fired > 0, "no armed crash point was reached")
    summary = check_many(folder, db, ctx.seed, count, result)
    result.summary = {"kills": fired, "armed_runs": kills, **summary}
    result.duration_seconds = time.monotonic() - started
    return result


def check_many(
    folder: Path, db: str, seed: int, count: int, result: ScenarioResult
) -> dict[str, int]:
    """Every inbound answered once and delivered; at most one unmarked complete copy each; a
    marker, a second copy or a leftover piece only where the record holds an ambiguous send."""
    from oncewire.lab.children.replies import spec

    view = ChatView(sorted(folder.glob("*.jsonl")))
    totals = {"replies": 0, "exact": 0, "marked_copies": 0, "marked_pieces": 0, "leftovers": 0}
    with Ledger(db) as ledger:
        inbound = {i.platform_message_id: i for i in ledger.inbound.list(limit=10_000)}
        result.require(len(inbound) == count, f"{len(inbound)} inbound rows for {count} messages")
        for index in range(count):
            item = spec(seed, index)
            row = inbound.get(item["message_id"])
            if row is None:
                continue
            reply = ledger.replies.for_inbound(row.id)
            texts = persisted(ledger, row.id)
            name = f"inbound {index} ({item['platform']}, {item['mode']}, {item['size']})"
            if not result.require(len(texts) == 1, f"{name}: persisted {len(texts)}x"):
                continue
            text = texts[0]
            result.require(
                reply is not None and reply.state is ReplyState.DELIVERED,
                f"{name}: reply is {reply and reply.state}",
            )
            result.require(reply is not None and reply.final_text == text, f"{name}: text differs")
            ops = [] if reply is None else ledger.replies.ops(reply.id)
            ambiguous = any(op.kind is OpKind.SEND and op.state is OpState.AMBIGUOUS for op in ops)
            copies, others = view.copies(
                item["platform"],
                item["chat"],
                header(item["aid"]),
                footer(item["aid"]),
                PROFILES[item["platform"]],
            )
            complete = [c for c in copies if c.complete]
            unmarked = [c for c in complete if not c.marked]
            leftovers = [c for c in copies if not c.complete] + [None] * len(others)
            result.require(bool(complete), f"{name}: no complete visible reply")
            # Where a chunk was re-sent after an ambiguous send, the copy is read with the
            # marked re-send superseding the piece it repeats (the record holds that send).
            result.require(
                all(c.text == text or (ambiguous and c.text_as_read == text) for c in complete),
                f"{name}: visible != committed",
            )
            result.require(len(unmarked) <= 1, f"{name}: {len(unmarked)} unmarked copies")
            honest = ambiguous or (len(complete) == 1 and not complete[0].marked and not leftovers)
            result.require(honest, f"{name}: a marker or extra piece with no ambiguous send")
            totals["replies"] += 1
            totals["marked_copies"] += len(complete) - len(unmarked)
            totals["marked_pieces"] += sum(sum(c.piece_marks[1:]) for c in complete)
            totals["leftovers"] += len(leftovers)
            totals["exact"] += int(len(complete) == 1 and not complete[0].marked and not leftovers)
    return totals


def run_replies(ctx: LabContext) -> Iterator[ScenarioResult]:
    for cell in CELLS:
        ctx.progress.update(f"replies: {cell.cell_id}")
        yield run_cell(ctx, cell)
    ctx.progress.update("replies: random kills")
    yield run_random_kills(ctx, count=RANDOM_COUNT, kills=RANDOM_KILLS)


SUITE = Suite(
    "replies",
    "the reply engine killed at each crash window, restarted, checked on screen",
    run_replies,
    key_numbers=("crash_exit", "kills", "visible_messages", "marked_messages"),
)
