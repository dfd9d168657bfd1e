"""What the dashboard's tests share: a store prepared through oncewire's own engines, the
server as a real child process (``oncewire ui``), and a headless Chromium driven by Playwright.

The store is filled the way an application fills it: a real :class:`Dispatcher` runs sinks
that succeed, fail once and then succeed (a redelivery), refuse, or time out on their only
attempt (dead); a real :class:`ReplyEngine` answers chat messages on the fake platforms with
a lost acknowledgement (an ambiguous send, then a marked copy) and a long rate limit (a reply
left undelivered); the run ledger starts runs, takes a checkpoint and forks from it, and
reconciliation closes a run whose lease ran out. What the pages show is then compared with
rows read around oncewire, through the plain drivers (:class:`RunsDatabase`).

Screenshots go to ``$ONCEWIRE_ARTIFACTS/ui`` when that is set, otherwise to the test's
``tmp_path`` (kept by pytest under its basetemp, the newest three runs).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.dispatch.dispatcher import Dispatcher
from oncewire.dispatch.retry import RetryPolicy
from oncewire.effects.outcomes import Done, MaybeSent, Rejected
from oncewire.lab.suites.replies_rig import Rig, reply_text
from oncewire.receipts import Receipts
from oncewire.testing.fake_platform import Fault
from tests.support.runs_db import RunsDatabase

CHROMIUM = "/usr/bin/chromium"
# A server's option for a test that waits for pages to refresh: every 0.2 s, not every two.
FAST = ("--refresh-seconds", "0.2")
BIN = Path(sys.executable).parent
ONCEWIRE = shutil.which("oncewire", path=str(BIN)) or "oncewire"


def artifacts(tmp_path: Path, name: str) -> Path:
    """Where a test keeps its screenshots (see the module docstring)."""
    root = os.environ.get("ONCEWIRE_ARTIFACTS")
    folder = Path(root) / "ui" / name if root else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@dataclass
class Prepared:
    """What the preparation did, as the tests need to find it on the pages."""

    url: str
    acked_chat_inbound: int
    undelivered_inbound: int


def prepare(database: RunsDatabase, folder: Path) -> Prepared:
    """Fill a fresh store with effects, attempts, receipts, chats and runs (see the module)."""
    url = database.url
    calls: dict[str, int] = {}

    def mail(attempt: Any) -> Done:
        return Done({"sent": attempt.key})

    def flaky(attempt: Any) -> Done | MaybeSent:
        calls[attempt.key] = calls.get(attempt.key, 0) + 1
        return MaybeSent("read timed out") if calls[attempt.key] == 1 else Done({"ok": True})

    def refuse(attempt: Any) -> Rejected:
        return Rejected("no such account")

    def doomed(attempt: Any) -> MaybeSent:
        return MaybeSent("gateway timeout")

    with Ledger(url) as ledger:
        for i in range(3):
            ledger.accept(f"mail-{i}", "mail", {"to": f"user{i}@example.com"})
        ledger.accept("flaky-1", "flaky", {"n": 1})
        ledger.accept("refuse-1", "refuse", {"account": "nobody"})
        ledger.accept("doomed-1", "doomed", {"n": 1}, max_attempts=1)
        sinks = {"mail": mail, "flaky": flaky, "refuse": refuse, "doomed": doomed}
        Dispatcher(ledger, sinks, retry=RetryPolicy(base_seconds=0.01, jitter=0.0)).run(
            until_idle=True, handle_signals=False
        )
        # Accepted after the dispatcher stopped: waiting, the oldest first.
        ledger.accept("later-1", "later", {"n": 1})
        ledger.accept("later-2", "later", {"n": 2})

        ledger.runs.start("run-a", key="start", scope="scope-a", owner="w", lease_seconds=0.5)
        ledger.runs.start("run-b", key="start", scope="scope-b", owner="w", lease_seconds=1e6)
        ledger.runs.checkpoint("cp-b1", scope="scope-b", reason="before the edit")
        ledger.runs.fork(scope="scope-b", checkpoint_id="cp-b1", branch="scope-b-try")
        time.sleep(0.6)  # run-a's lease runs out: reconciliation closes it and reports so
        ledger.runs.reconcile(owner="operator")

    with Receipts(url) as receipts:
        receipts.run_once("rcpt-1", {"amount": 5}, lambda tx: {"charged": 5})

    faults = [
        Fault("ack_lost", platform="fk_tg", chat="c-ack", op="send"),
        Fault("rate_limit", platform="fk_tg", chat="c-wait", retry_after=600.0),
    ]
    with Rig(folder / "rig", faults=faults, db=url) as rig:
        acked = rig.admit("fk_tg", "c-ack", "m-1")
        rig.answer(acked.inbound.id, reply_text("A-ack", "a short answer."), "off")
        waiting = rig.admit("fk_tg", "c-wait", "m-2")
        rig.answer(waiting.inbound.id, reply_text("A-wait", "a short answer."), "off")
    return Prepared(url, acked.inbound.id, waiting.inbound.id)


class Server:
    """``oncewire ui`` as a child process, on a free port it reports itself."""

    def __init__(self, db: str, *args: str, env: dict[str, str] | None = None) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
        self.process = subprocess.Popen(
            [ONCEWIRE, "ui", "--db", db, "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**base, **(env or {})},
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=30)
            raise AssertionError(f"oncewire ui did not start: {self.stop()}")
        self.info = json.loads(line)
        self.url = str(self.info["listening"]).rstrip("/")

    def stop(self) -> str:
        """Stop it (SIGINT, as Ctrl-C) and return what it wrote on stderr."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        assert self.process.stderr is not None and self.process.stdout is not None
        with self.process.stdout, self.process.stderr:
            return self.process.stderr.read()


@contextmanager
def server(db: str, *args: str, env: dict[str, str] | None = None) -> Iterator[Server]:
    running = Server(db, *args, env=env)
    try:
        yield running
    finally:
        running.stop()


@dataclass
class Answer:
    """One HTTP response as the server sent it (redirects are not followed)."""

    status: int
    headers: Mapping[str, str]
    text: str


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def fetch(
    url: str,
    *,
    method: str = "GET",
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """``url`` fetched over plain HTTP, whatever its status, without following a redirect."""
    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    try:
        with _OPENER.open(request, timeout=60) as response:
            return Answer(response.status, dict(response.headers), response.read().decode("utf-8"))
    except urllib.error.HTTPError as error:
        with error:
            return Answer(error.code, dict(error.headers), error.read().decode("utf-8"))


@contextmanager
def browser() -> Iterator[Any]:
    """A headless Chromium (the system's, never a downloaded one)."""
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            launched.close()
