"""A real gateway between its two fakes: the harness of the ``gateway`` lab suite and the demo.

:class:`GatewayRig` owns one folder. It starts a platform fake, one of :data:`KINDS`: the fake
Telegram Bot API (``python -m oncewire.testing.telegram_api``, platform ``fk_tg``: editable),
the fake Discord (``python -m oncewire.testing.discord_api``, platform ``fk_dc``: REST and
Gateway, editable, a nonce window) or the fake generic webhook platform
(``python -m oncewire.testing.webhook_platform``, platform ``fk_ne``: not editable, never
streamed), and the fake OpenAI-compatible model server (``python -m oncewire.testing.openai_api``)
as child processes, writes a ``gateway.toml`` that points the platform (Telegram's or Discord's
``api_base``, or the webhook platform's ``send_url``, with the gateway's webhook server as the
fake's delivery address) and ``model.base_url`` at them, and runs ``python -m oncewire gateway
run`` in a process group of its own, so that :meth:`kill9` takes the whole group down with
SIGKILL and nothing else. :meth:`start` again runs a new gateway on the same store and the same
fakes; on Discord it returns once that gateway's own Gateway session is identified, so a
message the user writes next is dispatched to it.

Everything the rig reports is read from outside the gateway: what the user sees from the fake's
chat journal (:class:`~oncewire.testing.ChatView`), what the model was asked from the
fake model's request journal, and the store's rows with the plain driver (read-only on
SQLite), never from the gateway's own output. The gateway's stderr goes to a log file in the
folder, kept as evidence.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oncewire.core import extras
from oncewire.core.errors import MissingExtra
from oncewire.lab.fixtures import dialect_of, rows
from oncewire.lab.framework import ProcessRecord
from oncewire.lab.ports import stable_port
from oncewire.replies import DISCORD_LIKE, NON_EDITABLE, TELEGRAM_LIKE, PlatformProfile
from oncewire.testing.fake_platform import ChatView

__all__ = [
    "BOT_TOKEN",
    "CHAT",
    "DISCORD_CHAT",
    "DISCORD_PLATFORM",
    "HOOK_CHAT",
    "HOOK_PLATFORM",
    "KINDS",
    "PLATFORM",
    "BotMessage",
    "GatewayRig",
    "RigError",
    "missing_gateway_extra",
]

PLATFORM = "fk_tg"  # the gateway's platform name, and the name in the fake's chat journal
BOT_TOKEN = "123456:fake-LAB-token"  # the only token the fake Bot API accepts
CHAT = "4242"  # the user's private chat
HOOK_PLATFORM = "fk_ne"  # the webhook platform's name, in the gateway and in its journal
HOOK_CHAT = "lab-chat"  # the user's chat on the webhook platform
HOOK_SECRET_ENV = "LAB_HOOK_SECRET"  # the variable holding the webhook platform's HMAC secret
HOOK_SECRET = "lab-webhook-secret"
DISCORD_PLATFORM = "fk_dc"  # the fake Discord's name, in the gateway and in its journal
DISCORD_CHAT = "510000000000004242"  # the user's channel (a snowflake)
DISCORD_TOKEN = "fake-LAB-discord.token"  # the only bot token the fake Discord accepts
DISCORD_HEARTBEAT_MS = 5000
KINDS = ("telegram", "webhook", "discord")  # the platform a rig puts in front of the gateway
# Each kind's platform name, the user's chat and the profile the chat is read with.
_PLATFORMS: dict[str, tuple[str, str, PlatformProfile]] = {
    "telegram": (PLATFORM, CHAT, TELEGRAM_LIKE),
    "webhook": (HOOK_PLATFORM, HOOK_CHAT, NON_EDITABLE),
    "discord": (DISCORD_PLATFORM, DISCORD_CHAT, DISCORD_LIKE),
}
START_SECONDS = 30.0  # how long a fake or the gateway may take to say it is ready
GATEWAY_EXTRA = ("httpx2", "starlette", "uvicorn", "websockets")  # oncewire[gateway]


def missing_gateway_extra(feature: str) -> MissingExtra | None:
    """What ``feature`` (a suite, the demo) would raise for the modules of
    ``oncewire[gateway]`` the rig's processes need that are not installed; None when all are."""
    missing = extras.missing("gateway", GATEWAY_EXTRA)
    return MissingExtra(feature, "gateway", missing) if missing else None


