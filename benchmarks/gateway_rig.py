"""The gateway benchmark's processes: the fakes, a gateway, its config, the store's counts.

Shared by ``gateway_bench.py``'s workloads. Every child process runs the oncewire of
:data:`SOURCE` (this checkout's ``src`` unless ``use_source`` names another tree, so that one
bench can measure another version's code).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

TOKEN = "123456:bench-SECRET-token"
BOT = TOKEN.split(":")[0]
PLATFORM = "fk_tg"
ANSWER = "A short answer from the model."
SOURCE = [Path(__file__).resolve().parent.parent / "src"]  # the oncewire the children run


def use_source(folder: Path) -> None:
    """Run the children on the oncewire in ``folder`` (a ``src`` directory)."""
    if not (folder / "oncewire" / "__init__.py").is_file():
        raise SystemExit(f"gateway bench: {folder} holds no oncewire package")
    SOURCE[0] = folder.resolve()


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
    env["PYTHONUNBUFFERED"] = "1"
    src = str(SOURCE[0])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def wait_for(
    check: Callable[[], bool], what: str, timeout: float = 120.0, every: float = 0.01
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"gateway bench: timed out waiting for {what}")
        time.sleep(every)


def _started(module: str, *args: str, what: str) -> tuple[subprocess.Popen[str], int]:
    """``python -m MODULE --port 0 ARGS`` once it printed ``ready port=N``, and N."""
    process = subprocess.Popen(
        [sys.executable, "-m", module, "--port", "0", *args],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("ready port="):
        process.kill()
        process.wait()
        raise SystemExit(f"gateway bench: {what} did not start: {line!r}")
    return process, int(line.strip().split("=", 1)[1])


class Fakes:
    """The fake Bot API and the fake model server, as processes, for one workload."""

    def __init__(self, folder: Path) -> None:
        self.journal = folder / "telegram"
        script = folder / "script.json"
        script.write_text(json.dumps({"default": {"kind": "text", "text": ANSWER}}))
        self.telegram, port = _started(
            "oncewire.testing.telegram_api",
            *("--journal", str(self.journal), "--token", TOKEN, "--name", PLATFORM),
            what="the fake Bot API",
        )
        self.api_base = f"http://127.0.0.1:{port}"
        self.model, port = _started(
            "oncewire.testing.openai_api",
            *("--journal", str(folder / "openai"), "--script", str(script)),
            what="the fake model server",
        )
        self.model_base = f"http://127.0.0.1:{port}/v1"

    def control(self, action: str, **params: Any) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.api_base}/control/{action}",
            data=json.dumps(params).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            result: dict[str, Any] = json.loads(answer.read())
        return result

    def inject(self, chat: int, text: str) -> None:
        self.control("inject", chat_id=chat, text=text)

    def journal_entries(self) -> list[dict[str, Any]]:
        path = self.journal / "chat.jsonl"
        if not path.exists():
            return []
        entries = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line being written
        return entries

    def stop(self) -> None:
        for process in (self.telegram, self.model):
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=10)


def write_config(folder: Path, fakes: Fakes, max_concurrent: int) -> tuple[Path, str]:
    db = str(folder / "gateway.db")
    config = folder / "gateway.toml"
    config.write_text(
        f"""
[store]
db = {json.dumps(db)}

[model]
base_url = "{fakes.model_base}"
api_key_env = ""
model = "fake-model"
max_retries = 1
read_timeout = 60

[turns]
max_concurrent = {max_concurrent}
busy_mode = "queue"  # every message is answered: a newer one in its chat does not interrupt

[[platforms]]
name = "{PLATFORM}"
kind = "telegram"
token_env = "TELEGRAM_BOT_TOKEN"
api_base = "{fakes.api_base}"
streaming = false
# The fake has no limits: the local rate limiter is opened wide, or with Telegram's defaults
# (one message a second per chat) the turns per second would measure the limiter.
rate_per_second = 10000
burst = 10000
chat_rate_per_second = 10000
chat_burst = 10000
""",
        encoding="utf-8",
    )
    return config, db


class Gateway:
    """A running gateway in a process group of its own; ``started`` and ``ready`` are
    ``time.time()`` just before the spawn and when its ``ready`` line was read."""

    def __init__(self, config: Path, log: Path, command: list[str] | None = None) -> None:
        command = command or [sys.executable, "-m", "oncewire", "gateway", "run"]
        args = ["--config", str(config), "--grace-seconds", "20"]
        with open(log, "a", encoding="utf-8") as stderr:
            self.started = time.time()
            self.process = subprocess.Popen(
                command + args,
                env=child_env(TELEGRAM_BOT_TOKEN=TOKEN),
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        self.ready = time.time()
        if line.strip() != "ready":
            self.kill()
            tail = log.read_text(encoding="utf-8")[-2000:]
            raise SystemExit(f"gateway bench: the gateway did not start: {line!r}\n{tail}")

    def kill(self) -> None:
        """SIGKILL the whole process group: no drain."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        if self.process.stdout is not None:
            self.process.stdout.close()
        if code != 0:
            raise SystemExit(f"gateway bench: the gateway exited {code} on SIGTERM")


