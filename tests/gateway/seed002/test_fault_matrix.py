"""Seed 002's fault matrix (GATEWAY.md §1.3): F1-F14 x {fk_tg, fk_ne, fk_dc} x {SQLite,
PostgreSQL}, each cell one message in a chat of its own through the module's real ``oncewire
gateway run``.

A cell scripts the model's answer ``<<A-TOKEN>> ... <</A-TOKEN>>`` for ``[in:TOKEN]``, arms its
fault on the platform fake (``footer``: the operation whose text carries the footer, i.e. the
one showing the final answer; ``header``: the reply's first platform call), sends the message,
waits for the chat to be idle in the store (H4), asserts the fault fired (H11) and checks
I1-I6 (:func:`~tests.gateway.seed002.checks.assert_exactly_once`) with the cell's expectation.

On ``fk_ne`` (not editable, streaming off) every streaming cell is a fault on the one final
send. On ``fk_dc`` every create carries the reply slot's nonce with ``enforce_nonce``: F10
(``ack_lost``, LIVE GAP cell 1) expects one unmarked copy (``exact``, stricter than the seed's
``marked_dupes``), since the resend carries the same nonce and Discord answers it with the
message the first create made; the cell also reads the fake's call log for the two creates and
their one nonce. Scaled from the seed, keeping the path each cell exercises: ``long_streamed``
streams its 8.1k characters in 2.5k chunks 0.3 s apart (the seed: 1 s), still one chunk per
preview tick (0.05 s); ``burst_overflow`` its two 4.5k bursts 1 s apart (the seed: 3 s).

The default run has each fault on both backends, each time on another platform: on
PostgreSQL on :data:`ON_POSTGRESQL`'s (every platform in turn, where the fault's path differs
most: Discord's nonce for ``ack_lost``, its interim repeat for ``stream_timeout_first_send``),
on SQLite on the next platform of :data:`PLATFORMS` (:func:`on_sqlite`), so every platform
meets faults on both backends, and each outcome class (``exact``, ``one_copy``,
``marked_dupes``) is met on both. The whole matrix, every fault on every platform on both
backends, runs in the soak run (``make soak``). The store's verbs are the same
on both backends and the contract tests hold them to it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest

from tests.gateway.seed002 import audits
from tests.gateway.seed002.checks import Expect, assert_exactly_once
from tests.gateway.seed002.harness import (
    DC,
    HOOK_SECRET,
    NE,
    PLATFORMS,
    PROFILES,
    STREAMING,
    TG,
    Seed002,
    answer,
    footer,
)

LONG = " ".join(f"word{i:04d}" for i in range(900))  # ~8.1k characters: over both caps
SLOW: dict[str, Any] = {"chunk_chars": 6, "delay_per_chunk": 0.03}  # ~2 s: preview + edits

Build = Callable[[str], list[dict[str, Any]]]


def say(body: str, **kw: Any) -> Build:
    return lambda aid: [answer(aid, body, **kw)]


def tool_then_answer(aid: str) -> list[dict[str, Any]]:
    return [
        {"kind": "tool_call", "name": "terminal", "args": {"command": "echo hi"}},
        answer(aid, "after the tool, done."),
    ]


@dataclass(frozen=True)
class Cell:
    fault: str | None  # a Fault kind, or None for a clean cell
    op: str  # send, edit or any
    target: str  # footer: the op carrying the final text; header: the reply's first call
    build: Build
    expect: Expect


FAULTS: dict[str, Cell] = {
    "clean": Cell(None, "any", "footer", say("short answer."), "exact"),
    "tool_then_answer": Cell(None, "any", "footer", tool_then_answer, "exact"),
    "long_split": Cell(None, "any", "footer", say(LONG, chunk_chars=10_000), "exact"),
    "long_streamed": Cell(
        None, "any", "footer", say(LONG, chunk_chars=2500, delay_per_chunk=0.3), "exact"
    ),
    "burst_overflow": Cell(
        None, "any", "footer", say(LONG, chunk_chars=4500, delay_per_chunk=1.0), "exact"
    ),
    "slow_stream": Cell(
        None, "any", "footer", say("a slowly streamed answer " * 6, **SLOW), "exact"
    ),
    "rate_limit_429": Cell(
        "rate_limit", "any", "footer", say("throttled once then fine."), "exact"
    ),
    "conn_reset": Cell(
        "conn_error",
        "any",
        "footer",
        say("connection reset once.", chunk_chars=8, delay_per_chunk=0.1),
        "exact",
    ),
    "send_timeout": Cell(
        "timeout", "any", "footer", say("platform never saw the first try."), "one_copy"
    ),
    "ack_lost": Cell(
        "ack_lost",
        "any",
        "footer",
        say("sent but the ack vanished.", chunk_chars=10_000),
        "marked_dupes",
    ),
    "stream_429_final_edit": Cell(
        "rate_limit", "any", "footer", say("stream throttled " * 8, **SLOW), "exact"
    ),
    "stream_timeout_final_edit": Cell(
        "timeout", "any", "footer", say("stream final lost " * 8, **SLOW), "one_copy"
    ),
    "stream_ack_lost_final_edit": Cell(
        "ack_lost", "any", "footer", say("stream ack lost " * 8, **SLOW), "marked_dupes"
    ),
    "stream_timeout_first_send": Cell(
        "timeout",
        "send",
        "header",
        say("preview never landed " * 8, chunk_chars=42, delay_per_chunk=0.5),
        "one_copy",
    ),
}
# The seed's cell ids, F1..F14 in its order.
CELL_IDS = {name: f"F{n}" for n, name in enumerate(FAULTS, start=1)}
# Where a platform guarantees more than the seed's expectation: Discord's nonce.
STRICTER: dict[tuple[str, str], Expect] = {(DC, "ack_lost"): "exact"}
# The platform each fault runs on against PostgreSQL in the default run.
ON_POSTGRESQL: dict[str, str] = {
    "clean": NE,
    "tool_then_answer": TG,
    "long_split": DC,
    "long_streamed": TG,
    "burst_overflow": DC,
    "slow_stream": TG,
    "rate_limit_429": NE,
    "conn_reset": TG,
    "send_timeout": NE,
    "ack_lost": DC,
    "stream_429_final_edit": DC,
    "stream_timeout_final_edit": TG,
    "stream_ack_lost_final_edit": TG,
    "stream_timeout_first_send": DC,
}
assert set(ON_POSTGRESQL) == set(FAULTS) and set(ON_POSTGRESQL.values()) == set(PLATFORMS)


def on_sqlite(name: str) -> str:
    """The platform the default run has fault ``name`` on against SQLite: the one after its
    PostgreSQL platform in :data:`PLATFORMS`."""
    return PLATFORMS[(PLATFORMS.index(ON_POSTGRESQL[name]) + 1) % len(PLATFORMS)]


def soak_only(test: str, params: dict[str, Any]) -> bool:
    """A matrix cell runs in the soak run only (marked ``slow``) off the default run's one
    platform per fault and backend: :data:`ON_POSTGRESQL` on PostgreSQL, :func:`on_sqlite` on
    SQLite."""
    if test != "test_delivery_fault_matrix":
        return False
    name = params["name"]
    kept = ON_POSTGRESQL[name] if params.get("rig") == "postgresql" else on_sqlite(name)
    return params["platform"] != kept


def run_cell(rig: Seed002, platform: str, name: str) -> None:
    cell = FAULTS[name]
    token = f"{platform}.{name}"
    chat = rig.chat(platform, f"m-{platform}-{name}")
    aid = f"A-{token}"
    rig.script(token, *cell.build(aid))
    if cell.fault is not None and cell.fault != "conn_error":
        contains = footer(aid) if cell.target == "footer" else None
        rig.fault(platform, cell.fault, chat=chat, op=cell.op, contains=contains)
    rig.inject(platform, chat, f"[in:{token}] please answer")
    if cell.fault == "conn_error":
        # A blackout refuses every connection while it lasts (nothing is read, so it cannot
        # match a text): it starts with the model's stream (~1 s) and lasts 4 s, so the
        # operation showing the final answer meets the closed port.
        rig.wait_until(
            lambda: bool(rig.model_turns().turns.get(token)), f"{token}: the model turn to start"
        )
        rig.fault(platform, "conn_error", chat=chat, blackout_seconds=4.0)
    rig.wait_idle([(platform, chat)], f"{token} to finish")
    if cell.fault is not None:
        fired = rig.faults_fired(platform, chat)
        assert fired, f"the injected {cell.fault} never hit a platform call\n" + rig.dump(
            [(platform, chat)]
        )
    if cell.fault == "conn_error":
        # The refused connections never reach the fake: the store shows an operation refused.
        ops = rig.reply_ops(platform, chat)
        assert any(op["state"] == "refused" for op in ops), ops
    expect = STRICTER.get((platform, name), cell.expect)
    shown = assert_exactly_once(rig, platform, chat, token, aid, expect)
    if (platform, name) == (DC, "ack_lost"):
        assert_one_nonce(rig, chat)
    if name in ("long_split", "long_streamed", "burst_overflow"):
        # Over the cap: the answer the user reads is split over several messages.
        assert len(shown.message_ids) >= 2, rig.dump([(platform, chat)])
    if cell.fault is not None and cell.op != "any":
        assert {f["op"] for f in rig.faults_fired(platform, chat)} == {cell.op}
    if name == "tool_then_answer":
        assert_tool_turn(rig, token)


def assert_one_nonce(rig: Seed002, chat: str) -> None:
    """The fake Discord's call log: the create whose acknowledgement was lost was sent again
    with the same nonce (``enforce_nonce``), and every create of the chat carried that one
    nonce, so the platform kept one message."""
    creates = [
        c
        for c in rig.discord_calls()
        if c["method"] == "POST" and c["path"].endswith(f"/channels/{chat}/messages")
    ]
    assert len(creates) >= 2, creates
    assert {c["body"]["nonce"] for c in creates} == {creates[0]["body"]["nonce"]}, creates
    assert all(c["body"]["enforce_nonce"] is True for c in creates), creates


def assert_tool_turn(rig: Seed002, token: str) -> None:
    """H6 and H7: every request of the turn offered the tool ``terminal``; the follow-up ended
    with the tool's result (a continuation of the same turn, not a new one)."""
    requests = [
        r["body"] for r in rig.model_requests() if f"[in:{token}]" in str(r["body"]["messages"])
    ]
    assert len(requests) == 2, requests
    for body in requests:
        names = [t["function"]["name"] for t in body.get("tools") or []]
        assert "terminal" in names, body.get("tools")
    last = requests[1]["messages"][-1]
    assert last["role"] == "tool" and "hi" in last["content"], last
    assert rig.model_turns().continuations.get(token) == 1


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", list(FAULTS), ids=[f"{CELL_IDS[n]}-{n}" for n in FAULTS])
def test_delivery_fault_matrix(rig: Seed002, platform: str, name: str) -> None:
    run_cell(rig, platform, name)