class RigError(RuntimeError):
    """A process of the rig did not start, or a wait ran out: the run cannot be judged."""


@dataclass(frozen=True)
class BotMessage:
    """A message the bot shows in the chat now: its text without the duplicate marker, and
    whether it carried the marker (a copy the gateway could not rule out as a second one)."""

    message_id: str
    text: str
    marked: bool
    edits: int


def _child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    # No crash point leaks from the caller into a child unless the rig arms it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _not_ready(what: str, line: str, code: int | None) -> str:
    """Why ``what`` is not ready: it exited first (its stdout ended), or its first line was not
    the ready line."""
    if line == "":
        return f"{what} exited with code {code} before it was ready"
    return f"{what} did not start: its first line was {line.strip()!r}, not the ready line"


def _ready_port(process: subprocess.Popen[str], what: str) -> int:
    line = _read_line(process, what)
    if not line.startswith("ready port="):
        process.kill()
        process.communicate(timeout=10)
        raise RigError(_not_ready(what, line, process.returncode))
    return int(line.strip().split("=", 1)[1])


def _read_line(process: subprocess.Popen[str], what: str) -> str:
    """The next stdout line of ``process``, or a RigError after ``START_SECONDS``."""
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], START_SECONDS)
    if not readable:
        raise RigError(f"{what} printed nothing in {START_SECONDS:.0f}s")
    return process.stdout.readline()


def _stop(process: subprocess.Popen[str] | None) -> None:
    if process is not None and process.poll() is None:
        process.kill()
    if process is not None:
        process.communicate(timeout=10)