def inbound_counts(db: str) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute("SELECT status, count(*) FROM oncewire_inbound GROUP BY status")
        return {status: count for status, count in rows}
    finally:
        conn.close()


def delivered(db: str, count: int) -> Callable[[], bool]:
    """A check: the store shows ``count`` inbound messages delivered (and none given up)."""

    def check() -> bool:
        counts = inbound_counts(db)
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        try:
            dead = conn.execute("SELECT count(*) FROM oncewire_replies WHERE state = 'dead'")
            given_up = int(dead.fetchone()[0])
        finally:
            conn.close()
        if given_up:
            raise SystemExit(
                f"gateway bench: {given_up} replies are dead (the gateway gave up delivering "
                f"them), {counts}; the store and the gateway's log are kept with --dir"
            )
        return counts.get("delivered", 0) == count

    return check


def floor(folder: Path, rows: int) -> float:
    """Raw SQLite commits per second: one INSERT and one COMMIT per row, WAL, synchronous=FULL."""
    path = folder / f"floor-{time.monotonic_ns()}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, text TEXT NOT NULL)")
    started = time.perf_counter()
    for n in range(rows):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (text) VALUES (?)", (f"{ANSWER} {n}",))
        conn.execute("COMMIT")
    seconds = time.perf_counter() - started
    conn.close()
    return rows / seconds


def sends_per_message(fakes: Fakes) -> dict[tuple[str, str], int]:
    """(chat, the user message answered) -> the bot messages sent in answer, from the journal."""
    sends: dict[tuple[str, str], int] = {}
    for entry in fakes.journal_entries():
        if entry.get("event") == "send":
            key = (str(entry["chat"]), str(entry["reply_to"]))
            sends[key] = sends.get(key, 0) + 1
    return sends


def prefill(db: str, rows: int, chats: int = 100) -> None:
    """Create the store (with the code under test) and fill it with ``rows`` handled messages:
    each delivered, with its delivered reply, in ``chats`` chats of their own (not the chats a
    workload then writes in, so that no turn reads them as its history)."""
    done = subprocess.run(
        [sys.executable, "-c", f"from oncewire import Ledger\nLedger({db!r}).close()"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise SystemExit(f"gateway bench: could not create the store: {done.stderr[-2000:]}")
    conn = sqlite3.connect(db, isolation_level=None, timeout=30)
    try:
        now = time.time() - 86_400.0
        conn.execute("BEGIN IMMEDIATE")
        for n in range(rows):
            chat = str(900_000 + n % chats)
            inbound_id = conn.execute(
                "INSERT INTO oncewire_inbound (platform, bot, chat, thread, platform_message_id, "
                "payload, digest, status, attempts, created_at, updated_at) "
                "VALUES (?, ?, ?, '', ?, '{\"text\":\"old\"}', 'd', 'delivered', 1, ?, ?)",
                (PLATFORM, BOT, chat, str(n + 1), now, now),
            ).lastrowid
            conn.execute(
                "INSERT INTO oncewire_replies (inbound_id, platform, bot, chat, thread, reply_to, "
                "format, cap, unit, state, final_text, plan, max_attempts, not_before, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, '', ?, 'plain', 4096, 'utf16', "
                "'delivered', ?, '[]', 5, ?, ?, ?)",
                (inbound_id, PLATFORM, BOT, chat, str(n + 1), ANSWER, now, now, now),
            )
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()


def admitted_and_first_sent(db: str, fakes: Fakes) -> list[tuple[float, float]]:
    """(admission time, first send time) of every answered message, by chat (one per chat):
    the store's created_at (the gateway's clock at T1) and the fake's stamp on the send."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        admitted = {
            str(chat): float(at)
            for chat, at in conn.execute("SELECT chat, created_at FROM oncewire_inbound")
        }
    finally:
        conn.close()
    sent: dict[str, float] = {}
    for entry in fakes.journal_entries():
        if entry.get("event") == "send":
            sent.setdefault(str(entry["chat"]), float(entry["ts"]))
    return [(admitted[chat], at) for chat, at in sent.items() if chat in admitted]