@pytest.mark.parametrize("marked", [False, True], ids=["unmarked", "marked"])
def test_the_checker_refuses_a_second_copy(rig: Seed002, marked: bool) -> None:
    """A negative control: a cell that passes, then a second copy of its answer planted on the
    platform (as a silent duplicate would land) makes the exact checker fail; a marked one
    passes only where the expectation allows it."""
    token = f"{NE}.planted-{'marked' if marked else 'unmarked'}"
    chat = rig.chat(NE, f"neg-{token}")
    aid = f"A-{token}"
    rig.script(token, answer(aid, "answered once, then copied."))
    rig.inject(NE, chat, f"[in:{token}] please answer")
    rig.wait_idle([(NE, chat)], token)
    shown = assert_exactly_once(rig, NE, chat, token, aid, "exact")
    body = json.dumps({"chat": chat, "text": PROFILES[NE].render(shown.text, marked)}).encode()
    signature = "sha256=" + hmac.new(HOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
    planted = httpx2.post(
        f"{rig.bases[NE]}/messages",
        content=body,
        headers={"content-type": "application/json", "Oncewire-Signature": signature},
    )
    assert planted.status_code == 200, planted.text
    with pytest.raises(AssertionError, match="exactly one unmarked reply"):
        assert_exactly_once(rig, NE, chat, token, aid, "exact")
    if marked:
        assert_exactly_once(rig, NE, chat, token, aid, "marked_dupes")
    else:
        with pytest.raises(AssertionError, match="silent duplicate"):
            assert_exactly_once(rig, NE, chat, token, aid, "marked_dupes")


def test_every_main_request_offers_tools(rig: Seed002) -> None:
    """H6 across the module: no model request went out without ``tools`` (one message of its
    own first, so the check never looks at an empty log, whatever ran before it)."""
    token = f"{TG}.h6"
    chat = rig.chat(TG, "h6")
    rig.script(token, answer(f"A-{token}", "tools were offered."))
    rig.inject(TG, chat, f"[in:{token}] hello")
    rig.wait_idle([(TG, chat)], token)
    turns = rig.model_turns()
    assert turns.turns.get(token) == 1
    assert turns.without_tools == 0 and turns.unattributed == 0


__all__ = ["DC", "FAULTS", "NE", "ON_POSTGRESQL", "STREAMING", "TG", "run_cell", "soak_only"]

# A1 and A2 run last on this module's gateway (the negative controls' neg- chats left out).
test_zz_whole_run_audit = audits.test_zz_whole_run_audit
test_zzz_unclean_restart_reruns_nothing = audits.test_zzz_unclean_restart_reruns_nothing
