"""Seed 002's invariants I1-I6 (GATEWAY.md §1.2), checked after every cell from the evidence
only: the platform fakes' journals (:class:`~oncewire.testing.ChatView`), the fake
model's request log (:class:`~tests.gateway.seed002.harness.ModelTurns`) and the store read
directly. :func:`assert_exactly_once` is the one checker; a cell says which expectation it has:

* ``exact``: one complete unmarked copy of the reply, nothing else;
* ``one_copy``: exactly one complete copy, which may carry the duplicate marker (a retry of a
  send the platform may never have seen);
* ``marked_dupes``: at most one unmarked complete copy, every other copy marked (the platform
  may hold a first copy whose acknowledgement was lost).

Every kind also requires (I1) no partial copy left visible and at least one complete copy,
(I3) each complete copy's text, re-joined across its chunks with markers stripped, equal to the
answer the store persisted, persisted once, (I4) one inbound row and one model turn for the
token, and (I6) no stray turn: no resumed or unscripted answer in the chat, no resume of the
token at the model.
"""

from __future__ import annotations

from typing import Literal

from oncewire.testing.fake_platform import Copy
from tests.gateway.seed002.harness import (
    PROFILES,
    Seed002,
    header,
    norm,
)

__all__ = ["Expect", "assert_exactly_once", "copies_of", "persisted_answers", "user_rows"]

Expect = Literal["exact", "one_copy", "marked_dupes"]


def copies_of(rig: Seed002, platform: str, chat: str, aid: str) -> list[Copy]:
    """The renditions of ``aid``'s reply the chat shows (each from its header on)."""
    found, _ = rig.view().copies(platform, chat, header(aid), f"<</{aid}>>", PROFILES[platform])
    return found


def persisted_answers(rig: Seed002, aid: str) -> list[str]:
    """Every reply text the store holds that answers as ``aid`` (any chat, any state)."""
    return [
        str(r["final_text"])
        for r in rig.reply_rows()
        if r["final_text"] is not None and header(aid) in str(r["final_text"])
    ]


def user_rows(rig: Seed002, platform: str, chat: str, token: str) -> list[dict[str, object]]:
    """The inbound rows whose message carries ``[in:TOKEN]``."""
    return [r for r in rig.inbound_rows(platform, chat) if f"[in:{token}]" in str(r["payload"])]


def assert_exactly_once(
    rig: Seed002,
    platform: str,
    chat: str,
    token: str,
    aid: str,
    expect: Expect = "exact",
    *,
    resumes_allowed: int = 0,
) -> Copy:
    """I1-I6 for the message ``[in:TOKEN]`` answered as ``aid``; the complete copy the user
    reads as the answer (the unmarked one, when there is one)."""
    ctx = rig.dump([(platform, chat)])
    copies = copies_of(rig, platform, chat, aid)
    persisted = persisted_answers(rig, aid)
    # I3: the answer is persisted exactly once.
    assert len(persisted) == 1, f"answer {aid} persisted {len(persisted)}x\n{ctx}"
    want = norm(persisted[0])
    complete = [c for c in copies if c.complete]
    partial = [c for c in copies if not c.complete]
    # I1: never silence, never a truncated or stale rendition left on screen.
    assert complete, f"no complete visible reply for {aid} (lost or truncated)\n{ctx}"
    assert not partial, f"a partial rendition of {aid} stayed visible: {partial}\n{ctx}"
    # I3: what the user reads is what was persisted (chunks re-joined, markers stripped).
    for c in complete:
        assert norm(c.text) == want, (
            f"visible reply != persisted text\nvisible:   {norm(c.text)[:300]!r}\n"
            f"persisted: {want[:300]!r}\n{ctx}"
        )
    unmarked = [c for c in complete if not c.marked]
    marked = [c for c in complete if c.marked]
    # I2: the marker rule, per the cell's expectation.
    if expect == "marked_dupes":
        assert len(unmarked) <= 1, (
            f"{len(unmarked)} unmarked copies of {aid} (silent duplicate)\n{ctx}"
        )
    elif expect == "one_copy":
        assert len(complete) == 1, f"{len(complete)} visible copies of {aid}, expected one\n{ctx}"
    else:
        assert len(unmarked) == 1 and not marked, (
            f"expected exactly one unmarked reply for {aid}: unmarked={len(unmarked)} "
            f"marked={len(marked)}\n{ctx}"
        )
    # I6: no stray turn answered in this chat, the token never resumed at the model.
    shown = rig.view().visible(platform, chat)
    stray = [m.text[:80] for m in shown if "<<R-" in m.text or "-extra" in m.text]
    assert not stray, f"an extra model turn (re-run or resume) replied in this chat: {stray}\n{ctx}"
    turns = rig.model_turns()
    assert turns.resumes.get(token, 0) <= resumes_allowed, (
        f"inbound {token} was resumed {turns.resumes.get(token)}x at the model\n{ctx}"
    )
    # I4: one user row and one model turn per inbound.
    rows = user_rows(rig, platform, chat, token)
    assert len(rows) == 1, f"inbound {token} stored {len(rows)}x\n{ctx}"
    assert turns.turns.get(token) == 1, (
        f"inbound {token} started {turns.turns.get(token)} model turns\n{ctx}"
    )
    return unmarked[0] if unmarked else complete[0]
