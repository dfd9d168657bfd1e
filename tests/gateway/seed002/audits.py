"""Seed 002's module-wide audits (GATEWAY.md §1.6), run last on a module's shared gateway.

* A1 :func:`whole_run_audit`: across every chat the module's gateway served, no message ended
  with two unmarked complete replies (its answer, an extra turn or a resumed one), every message
  was answered by one model turn and none was resumed later; the store agrees: every message
  ``delivered`` (or ``superseded`` by a newer one), every reply ``delivered`` (or ``withdrawn``),
  no turn still active.
* A2 :func:`unclean_restart_reruns_nothing`: with everything delivered, SIGKILL and a restart:
  within :data:`QUIET_SECONDS` the chats show no new message and the model gets no request.

A module serving cells on the shared ``rig`` runs both last by binding the two test functions
below at its end (pytest collects a module's tests in the order of its namespace)::

    test_zz_whole_run_audit = audits.test_zz_whole_run_audit
    test_zzz_unclean_restart_reruns_nothing = audits.test_zzz_unclean_restart_reruns_nothing

With several test processes, each process has its own gateway per module; each audits what its
gateway served. Chats named ``neg-...`` hold the checker's negative controls (a duplicate
planted on purpose) and are left out of A1.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import pytest

from tests.conftest import soak_requested
from tests.gateway.seed002.checks import assert_exactly_once
from tests.gateway.seed002.harness import PLATFORMS, PROFILES, Seed002, answer

__all__ = [
    "QUIET_SECONDS",
    "SOAK_QUIET_SECONDS",
    "quiet_seconds",
    "test_zz_whole_run_audit",
    "test_zzz_unclean_restart_reruns_nothing",
    "unclean_restart_reruns_nothing",
    "whole_run_audit",
]

# The seed watches 30 s. Boot recovery is driven by rows and is over within a second or two of
# the ready line, so a re-run would show long before 5 s: the default run watches 5 s (three
# modules and two backends run A2), a soak run the seed's 30 s, and
# ONCEWIRE_SEED002_QUIET_SECONDS sets the window for either.
QUIET_SECONDS = 5.0
SOAK_QUIET_SECONDS = 30.0
QUIET_ENV = "ONCEWIRE_SEED002_QUIET_SECONDS"


def quiet_seconds(config: pytest.Config) -> float:
    """How long A2 watches the restarted gateway in this run."""
    chosen = os.environ.get(QUIET_ENV)
    if chosen:
        return float(chosen)
    return SOAK_QUIET_SECONDS if soak_requested(config) else QUIET_SECONDS


HEADER = re.compile(r"<<((?:A-|R-)[A-Za-z0-9_.-]+?)>>")
PLANTED = "neg-"  # chats of the checker's negative controls


def whole_run_audit(rig: Seed002) -> list[str]:
    """A1: the problems found across every chat of ``rig`` (empty when there are none)."""
    problems: list[str] = []
    view = rig.view()
    chats = sorted({(m.platform, m.chat) for m in view.visible()})
    chats = [(p, c) for p, c in chats if not c.startswith(PLANTED)]
    turns = rig.model_turns()
    if not turns.turns:
        return ["the module's gateway answered nothing: there is nothing to audit"]
    unmarked: dict[str, int] = {}
    for platform, chat in chats:
        claimed: set[str] = set()
        aids = {m.group(1) for v in view.visible(platform, chat) for m in HEADER.finditer(v.text)}
        for aid in sorted(aids):
            found, _ = view.copies(platform, chat, f"<<{aid}>>", f"<</{aid}>>", PROFILES[platform])
            for copy in found:
                claimed.update(copy.message_ids)
                if not copy.complete:
                    problems.append(f"{platform}:{chat}: a partial copy of {aid} is visible")
                elif not copy.marked:
                    unmarked[aid] = unmarked.get(aid, 0) + 1
            if aid.startswith("R-"):
                problems.append(f"{platform}:{chat}: a resumed answer {aid} is visible")
        for message in view.visible(platform, chat):
            if message.message_id not in claimed:
                problems.append(
                    f"{platform}:{chat}: a message no answer explains: {message.text!r}"
                )
    for aid, count in sorted(unmarked.items()):
        if count > 1:
            problems.append(f"{aid}: {count} unmarked complete replies")
    for token, count in sorted(turns.turns.items()):
        if count != 1:
            problems.append(f"{token}: {count} model turns")
    for token, count in sorted(turns.resumes.items()):
        problems.append(f"{token}: resumed {count}x at the model after it was answered")
    if turns.unattributed:
        problems.append(f"{turns.unattributed} model requests for no message")
    problems.extend(_store_problems(rig))
    return problems


def _store_problems(rig: Seed002) -> list[str]:
    problems = []
    for row in rig.rows("SELECT id, chat, status FROM oncewire_inbound ORDER BY id"):
        if row["status"] not in ("delivered", "superseded") and not str(row["chat"]).startswith(
            PLANTED
        ):
            problems.append(f"inbound {row['id']} is {row['status']}")
    for reply in rig.reply_rows():
        if reply["state"] not in ("delivered", "withdrawn"):
            problems.append(f"reply {reply['id']} is {reply['state']}")
    for run in rig.run_rows():
        if run["status"] in ("running", "interrupting"):
            problems.append(f"{run['run_id']} is still {run['status']}")
    return problems


def unclean_restart_reruns_nothing(
    rig: Seed002,
    *,
    quiet_seconds: float = QUIET_SECONDS,
    during: Callable[[], None] | None = None,
) -> list[str]:
    """A2: SIGKILL ``rig``'s gateway with nothing in flight, start it again and watch it for
    ``quiet_seconds``; what it did that it should not have (empty when nothing). ``during``
    runs once the new gateway is ready (the negative controls plant something there)."""
    before_store = _store_problems(rig)
    if before_store:
        return ["not everything was delivered before the kill: " + "; ".join(before_store)]
    operations = len(rig.view().operations)
    requests = len(rig.model_requests())
    rig.restart()
    if during is not None:
        during()
    deadline = time.monotonic() + quiet_seconds
    problems: list[str] = []
    while time.monotonic() < deadline and not problems:
        assert rig.gateway is not None and rig.gateway.alive, "the restarted gateway died"
        now = rig.view().operations
        if len(now) != operations:
            problems.append(f"the restart touched the chats: {now[-3:]}")
        asked = rig.model_requests()[requests:]
        if asked:
            problems.append(f"the restart asked the model {len(asked)}x: {asked[0]['body']}")
        time.sleep(0.2)
    return problems


def answer_one_more(rig: Seed002, name: str) -> None:
    """Like the seed's A2, a message answered just before the audit: with several test
    processes a process's gateway may have served none of the module's cells, and an audit of
    nothing would prove nothing."""
    for platform in PLATFORMS:
        token = f"{platform}.{name}"
        chat = rig.chat(platform, f"{name}-{platform}")
        rig.script(token, answer(f"A-{token}", "answered long before the crash."))
        rig.inject(platform, chat, f"[in:{token}] hi")
        rig.wait_idle([(platform, chat)], token)
        assert_exactly_once(rig, platform, chat, token, f"A-{token}", "exact")


def test_zz_whole_run_audit(rig: Seed002) -> None:
    """A1 over every chat this module's gateway served."""
    answer_one_more(rig, "audited")
    problems = whole_run_audit(rig)
    assert not problems, "\n".join(problems)


def test_zzz_unclean_restart_reruns_nothing(rig: Seed002, request: pytest.FixtureRequest) -> None:
    """A2: after everything is delivered, an unclean restart re-runs and re-sends nothing."""
    answer_one_more(rig, "quiet-restart")
    problems = unclean_restart_reruns_nothing(rig, quiet_seconds=quiet_seconds(request.config))
    assert not problems, "\n".join(problems)
