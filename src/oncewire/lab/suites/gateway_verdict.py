"""What the ``gateway`` lab suite's scenarios share: the scenario record and the verdict.

:func:`check_answer` judges one message from the evidence only (the store read directly, the
platform fake's chat journal): admitted once, answered once with the expected text and
delivered, shown as the expectation allows (``exact``, ``one_copy``, ``marked_dupes``, the seed
002 kinds), no partial or other message left, every message shown one the store recorded
sending (or one a send whose acknowledgement was lost may have made), and the duplicate marker
only where a first send may have landed. :func:`check_asked` judges what the model was asked:
one turn per message, and a resume of that turn only where it never finished.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oncewire.lab.framework import ScenarioResult
from oncewire.lab.gateway_rig import GatewayRig

__all__ = [
    "EXPECTATIONS",
    "KILLED",
    "RESUME_PHRASE",
    "Scenario",
    "check_answer",
    "check_asked",
    "died_at",
    "killed",
    "parked",
    "shows",
    "text_answer",
]

KILLED = -signal.SIGKILL
EXPECTATIONS = ("exact", "one_copy", "marked_dupes")
# A send the record holds in one of these states may have reached the platform without its id.
MAYBE_LANDED = ("in_flight", "ambiguous")
RESUME_PHRASE = "previous turn was interrupted"  # what the seed looks for in a resumed request


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    run: Callable[[GatewayRig, ScenarioResult, Path], None]
    script: tuple[dict[str, Any], ...]
    streaming: bool = True
    platform: str = "telegram"  # one of GatewayRig's KINDS: telegram, webhook, discord


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
    leaves a message nobody can edit: its id was never recorded).

    The store is read for the rest, directly: one inbound row per message the user sent, one
    reply record for it, one turn run that ended answered; every message the chat shows is one
    a send of the record made (its acknowledged message id), or one of at most as many as the
    record's sends that may have landed without an id; a send carries the duplicate marker
    only where an earlier send of the same chunk may have landed, and the reply is marked
    exactly when one of its operations was."""
    if expect not in EXPECTATIONS:
        raise ValueError(f"unknown expectation {expect!r}")
    admitted = [str(row["platform_message_id"]) for row in rig.inbound()]
    result.require(
        sorted(admitted) == sorted(rig.injected),
        f"the store admitted {admitted} for the messages sent, {rig.injected}",
    )
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

    ops = [o for o in rig.reply_ops() if o["reply_id"] in {r["id"] for r in replies}]
    _check_sends(result, rig, replies, ops)

    shown = rig.visible()
    seen = [(m.text, m.marked) for m in shown]
    ambiguous = [o for o in ops if o["state"] == "ambiguous"]
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


def _check_sends(
    result: ScenarioResult, rig: GatewayRig, replies: list[dict[str, Any]], ops: list[Any]
) -> None:
    """The record against the chat: no message shown that the store did not send, no marker
    without a send that may have landed before it."""
    sends = [o for o in ops if o["kind"] == "send"]
    recorded = {str(o["message_id"]) for o in sends if o["state"] == "acked"}
    uncertain = [o for o in sends if o["state"] in MAYBE_LANDED]
    unrecorded = [m.message_id for m in rig.visible() if m.message_id not in recorded]
    result.require(
        len(unrecorded) <= len(uncertain),
        f"messages {unrecorded} shown that no acknowledged send of the record made "
        f"({len(uncertain)} send(s) may have landed without an id): a duplicate send",
    )
    for op in sends:
        earlier = [
            o
            for o in uncertain
            if (o["reply_id"], o["slot"]) == (op["reply_id"], op["slot"]) and o["seq"] < op["seq"]
        ]
        result.require(
            not op["marked"] or bool(earlier),
            f"send {op['seq']} of chunk {op['slot']} is marked, but no earlier send of it "
            "may have landed",
        )
    for reply in replies:
        marked = any(o["marked"] for o in ops if o["reply_id"] == reply["id"])
        result.require(
            bool(reply["marked"]) == marked,
            f"the reply's marker decision is {bool(reply['marked'])}, its operations' {marked}",
        )


def check_asked(result: ScenarioResult, rig: GatewayRig, *, resumed: bool) -> None:
    """The model was asked for one turn of the message, and asked again only to resume that
    turn (the newest user message carrying the recovery note), once, where ``resumed`` says the
    turn never finished before the kill; a committed answer is never asked for again."""
    notes = [RESUME_PHRASE in _newest_user_text(r) for r in rig.model_requests()]
    want = [False, True] if resumed else [False]
    names = {False: "a turn", True: "a resume"}
    result.require(
        notes == want,
        f"the model was asked for {[names[n] for n in notes]}, not {[names[n] for n in want]}",
    )


def _newest_user_text(request: dict[str, Any]) -> str:
    body = request.get("body")
    messages = body.get("messages", []) if isinstance(body, dict) else []
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    content = users[-1].get("content", "") if users else ""
    if isinstance(content, list):  # content parts
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content).lower()


def killed(result: ScenarioResult, code: int) -> None:
    result.require(code == KILLED, f"the gateway was not killed by SIGKILL (exit {code})")


def parked(rig: GatewayRig) -> bool:
    return "park" in rig.faults_fired()


def shows(rig: GatewayRig, text: str) -> bool:
    """The chat shows ``text`` alone, unmarked. A ``hold_after`` fault is journaled as fired
    just before the platform applies the operation, so a scenario waits for this too."""
    return [(m.text, m.marked) for m in rig.visible()] == [(text, False)]


def died_at(result: ScenarioResult, rig: GatewayRig, point: str, token: Path) -> None:
    """The armed gateway killed itself at ``point``."""
    code = rig.wait_exit(20.0)
    result.require(token.exists(), f"{point} was never reached in the gateway")
    if code is None:
        code = rig.kill9()
        result.require(False, "the armed gateway did not kill itself")
    killed(result, code)


# -- scenarios -------------------------------------------------------------------------------


def text_answer(text: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "text", "text": text, **extra}
