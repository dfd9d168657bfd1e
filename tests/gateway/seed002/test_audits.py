"""The module-wide audits A1 and A2 (:mod:`tests.gateway.seed002.audits`) shown able to fail.

A1 and A2 themselves run last in every module that serves cells on the shared gateway
(``test_fault_matrix``, ``test_busy``, ``test_redelivery``). Here each audit first passes on a
gateway of its own that answered a message on each platform, then is shown to catch what it
looks for: a second unmarked copy of an answer planted on the webhook platform (A1), and a
message or a model request appearing after the unclean restart (A2).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable

import httpx2

from tests.gateway.seed002.audits import unclean_restart_reruns_nothing, whole_run_audit
from tests.gateway.seed002.checks import assert_exactly_once
from tests.gateway.seed002.harness import HOOK_SECRET, NE, PLATFORMS, PROFILES, Seed002, answer


def answered(rig: Seed002) -> str:
    """One message answered on each platform; the webhook platform's chat."""
    for platform in PLATFORMS:
        token = f"{platform}.audited"
        chat = rig.chat(platform, f"audit-{platform}")
        rig.script(token, answer(f"A-{token}", "answered once."))
        rig.inject(platform, chat, f"[in:{token}] hi")
        rig.wait_idle([(platform, chat)], token)
        assert_exactly_once(rig, platform, chat, token, f"A-{token}", "exact")
    return rig.chat(NE, f"audit-{NE}")


def plant(rig: Seed002, chat: str, text: str) -> None:
    """A message appears in a webhook platform chat, sent by someone else than the gateway."""
    body = json.dumps({"chat": chat, "text": text}).encode()
    signature = "sha256=" + hmac.new(HOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
    done = httpx2.post(
        f"{rig.bases[NE]}/messages",
        content=body,
        headers={"content-type": "application/json", "Oncewire-Signature": signature},
    )
    assert done.status_code == 200, done.text


def test_a1_finds_a_second_unmarked_copy(fresh_rig: Callable[..., Seed002]) -> None:
    rig = fresh_rig()
    chat = answered(rig)
    assert whole_run_audit(rig) == []
    text = f"<<A-{NE}.audited>> answered once. <</A-{NE}.audited>>"
    plant(rig, chat, PROFILES[NE].render(text, True))  # a marked copy is allowed
    assert whole_run_audit(rig) == []
    plant(rig, chat, text)
    assert whole_run_audit(rig) == [f"A-{NE}.audited: 2 unmarked complete replies"]


def test_a1_finds_a_stray_message(fresh_rig: Callable[..., Seed002]) -> None:
    rig = fresh_rig()
    chat = answered(rig)
    plant(rig, chat, "Sorry, something went wrong.")
    problems = whole_run_audit(rig)
    assert problems == [
        f"{NE}:{chat}: a message no answer explains: 'Sorry, something went wrong.'"
    ]


def test_a2_finds_a_message_after_the_restart(fresh_rig: Callable[..., Seed002]) -> None:
    rig = fresh_rig()
    chat = answered(rig)
    problems = unclean_restart_reruns_nothing(rig, during=lambda: plant(rig, chat, "again"))
    assert len(problems) == 1 and problems[0].startswith("the restart touched the chats"), problems


def test_a2_finds_a_model_request_after_the_restart(fresh_rig: Callable[..., Seed002]) -> None:
    rig = fresh_rig()
    answered(rig)

    def ask() -> None:
        body = {"messages": [{"role": "user", "content": "anything"}], "tools": []}
        httpx2.post(f"{rig.model_base}/v1/chat/completions", json=body, timeout=30)

    problems = unclean_restart_reruns_nothing(rig, during=ask)
    assert len(problems) == 1 and problems[0].startswith("the restart asked the model"), problems
