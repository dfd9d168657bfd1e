"""What the ``gateway`` lab suite's scenarios share: the scenario record and the verdict.

:func:`check_answer` judges one message from the evidence only (the store read directly, the
platform fake's chat journal): answered once with the expected text and delivered, shown as
the expectation allows (``exact``, ``one_copy``, ``marked_dupes``, the seed 002 kinds), no
partial or other message left, and a marked copy only where the record holds an ambiguous
send.
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
    "Scenario",
    "check_answer",
    "died_at",
    "killed",
    "parked",
    "shows",
    "text_answer",
]

KILLED = -signal.SIGKILL
EXPECTATIONS = ("exact", "one_copy", "marked_dupes")


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    run: Callable[[GatewayRig, ScenarioResult, Path], None]
    script: tuple[dict[str, Any], ...]
    streaming: bool = True
    platform: str = "telegram"  # or "webhook": the generic platform that cannot edit


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
