"""Seed 002's crash matrix (GATEWAY.md §1.5) on the streaming Discord platform ``fk_dc``.

The cells themselves, C1-C6 on their seed platforms (Telegram and the generic webhook
platform), live in one place: the ``gateway`` lab suite's scenario table
(:data:`oncewire.lab.suites.gateway_cells.CELLS`), judged by the lab's verdict and run by
tests/gateway/test_lab_gateway.py on both backends. What the lab's rig does not drive yet is
Discord, so the cells §1.5 sets on a streaming platform (C3, C5, C6) run here on ``fk_dc`` too:
the parked operation is an edit of the preview (PATCH), replayed or overwritten after the
restart the same way. The cells on PostgreSQL are soak cells (:func:`soak_only`).

Each cell scripts the answer ``<<A-TOKEN>> ... <</A-TOKEN>>`` for ``[in:TOKEN]`` (and, for a
turn that never finished, the resumed answer ``<<R-TOKEN-1>> ... <</R-TOKEN-1>>``), reaches its
instant (a ``hold`` / ``hold_after`` fault on the operation whose text carries the footer,
observed in the fake's journal), kills the gateway's process group with SIGKILL, starts a new
gateway and waits until the chat is idle in the store (H4). :func:`assert_single_final_reply`
is the seed's verdict, read from the fakes' journals, the model's request log and the store:

* at most one unmarked complete reply; an extra copy only marked, and only where the platform
  may hold a copy whose acknowledgement died with the process (``sent_ack_lost``);
* nothing partial left on screen, and never both the held answer and a resumed re-answer;
* the visible final equals the one persisted answer (the original, or the resumed one);
* one model turn and one user row for the token; a resume only where the turn never finished.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.gateway.seed002.checks import copies_of, persisted_answers, user_rows
from tests.gateway.seed002.conftest import BACKENDS
from tests.gateway.seed002.harness import (
    DC,
    STREAMING,
    Seed002,
    answer,
    footer,
    header,
    norm,
)

pytestmark = pytest.mark.crash

HOLD_SECONDS = 600.0  # a parked operation outlives the cell: only the kill ends it
# ~1.5 s of stream on Telegram: even on a busy host the first preview shows only a prefix, so
# the whole answer first appears in an edit of a recorded message, as in the seed's cells.
PACED: dict[str, Any] = {"chunk_chars": 8, "delay_per_chunk": 0.1}


@dataclass(frozen=True)
class CrashCell:
    seed_id: str  # C1..C6
    point: str  # the seed's crash point id
    platform: str
    fault: str  # hold (never applied) or hold_after (applied, the ack parked)
    stalls: bool = False  # the stream shows the whole answer, then stays open (C6)
    persisted_before_kill: bool = False  # the seed waits for the answer to be persisted (C5)


CELLS = {
    "C3-dc": CrashCell("C3", "send_in_flight", DC, "hold"),
    "C5-dc": CrashCell("C5", "sent_ack_lost", DC, "hold_after", persisted_before_kill=True),
    "C6-dc": CrashCell("C6", "stream_accepted_unpersisted", DC, "hold_after", stalls=True),
}


def soak_only(test: str, params: dict[str, Any]) -> bool:
    """The default run keeps the Discord cells on SQLite; on PostgreSQL they run in the soak
    run only (the lab runs its cells on PostgreSQL, and the store's verbs are the same)."""
    return params.get("backend") == "postgresql"


def resumed_aid(token: str) -> str:
    return f"R-{token}-1"


def run_crash_cell(rig: Seed002, cell_id: str) -> tuple[str, str, str]:
    """Drive ``cell_id`` to its instant, SIGKILL, restart, wait for the chat to settle; the
    token, the chat and the answer's id."""
    cell = CELLS[cell_id]
    token = f"{cell.platform}.crash-{cell.point}"
    chat = rig.chat(cell.platform, f"k-{cell.platform}-{cell.point}")
    aid = f"A-{token}"
    text = f"{header(aid)} answer computed before the crash. {footer(aid)}"
    pace = PACED if STREAMING[cell.platform] else {}
    first: dict[str, Any] = {"kind": "text", "text": text, **pace}
    if cell.stalls:
        first = {
            "kind": "stall_mid_stream",
            "text": text,
            "after_chars": len(text),
            "seconds": HOLD_SECONDS,
            **pace,
        }
    resume = answer(resumed_aid(token), "resumed after the restart.", **pace)
    rig.script(token, first, resume=[resume])
    rig.fault(
        cell.platform,
        cell.fault,
        chat=chat,
        op="any",
        contains=footer(aid),
        hold_seconds=HOLD_SECONDS,
    )
    rig.inject(cell.platform, chat, f"[in:{token}] question")
    assert rig.gateway is not None
    rig.wait_until(
        lambda: any(f["kind"] == cell.fault for f in rig.faults_fired(cell.platform, chat)),
        f"{token}: the operation carrying the footer to park",
    )
    if cell.persisted_before_kill:
        rig.wait_until(lambda: bool(persisted_answers(rig, aid)), f"{token}: the answer persisted")
    if cell.stalls:
        # The instant of C6: the chat shows the whole answer (a hold_after is journaled as fired
        # just before the platform applies the operation), nothing is persisted.
        rig.wait_until(
            lambda: [norm(m.text) for m in rig.view().visible(cell.platform, chat)] == [norm(text)],
            f"{token}: the whole answer shown\n{rig.dump([(cell.platform, chat)])}",
        )
        assert persisted_answers(rig, aid) == []
    rig.kill9()
    rig.start()
    rig.wait_until(
        lambda: any(
            c.complete
            for a in (aid, resumed_aid(token))
            for c in copies_of(rig, cell.platform, chat, a)
        ),
        f"{token}: a complete reply after the restart\n{rig.dump([(cell.platform, chat)])}",
    )
    rig.wait_idle([(cell.platform, chat)], f"{token} to settle after the restart")
    return token, chat, aid


def assert_single_final_reply(rig: Seed002, cell_id: str, token: str, chat: str, aid: str) -> None:
    """The seed's ``_assert_single_final_reply``, on the evidence only."""
    cell = CELLS[cell_id]
    platform = cell.platform
    ctx = rig.dump([(platform, chat)])
    originals = copies_of(rig, platform, chat, aid)
    resumes = copies_of(rig, platform, chat, resumed_aid(token))
    complete = [c for c in originals + resumes if c.complete]
    unmarked = [c for c in complete if not c.marked]
    assert complete, f"no complete reply after the restart\n{ctx}"
    assert len(unmarked) <= 1, f"{len(unmarked)} unmarked complete replies after catch-up\n{ctx}"
    extra_allowed = 1 if cell.point == "sent_ack_lost" else 0
    assert len(complete) - len(unmarked) <= extra_allowed or not unmarked, (
        f"unexpected extra marked copies\n{ctx}"
    )
    # Nothing partial stays on screen: an interrupted preview is edited into the final answer.
    assert not [c for c in originals + resumes if not c.complete], ctx
    others = [
        m.text
        for m in rig.view().visible(platform, chat)
        if not any(m.message_id in c.message_ids for c in originals + resumes)
    ]
    assert not others, f"a message that is no copy of the answer: {others}\n{ctx}"
    assert not (resumes and [c for c in originals if c.complete]), (
        f"both the held answer and an auto-resumed re-answer are visible\n{ctx}"
    )
    final_aid = resumed_aid(token) if resumes else aid
    final = resumes[0] if resumes else next(c for c in originals if c.complete)
    persisted = persisted_answers(rig, final_aid)
    assert len(persisted) == 1 and norm(persisted[0]) == norm(final.text), (
        f"the visible final is not the one persisted answer: {persisted}\n{ctx}"
    )
    if final_aid != aid:
        assert persisted_answers(rig, aid) == [], f"the unfinished answer was persisted\n{ctx}"
    turns = rig.model_turns()
    assert turns.turns.get(token) == 1, f"{token} started {turns.turns.get(token)} turns\n{ctx}"
    assert len(user_rows(rig, platform, chat, token)) == 1, ctx
    # A turn is resumed only if it never finished; a committed answer is never asked again.
    assert turns.resumes.get(token, 0) == (1 if final_aid != aid else 0), (
        f"{token} resumed {turns.resumes.get(token, 0)}x at the model\n{ctx}"
    )
    # The store: the message delivered, its reply delivered, its turn answered once.
    (inbound,) = rig.inbound_rows(platform, chat)
    assert inbound["status"] == "delivered", ctx
    (reply,) = rig.reply_rows(platform, chat)
    assert reply["state"] == "delivered" and norm(str(reply["final_text"])) == norm(final.text)
    runs = [r for r in rig.run_rows() if r["run_id"] == f"turn:{inbound['id']}"]
    assert [r["status"] for r in runs] == ["answered"], runs


def expectations(cell_id: str, rig: Seed002, token: str, chat: str, aid: str) -> None:
    """What GATEWAY.md §1.5 says oncewire does after the restart, beyond the seed's verdict."""
    cell = CELLS[cell_id]
    originals = copies_of(rig, cell.platform, chat, aid)
    resumes = copies_of(rig, cell.platform, chat, resumed_aid(token))
    ctx = rig.dump([(cell.platform, chat)])
    cell_id = cell.seed_id
    if cell_id == "C3":  # the parked edit replayed, or the turn resumed onto that message
        fired = {f["op"] for f in rig.faults_fired(cell.platform, chat)}
        assert fired == {"edit"}, ctx
        shown = [(c.complete, c.marked) for c in originals + resumes]
        assert shown == [(True, False)], ctx
    elif cell_id == "C5":  # the final edit replayed ("not modified"): one unmarked copy
        assert {f["op"] for f in rig.faults_fired(cell.platform, chat)} == {"edit"}, ctx
        assert [(c.complete, c.marked) for c in originals] == [(True, False)], ctx
        assert not resumes, ctx
    elif cell_id == "C6":  # LIVE GAP cell 2: the resumed answer overwrote the preview
        assert not originals, f"the unpersisted original is still visible\n{ctx}"
        assert [(c.complete, c.marked) for c in resumes] == [(True, False)], ctx
        first = rig.view().visible(cell.platform, chat)[0]
        assert first.edits >= 1, f"the recorded preview was not edited\n{ctx}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "cell_id",
    list(CELLS),
    ids=[f"{CELLS[c].seed_id}-{CELLS[c].point}-{CELLS[c].platform}" for c in CELLS],
)
def test_crash_between_completion_and_send(
    fresh_rig: Callable[..., Seed002], cell_id: str, backend: str
) -> None:
    rig = fresh_rig(backend)
    token, chat, aid = run_crash_cell(rig, cell_id)
    assert_single_final_reply(rig, cell_id, token, chat, aid)
    expectations(cell_id, rig, token, chat, aid)