class GatewayRig:
    """The fakes, a gateway.toml pointing at them, the store, and the gateway process.

    ``script`` is the fake model's script (see :mod:`oncewire.testing.openai_api`): a list of
    responses consumed in order across every gateway the rig starts. ``streaming`` says whether
    the gateway previews the answer while the model streams it; ``platform`` is one of
    :data:`KINDS` (``webhook`` is never streamed: it cannot edit).
    """

    def __init__(
        self,
        folder: Path,
        db: str,
        script: Any,
        *,
        streaming: bool = True,
        read_timeout_seconds: float = 10.0,
        log: Callable[[str], None] | None = None,
        platform: str = "telegram",
    ) -> None:
        if platform not in KINDS:
            raise ValueError(f"unknown platform {platform!r} (one of {KINDS})")
        # Absolute: the gateway.toml written here resolves a relative path against its own
        # folder, and the processes the rig starts may run elsewhere.
        folder = folder.absolute()
        self.folder = folder
        self.dialect = dialect_of(db)
        self.db = db if self.dialect == "postgresql" else str(Path(db).absolute())
        self.kind = platform
        self.platform, self.chat, self.profile = _PLATFORMS[platform]
        self.streaming = streaming and self.profile.can_edit
        self.read_timeout_seconds = read_timeout_seconds
        self._log = log
        folder.mkdir(parents=True, exist_ok=True)
        self.platform_dir = folder / platform
        self.model_dir = folder / "model"
        self.model_dir.mkdir(exist_ok=True)
        (self.model_dir / "script.json").write_text(json.dumps(script), encoding="utf-8")
        self.config = folder / "gateway.toml"
        self.fake: subprocess.Popen[str] | None = None  # the platform fake
        self.model: subprocess.Popen[str] | None = None
        self.gateway: subprocess.Popen[str] | None = None
        self.platform_base = ""
        self.webhook_port = stable_port() if platform == "webhook" else 0
        self.model_base = ""
        self.starts = 0
        self.injected: list[str] = []  # the platform's ids of the user's messages, in order
        self.processes: list[ProcessRecord] = []  # every gateway that ended, for the evidence
        self._started_at = 0.0
        self._armed: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> GatewayRig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start_fakes(self) -> None:
        """Start both fakes (once) and write the gateway.toml that points at them."""
        if self.fake is not None:
            return
        common = ["--port", "0", "--journal", str(self.platform_dir), "--name", self.platform]
        extra: dict[str, str] = {}
        if self.kind == "telegram":
            module, what = "oncewire.testing.telegram_api", "the fake Bot API"
            args = ["--token", BOT_TOKEN]
        elif self.kind == "discord":
            module, what = "oncewire.testing.discord_api", "the fake Discord"
            args = ["--token", DISCORD_TOKEN, "--heartbeat-ms", str(DISCORD_HEARTBEAT_MS)]
        else:
            module, what = "oncewire.testing.webhook_platform", "the fake webhook platform"
            extra = {HOOK_SECRET_ENV: HOOK_SECRET}
            deliver_to = f"http://127.0.0.1:{self.webhook_port}/webhook/{self.platform}"
            args = ["--secret-env", HOOK_SECRET_ENV, "--deliver-to", deliver_to]
        self.fake = subprocess.Popen(
            [sys.executable, "-m", module, *common, *args],
            env=_child_env(extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.platform_base = f"http://127.0.0.1:{_ready_port(self.fake, what)}"
        self.model = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "oncewire.testing.openai_api",
                "--port",
                "0",
                "--journal",
                str(self.model_dir / "journal"),
                "--script",
                str(self.model_dir / "script.json"),
            ],
            env=_child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        port = _ready_port(self.model, "the fake model server")
        self.model_base = f"http://127.0.0.1:{port}/v1"
        self.config.write_text(self._toml(), encoding="utf-8")

    def _toml(self) -> str:
        return f"""\
[store]
db = {json.dumps(self.db)}

[model]
base_url = {json.dumps(self.model_base)}
api_key_env = ""
model = "fake-model"
connect_timeout = 2
read_timeout = {self.read_timeout_seconds}
max_retries = 1

[turns]
max_concurrent = 2
{self._platform_toml()}"""

    def _platform_toml(self) -> str:
        if self.kind == "webhook":
            return f"""
[[platforms]]
name = "{self.platform}"
kind = "webhook"
send_url = {json.dumps(self.platform_base + "/messages")}
secret_env = "{HOOK_SECRET_ENV}"
streaming = false

[webhooks]
bind = "127.0.0.1:{self.webhook_port}"
"""
        if self.kind == "discord":
            return f"""
[[platforms]]
name = "{self.platform}"
kind = "discord"
token_env = "DISCORD_BOT_TOKEN"
api_base = {json.dumps(self.platform_base + "/api/v10")}
streaming = {json.dumps(self.streaming)}
edit_interval_seconds = 0.05
"""
        return f"""
[[platforms]]
name = "{self.platform}"
kind = "telegram"
token_env = "TELEGRAM_BOT_TOKEN"
api_base = {json.dumps(self.platform_base)}
streaming = {json.dumps(self.streaming)}
edit_interval_seconds = 0.05
# The local rate limiter opened wide, as seed 002 runs it: the fake has no limit of its own,
# and previews refused by the limiter would stop before a scenario's instant is reached.
rate_per_second = 1000
burst = 1000
chat_rate_per_second = 1000
chat_burst = 1000
"""

    def start(self, *, arm: str | None = None, token: Path | None = None) -> int:
        """Start a gateway on the store and wait for its ``ready`` line; its pid.

        ``arm`` arms a crash point (``oncewire.core.crash``) in the gateway process, ``token``
        makes it fire at most once across every process the rig starts with it.
        """
        if self.gateway is not None and self.gateway.poll() is None:
            raise RigError("a gateway is already running")
        self.start_fakes()
        extra = {
            "TELEGRAM_BOT_TOKEN": BOT_TOKEN,
            "DISCORD_BOT_TOKEN": DISCORD_TOKEN,
            HOOK_SECRET_ENV: HOOK_SECRET,
        }
        if arm:
            extra["ONCEWIRE_CRASH"] = arm
            if token is not None:
                extra["ONCEWIRE_CRASH_TOKEN"] = str(token)
        identified = self._identifies()
        self.starts += 1
        self._started_at, self._armed = time.monotonic(), arm
        with open(self.log_path(self.starts), "w", encoding="utf-8") as stderr:
            self.gateway = subprocess.Popen(
                [sys.executable, "-m", "oncewire", "gateway", "run", "--config", str(self.config)],
                env=_child_env(extra),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,  # its own process group: kill9 reaches nothing else
            )
        try:
            line = _read_line(self.gateway, "the gateway")
        except RigError:
            self.kill9()
            raise
        if line.strip() != "ready" and not line.startswith("ready port="):
            code = self.kill9()
            log = self.log_path(self.starts).read_text(encoding="utf-8", errors="replace")
            lines = log.strip().splitlines() or ["(nothing on stderr)"]
            # Its last line says why; a longer log follows for the lines before it.
            more = "\n" + log.strip()[-2000:] if len(lines) > 1 else ""
            raise RigError(f"{_not_ready('the gateway', line, code)}: {lines[-1]}{more}")
        if self.kind == "discord":
            self.wait(
                lambda: self._session_after(identified),
                "the gateway's Discord session (its Identify answered)",
                START_SECONDS,
            )
        self.note(f"gateway started (pid {self.gateway.pid})")
        return self.gateway.pid

    def _identifies(self) -> int:
        """How many times a client identified with the fake Discord so far (0 elsewhere)."""
        return int(self.control("state")["identifies"]) if self.kind == "discord" else 0

    def _session_after(self, identified: int) -> bool:
        """A gateway identified since ``identified`` Identifies were counted, and the newest
        session is connected: a message dispatched now reaches it. A gateway that died before
        is a RigError: nothing would identify any more."""
        if self.gateway is not None and self.gateway.poll() is not None:
            raise RigError(f"the gateway exited with code {self.gateway.poll()} before identifying")
        state = self.control("state")
        sessions = state["sessions"]
        return int(state["identifies"]) > identified and bool(
            sessions and sessions[-1]["connected"]
        )

    def log_path(self, start: int) -> Path:
        return self.folder / f"gateway-{start}.log"

    def kill9(self) -> int:
        """SIGKILL the gateway's whole process group (no drain, no cleanup); its exit code."""
        gateway = self._running()
        if gateway.poll() is None:
            os.killpg(gateway.pid, signal.SIGKILL)
        return self._reap(gateway, 30.0)

    def terminate(self, timeout_seconds: float = 30.0) -> int:
        """SIGTERM the gateway (it drains) and wait for it; its exit code."""
        gateway = self._running()
        if gateway.poll() is None:
            gateway.send_signal(signal.SIGTERM)
        try:
            return self._reap(gateway, timeout_seconds)
        except subprocess.TimeoutExpired:
            return self.kill9()

    def wait_exit(self, timeout_seconds: float) -> int | None:
        """The gateway's exit code once it ends by itself (a crash point), None if it runs on."""
        gateway = self._running()
        try:
            return self._reap(gateway, timeout_seconds)
        except subprocess.TimeoutExpired:
            return None

    def _running(self) -> subprocess.Popen[str]:
        if self.gateway is None:
            raise RigError("no gateway was started")
        return self.gateway

    def _reap(self, gateway: subprocess.Popen[str], timeout_seconds: float) -> int:
        code = gateway.wait(timeout=timeout_seconds)
        if gateway.stdout is not None and not gateway.stdout.closed:
            gateway.stdout.close()
            log = self.log_path(self.starts).read_text(encoding="utf-8", errors="replace")
            self.processes.append(
                ProcessRecord(
                    role="gateway",
                    argv=["-m", "oncewire", "gateway", "run", "--config", str(self.config)],
                    pid=gateway.pid,
                    exit_code=code,
                    response=None,
                    stderr=log[-4000:],
                    duration_seconds=round(time.monotonic() - self._started_at, 4),
                    armed=self._armed,
                )
            )
            self.note(f"gateway ended (exit {code})")
        return code

    def close(self) -> None:
        """Stop whatever still runs: the gateway drained (SIGTERM, then SIGKILL if it hangs),
        then both fakes."""
        if self.gateway is not None:
            self.terminate(timeout_seconds=10.0)
        _stop(self.fake)
        _stop(self.model)

    def note(self, text: str) -> None:
        if self._log is not None:
            self._log(text)

    # -- the platform fake -------------------------------------------------------------------
    def control(self, action: str, **params: Any) -> dict[str, Any]:
        """Call the platform fake's ``/control/ACTION`` route."""
        if not self.platform_base:
            raise RigError("the fakes are not started")
        request = urllib.request.Request(
            f"{self.platform_base}/control/{action}",
            data=json.dumps(params).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            result: dict[str, Any] = json.loads(answer.read())
        return result

    def inject(self, text: str) -> str:
        """The user sends ``text``; the platform's id of the message (kept in :attr:`injected`)."""
        if self.kind == "telegram":
            sent = self.control("inject", chat_id=int(CHAT), text=text)
        elif self.kind == "discord":
            sent = self.control("inject", channel_id=DISCORD_CHAT, text=text)
        else:
            sent = self.control("inject", chat=HOOK_CHAT, text=text)
        self.injected.append(str(sent["message_id"]))
        return self.injected[-1]

    def fault(self, kind: str, **params: Any) -> None:
        """Arm a fault on the platform fake (a :class:`~oncewire.testing.Fault`)."""
        self.control("fault", kind=kind, chat=self.chat, **params)

    def view(self) -> ChatView:
        return ChatView([self.platform_dir / "chat.jsonl"])

    def visible(self) -> list[BotMessage]:
        """The bot's messages in the user's chat, as the user sees them now."""
        out = []
        for message in self.view().visible(self.platform, self.chat):
            text, marked = self.profile.strip_marker(message.text)
            out.append(BotMessage(message.message_id, text, marked, message.edits))
        return out

    def operations(self) -> int:
        """How many operations (sends, edits, deletes) the platform fake has applied."""
        return len(self.view().operations)

    def faults_fired(self) -> list[str]:
        return [str(f.get("fault")) for f in self.view().faults]

    # -- the fake model ----------------------------------------------------------------------
    def model_requests(self) -> list[dict[str, Any]]:
        """Every chat completion request the fake model received (journaled before it answers)."""
        path = self.model_dir / "journal" / "requests.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    # -- the store, read directly ------------------------------------------------------------
    def rows(self, sql: str) -> list[dict[str, Any]]:
        """``sql`` against the store with the plain driver (read-only on SQLite)."""
        if self.dialect == "sqlite" and not Path(self.db).exists():
            return []
        return rows(self.dialect, self.db, sql)

    def inbound(self) -> list[dict[str, Any]]:
        return self.rows(
            "SELECT id, platform, chat, platform_message_id, status, deliveries, attempts "
            "FROM oncewire_inbound ORDER BY id"
        )

    def replies(self) -> list[dict[str, Any]]:
        return self.rows(
            "SELECT id, inbound_id, state, final_text, marked FROM oncewire_replies ORDER BY id"
        )

    def reply_ops(self) -> list[dict[str, Any]]:
        return self.rows(
            "SELECT reply_id, seq, slot, kind, state, marked, message_id FROM oncewire_reply_ops "
            "ORDER BY reply_id, seq"
        )

    def runs(self) -> list[dict[str, Any]]:
        return self.rows(
            "SELECT run_id, status, terminal_reason FROM oncewire_runs ORDER BY run_id"
        )

    def run_events(self, run_id: str) -> list[str]:
        found = self.rows("SELECT run_id, seq, type FROM oncewire_run_events ORDER BY run_id, seq")
        return [str(row["type"]) for row in found if row["run_id"] == run_id]

    def snapshot(self) -> dict[str, Any]:
        """The store's rows, the chat and the model's request count, for the evidence."""
        return {
            "inbound": self.inbound(),
            "replies": self.replies(),
            "reply_ops": self.reply_ops(),
            "runs": self.runs(),
            "visible": [m.__dict__ for m in self.visible()],
            "model_requests": len(self.model_requests()),
        }

    # -- waiting -----------------------------------------------------------------------------
    def wait(self, predicate: Callable[[], bool], what: str, timeout_seconds: float = 20.0) -> None:
        """Poll ``predicate`` until it holds; a RigError naming ``what`` after the timeout."""
        deadline = time.monotonic() + timeout_seconds
        while not predicate():
            if time.monotonic() > deadline:
                raise RigError(f"timed out after {timeout_seconds:.0f}s waiting for {what}")
            time.sleep(0.02)

    def wait_inbound(self, status: str | Sequence[str], count: int = 1, **kw: float) -> None:
        """Wait until ``count`` inbound rows have ``status`` (or one of them)."""
        wanted = (status,) if isinstance(status, str) else tuple(status)

        def reached() -> bool:
            return sum(1 for row in self.inbound() if row["status"] in wanted) >= count

        self.wait(reached, f"{count} inbound message(s) {'/'.join(wanted)}", **kw)
