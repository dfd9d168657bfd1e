"""Seed 002's rig: one real ``oncewire gateway run`` between four fakes, each its own process.

:class:`Seed002` owns one folder. It starts the fake Telegram Bot API (platform ``fk_tg``,
editable, streaming on), the fake Discord (``fk_dc``: REST and Gateway, editable, cap 2000,
threads, streaming on), the fake generic webhook platform (``fk_ne``, not editable, streaming
off) and the fake OpenAI-compatible model, writes one ``gateway.toml`` serving the three
platforms on one store, and starts, SIGKILLs (:meth:`Seed002.kill9`: the whole process group)
and restarts the gateway on that store; a start waits for ``ready`` and for the gateway's fresh
Discord session (Identify answered), so a message injected next is dispatched to it. Its API,
for the cells:

* :meth:`~Seed002.chat` a chat id for a cell's name (each cell its own chat);
* :meth:`~Seed002.script` what the model answers to a token (``[in:TOKEN]`` in the user's
  message), and to that token's resumed turn; :func:`answer` builds the seed's
  ``<<AID>> body <</AID>>`` answer;
* :meth:`~Seed002.inject` a user message (optional message id; on ``fk_dc`` optional thread) on
  any platform: over the fake Discord's Gateway as a ``MESSAGE_CREATE`` dispatch;
* :meth:`~Seed002.fault` arms a fault on a platform fake (the vocabulary of
  :class:`~oncewire.testing.Fault`), :meth:`~Seed002.faults_fired` reads its journal
  (H11);
* :meth:`~Seed002.wait_idle` (H4), read from the store;
* :meth:`~Seed002.view` the chats as users see them (:class:`~oncewire.testing.ChatView`
  over the three journals; a Discord thread's messages are in its parent channel's chat, their
  ``thread`` naming the thread), :meth:`~Seed002.model_turns` the model's requests per token
  (read at the fake model), :meth:`~Seed002.rows` the store read directly with the plain
  driver.

Nothing here reads the gateway's own report: the journals, the model's request log and the
store are the evidence. The invariants are :mod:`tests.gateway.seed002.checks`.

H3 timings, as the seed sets them: previews every 0.05 s (``edit_interval_seconds``); the
local Telegram rate limiter opened wide (the seed's fakes have no limiter, so the cadence is the
gateway's own); the model's retries capped at 1 (H2). The platforms' ``read_timeout_seconds``
is the rig's ``read_timeout_seconds``: the gateway's default 10 s unless the rig is made with
less. A ``timeout`` or ``ack_lost`` fault is a silence the gateway waits out, so each such cell
costs one read timeout; the module-wide rig uses :data:`SHARED_READ_TIMEOUT_SECONDS`, while a
test's own rig (``fresh_rig``) keeps the 10 s. The fake
Discord's route buckets are its default 50 calls a second per channel: a preview every 0.05 s
stays under it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2

from oncewire.gateway.platforms.discord import DISCORD
from oncewire.lab.fixtures import dialect_of, rows
from oncewire.lab.ports import stable_port
from oncewire.replies.wire import NON_EDITABLE, TELEGRAM_LIKE, PlatformProfile
from oncewire.testing.fake_platform import ChatView
from tests.conftest import _child_env, wait_for
from tests.gateway.conftest import spawn_fake, stop_process

__all__ = [
    "DC",
    "NE",
    "PLATFORMS",
    "RESUME_PHRASE",
    "STREAMING",
    "TG",
    "GatewayProcess",
    "ModelTurns",
    "Seed002",
    "answer",
    "footer",
    "header",
    "norm",
]

TG = "fk_tg"  # the fake Telegram Bot API: editable, streaming on
NE = "fk_ne"  # the fake generic webhook platform: not editable, streaming off
DC = "fk_dc"  # the fake Discord (REST + Gateway): editable, cap 2000, threads, streaming on
PLATFORMS = (TG, NE, DC)
STREAMING = {TG: True, NE: False, DC: True}
PROFILES: dict[str, PlatformProfile] = {TG: TELEGRAM_LIKE, NE: NON_EDITABLE, DC: DISCORD}
BOT_TOKEN = "123456:fake-SEED002-token"
DISCORD_TOKEN = "fake-SEED002-discord.token"
DISCORD_HEARTBEAT_MS = 5000
HOOK_SECRET_ENV = "FK_NE_SECRET"
HOOK_SECRET = "seed002-webhook-secret"
RESUME_PHRASE = "previous turn was interrupted"  # H8: what marks a resumed request
START_SECONDS = 60.0  # a busy 2-core host may take a while to start a process
DEFAULT_READ_TIMEOUT_SECONDS = 10.0  # the gateway's own default for every platform
# The shared rig's platform read timeout: each timeout and ack_lost cell waits it out once. A
# fake answers in milliseconds, so 3 s is still far above any real answer on a busy host.
SHARED_READ_TIMEOUT_SECONDS = 3.0
TOKEN_RE = re.compile(r"\[in:([A-Za-z0-9_.-]+)\]")
ACTIVE_RUN = ("running", "interrupting")
REPO_ROOT = Path(__file__).resolve().parents[3]


def header(aid: str) -> str:
    return f"<<{aid}>>"


def footer(aid: str) -> str:
    return f"<</{aid}>>"


def answer(aid: str, body: str, **kw: Any) -> dict[str, Any]:
    """The model's answer ``<<AID>> body <</AID>>`` (a fake-model ``text`` response; ``kw`` are
    its streaming options: ``chunk_chars``, ``delay_per_chunk``...)."""
    return {"kind": "text", "text": f"{header(aid)} {body} {footer(aid)}", **kw}


def norm(text: str) -> str:
    """Whitespace-normalised, as the seed compares visible and persisted text."""
    return " ".join(text.split())


class GatewayProcess:
    """A running ``python -m oncewire gateway run`` in a process group of its own."""

    def __init__(self, config: Path, log: Path, env: dict[str, str]) -> None:
        self.log = log
        with open(log, "a", encoding="utf-8") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "oncewire", "gateway", "run", "--config", str(config)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,  # kill9 takes the group, nothing else
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("ready"):
            self.kill9()
            raise AssertionError(f"the gateway did not start: {line!r}\n{self.log_text()[-3000:]}")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def kill9(self) -> None:
        """SIGKILL the whole process group: no drain, no cleanup."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def terminate(self, timeout: float = 60.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            return -9
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code


class ModelTurns:
    """The model's requests sorted the seed's way (its ``Director``), per token ``[in:TOKEN]``:
    a request whose newest user message names a token is a turn of that token, unless it
    continues one (its last message is a ``tool`` result, H7); a request whose newest user
    message names none but carries the resume phrase (H8) resumes the newest token before it;
    any other request without a token is counted as ``unattributed``."""

    def __init__(self, requests: Iterable[dict[str, Any]]) -> None:
        self.turns: dict[str, int] = {}
        self.continuations: dict[str, int] = {}
        self.resumes: dict[str, int] = {}
        self.without_tools = 0  # H6: every main request carries tools
        self.unattributed = 0
        for request in requests:
            body = request.get("body")
            if not isinstance(body, dict) or request.get("path", "").rstrip("/").endswith("models"):
                continue
            messages = body.get("messages") or []
            users = [_text(m) for m in messages if m.get("role") == "user"]
            last = users[-1] if users else ""
            if not body.get("tools"):
                self.without_tools += 1
            tokens = TOKEN_RE.findall(last)
            if tokens and RESUME_PHRASE not in last.lower():
                token = tokens[-1]
                into = self.continuations if messages[-1].get("role") == "tool" else self.turns
                into[token] = into.get(token, 0) + 1
                continue
            earlier = [t for text in users for t in TOKEN_RE.findall(text)]
            if earlier and RESUME_PHRASE in last.lower():
                self.resumes[earlier[-1]] = self.resumes.get(earlier[-1], 0) + 1
            else:
                self.unattributed += 1


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


class Seed002:
    """The three fakes, the gateway.toml, the store and the gateway process, in ``folder``.

    ``db`` is a SQLite file path or a PostgreSQL URL; ``busy_mode`` is ``[turns] busy_mode``;
    ``read_timeout_seconds`` is every platform's ``read_timeout_seconds``. The config offers the
    tool ``terminal`` (H6, :mod:`tests.gateway.seed002.terminal_tool`).
    """

    def __init__(
        self,
        folder: Path,
        db: str,
        *,
        busy_mode: str = "interrupt",
        read_timeout_seconds: float = DEFAULT_READ_TIMEOUT_SECONDS,
    ) -> None:
        self.folder = folder
        self.db = db
        self.read_timeout_seconds = read_timeout_seconds
        self.dialect = dialect_of(db)
        folder.mkdir(parents=True, exist_ok=True)
        self.gateway: GatewayProcess | None = None
        self.starts = 0
        self._injected: dict[tuple[str, str], list[str]] = {}  # (platform, chat) -> message ids
        self._next_message_id = 1
        env = _child_env(**{HOOK_SECRET_ENV: HOOK_SECRET})
        self.webhook_port = stable_port()
        self.tg_dir, self.ne_dir, self.dc_dir, self.model_dir = (
            folder / n for n in ("tg", "ne", "dc", "model")
        )
        self.model_dir.mkdir(exist_ok=True)
        (self.model_dir / "script.json").write_text("{}", encoding="utf-8")
        self._processes: list[subprocess.Popen[str]] = []
        # The four fakes start side by side (each is a Python process importing oncewire): a
        # rig is made once per module and backend, and once per test of its own.
        fakes: list[tuple[str, list[str], dict[str, str] | None]] = [
            (
                "oncewire.testing.telegram_api",
                ["--journal", str(self.tg_dir), "--token", BOT_TOKEN, "--name", TG],
                None,
            ),
            (
                "oncewire.testing.webhook_platform",
                [
                    "--journal",
                    str(self.ne_dir),
                    "--name",
                    NE,
                    "--secret-env",
                    HOOK_SECRET_ENV,
                    "--deliver-to",
                    f"http://127.0.0.1:{self.webhook_port}/webhook/{NE}",
                ],
                env,
            ),
            (
                "oncewire.testing.discord_api",
                [
                    "--port",
                    "0",
                    "--journal",
                    str(self.dc_dir),
                    "--token",
                    DISCORD_TOKEN,
                    "--name",
                    DC,
                    "--heartbeat-ms",
                    str(DISCORD_HEARTBEAT_MS),
                ],
                None,
            ),
            (
                "oncewire.testing.openai_api",
                [
                    "--journal",
                    str(self.model_dir / "journal"),
                    "--script",
                    str(self.model_dir / "script.json"),
                ],
                None,
            ),
        ]
        ports: list[int] = []
        failed: BaseException | None = None
        with ThreadPoolExecutor(max_workers=len(fakes)) as pool:
            starting = [pool.submit(spawn_fake, m, a, env=e) for m, a, e in fakes]
            for future in starting:
                try:
                    process, port = future.result()
                except BaseException as error:
                    failed = failed or error
                    continue
                self._processes.append(process)
                ports.append(port)
        if failed is not None:
            self.close()
            raise failed
        tg_port, ne_port, dc_port, model_port = ports
        self.bases = {
            TG: f"http://127.0.0.1:{tg_port}",
            NE: f"http://127.0.0.1:{ne_port}",
            DC: f"http://127.0.0.1:{dc_port}",
        }
        self.model_base = f"http://127.0.0.1:{model_port}"
        self._client = httpx2.Client(timeout=30.0)
        self.config = folder / "gateway.toml"
        self.config.write_text(self._toml(busy_mode), encoding="utf-8")
        self._env = _child_env(
            TELEGRAM_BOT_TOKEN=BOT_TOKEN,
            DISCORD_BOT_TOKEN=DISCORD_TOKEN,
            # The tool's sink is imported from the tests.
            PYTHONPATH=os.pathsep.join(
                p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
            **{HOOK_SECRET_ENV: HOOK_SECRET},
        )

    def _toml(self, busy_mode: str) -> str:
        schema = self.folder / "terminal.json"
        schema.write_text(
            json.dumps(
                {
                    "type": "object",
                    "description": "run a shell command and read what it printed",
                    "properties": {"command": {"type": "string"}},
                    "required": ["command"],
                }
            ),
            encoding="utf-8",
        )
        return f"""\
[store]
db = {json.dumps(self.db)}

[model]
base_url = {json.dumps(self.model_base + "/v1")}
api_key_env = ""
model = "fake-model"
connect_timeout = 5
read_timeout = 30
max_retries = 1

[turns]
busy_mode = {json.dumps(busy_mode)}
max_concurrent = 8

[[platforms]]
name = "{TG}"
kind = "telegram"
token_env = "TELEGRAM_BOT_TOKEN"
api_base = {json.dumps(self.bases[TG])}
streaming = true
edit_interval_seconds = 0.05
read_timeout_seconds = {self.read_timeout_seconds}
rate_per_second = 1000
burst = 1000
chat_rate_per_second = 1000
chat_burst = 1000

[[platforms]]
name = "{DC}"
kind = "discord"
token_env = "DISCORD_BOT_TOKEN"
api_base = {json.dumps(self.bases[DC] + "/api/v10")}
streaming = true
edit_interval_seconds = 0.05
read_timeout_seconds = {self.read_timeout_seconds}

[[platforms]]
name = "{NE}"
kind = "webhook"
send_url = {json.dumps(self.bases[NE] + "/messages")}
secret_env = "{HOOK_SECRET_ENV}"
streaming = false
read_timeout_seconds = {self.read_timeout_seconds}

[[tools]]
name = "terminal"
sink = "tests.gateway.seed002.terminal_tool:terminal"
schema_file = {json.dumps(str(schema))}
side_effect = "workspace_write"
timeout_seconds = 20

[webhooks]
bind = "127.0.0.1:{self.webhook_port}"
"""

    # -- the gateway -------------------------------------------------------------------------
    def start(self) -> GatewayProcess:
        """Start a gateway on the store (the previous one must be gone) and wait for ``ready``
        and its Discord session."""
        if self.gateway is not None and self.gateway.alive:
            raise AssertionError("a gateway is already running")
        self.starts += 1
        identifies = int(self.control(DC, "state")["identifies"])
        log = self.folder / f"gateway-{self.starts}.log"
        self.gateway = GatewayProcess(self.config, log, self._env)
        self.wait_until(
            lambda: self._discord_session_after(identifies),
            "the gateway's Discord session (Identify answered)",
            timeout=START_SECONDS,
        )
        return self.gateway

    def _discord_session_after(self, identifies: int) -> bool:
        """The gateway identified afresh (more than ``identifies`` so far) and its session, the
        newest, is connected: a dispatch from now on reaches it."""
        state = self.control(DC, "state")
        sessions = state["sessions"]
        return int(state["identifies"]) > identifies and bool(
            sessions and sessions[-1]["connected"]
        )

    def kill9(self) -> None:
        """SIGKILL the running gateway's process group."""
        assert self.gateway is not None, "no gateway was started"
        self.gateway.kill9()

    def restart(self) -> GatewayProcess:
        """SIGKILL, then a new gateway on the same store and fakes."""
        self.kill9()
        return self.start()

    def close(self) -> None:
        if self.gateway is not None and self.gateway.alive:
            self.gateway.kill9()
        for process in self._processes:
            stop_process(process)
        if hasattr(self, "_client"):
            self._client.close()

    def log_text(self) -> str:
        return "".join(
            (self.folder / f"gateway-{n}.log").read_text(encoding="utf-8", errors="replace")
            for n in range(1, self.starts + 1)
        )

    # -- chats and messages ------------------------------------------------------------------
    def chat(self, platform: str, name: str) -> str:
        """The chat id a cell named ``name`` uses on ``platform``: Telegram's are integers,
        Discord's channel ids snowflakes (digits)."""
        if platform == TG:
            return str(100_000 + zlib.crc32(name.encode()) % 900_000_000)
        if platform == DC:
            return str(510_000_000_000_000_000 + zlib.crc32(name.encode()))
        return name

    def thread(self, chat: str, name: str) -> str:
        """A Discord thread id of ``chat`` for ``name`` (a channel of its own, made on first
        use by the fake)."""
        return str(int(chat) + 1_000_000_000_000 + zlib.crc32(name.encode()))

    def control(self, platform: str, action: str, **params: Any) -> dict[str, Any]:
        """``POST /control/<action>`` on a platform fake; the answer must be a 200. A refused
        connection (the fake's listener blacked out by a ``conn_error``) is tried again: it
        never reached the fake."""
        deadline = time.monotonic() + 30.0
        while True:
            try:
                answer_ = self._client.post(f"{self.bases[platform]}/control/{action}", json=params)
                break
            except httpx2.ConnectError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert answer_.status_code == 200, answer_.text
        result: dict[str, Any] = answer_.json()
        return result

    def inject(
        self,
        platform: str,
        chat: str,
        text: str,
        *,
        message_id: str | int | None = None,
        thread: str | None = None,
    ) -> str:
        """A user's message (``message_id``: the platform's id, new unless given: the same id
        again is a re-delivery; ``thread``: a Discord thread of ``chat``); the platform message
        id, as the store's inbound row keeps it."""
        if platform == DC:
            assert message_id is None, "a Discord message is re-delivered with redeliver()"
            where = (
                {"channel_id": chat}
                if thread is None
                else {"channel_id": chat, "thread_id": thread}
            )
            found = str(self.control(DC, "inject", text=text, **where)["message_id"])
        elif platform == TG:
            params: dict[str, Any] = {"chat_id": int(chat), "text": text}
            if message_id is not None:
                params["message_id"] = int(message_id)
            found = str(self.control(TG, "inject", **params)["message_id"])
        else:
            if message_id is None:
                message_id = f"m{self._next_message_id}"
                self._next_message_id += 1
            found = str(
                self.control(NE, "inject", chat=chat, text=text, message_id=str(message_id))[
                    "message_id"
                ]
            )
        self._injected.setdefault((platform, chat), []).append(found)
        return found

    def redeliver(self, platform: str, chat: str, message_id: str, *, how: str = "replay") -> None:
        """The platform delivers a message again (fk_ne: its webhook retry; fk_tg: the same
        message id injected again as a new update; fk_dc, ``how="replay"``: Reconnect (op 7),
        and the Resume replays the session's dispatches from that message's on, as Discord
        replays what a session missed; ``how="dispatch"``: the message dispatched again to
        whichever session is live, a fresh process's included)."""
        if platform == DC:
            if how == "replay":
                reached = self.control(DC, "reconnect", how="op7", rewind_to=message_id)
                assert reached["connections"] == 1, reached
            else:
                self.control(DC, "redeliver", message_id=message_id)
        elif platform == NE:
            self.control(NE, "redeliver", message_id=message_id)
        else:
            self.control(TG, "inject", chat_id=int(chat), text="", message_id=int(message_id))

    # -- the model ---------------------------------------------------------------------------
    def script(
        self,
        token: str,
        *responses: dict[str, Any],
        resume: Sequence[dict[str, Any]] = (),
    ) -> None:
        """The model answers a turn of ``[in:TOKEN]`` with ``responses`` (in order: a tool call,
        then the answer...), and a resumed turn of it with ``resume``."""
        key = f"[in:{token}]"
        body: dict[str, Any] = {"by_token": {key: list(responses)}}
        if resume:
            body["resume"] = {key: list(resume)}
        done = self._client.post(f"{self.model_base}/control/script", json=body)
        assert done.status_code == 200, done.text

    def model_requests(self) -> list[dict[str, Any]]:
        path = self.model_dir / "journal" / "requests.jsonl"
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def discord_calls(self) -> list[dict[str, Any]]:
        """Every REST call the fake Discord answered (or stayed silent to), in order."""
        path = self.dc_dir / "calls.jsonl"
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def model_turns(self) -> ModelTurns:
        return ModelTurns(self.model_requests())

    # -- faults ------------------------------------------------------------------------------
    def fault(self, platform: str, kind: str, *, chat: str, **params: Any) -> str:
        """Arm a fault on a platform fake, confined to ``chat`` (``op``, ``contains``,
        ``times``, ``retry_after``, ``hold_seconds``, ``blackout_seconds``); its name. A
        ``conn_error`` blacks the fake's listener out at once, for every chat: ``chat`` only
        names where its journal entry goes."""
        params = {k: v for k, v in params.items() if v is not None}
        params["chat"] = chat
        return str(self.control(platform, "fault", kind=kind, **params)["name"])

    def faults_fired(self, platform: str, chat: str) -> list[dict[str, Any]]:
        """H11: the faults the platform's journal records as fired in ``chat``."""
        return [f for f in self.view().faults if f["platform"] == platform and f["chat"] == chat]

    # -- what users see ----------------------------------------------------------------------
    def journals(self) -> list[Path]:
        return [self.tg_dir / "chat.jsonl", self.ne_dir / "chat.jsonl", self.dc_dir / "chat.jsonl"]

    def view(self) -> ChatView:
        return ChatView(self.journals())

    # -- the store, read directly ------------------------------------------------------------
    def rows(self, sql: str) -> list[dict[str, Any]]:
        """``sql`` against the store with the plain driver (read-only on SQLite)."""
        if self.dialect == "sqlite" and not Path(self.db).exists():
            return []
        return rows(self.dialect, self.db, sql)

    def inbound_rows(self, platform: str, chat: str) -> list[dict[str, Any]]:
        found = self.rows(
            "SELECT id, platform, chat, platform_message_id, payload, status, deliveries, "
            "attempts, answered_by FROM oncewire_inbound ORDER BY id"
        )
        return [r for r in found if r["platform"] == platform and r["chat"] == chat]

    def reply_rows(self, platform: str | None = None, chat: str | None = None) -> list[Any]:
        found = self.rows(
            "SELECT id, inbound_id, platform, chat, state, final_text, marked "
            "FROM oncewire_replies ORDER BY id"
        )
        return [
            r
            for r in found
            if (platform is None or r["platform"] == platform)
            and (chat is None or r["chat"] == chat)
        ]

    def reply_ops(self, platform: str, chat: str) -> list[dict[str, Any]]:
        """The wire operations the store records for the chat's replies, in order."""
        replies = {r["id"] for r in self.reply_rows(platform, chat)}
        found = self.rows(
            "SELECT reply_id, seq, slot, kind, state, marked, error FROM oncewire_reply_ops "
            "ORDER BY reply_id, seq"
        )
        return [r for r in found if r["reply_id"] in replies]

    def run_rows(self) -> list[dict[str, Any]]:
        return self.rows(
            "SELECT run_id, status, terminal_reason FROM oncewire_runs ORDER BY run_id"
        )

    # -- waiting -----------------------------------------------------------------------------
    def idle(self, platform: str, chat: str) -> bool:
        """H4, from the store: every message injected into the chat is admitted; none is
        ``received`` or ``answering``; no turn of the chat is active; no reply of the chat is
        ``open`` or ``committed``."""
        inbound = self.inbound_rows(platform, chat)
        admitted = {str(r["platform_message_id"]) for r in inbound}
        if not set(self._injected.get((platform, chat), [])) <= admitted:
            return False
        if any(r["status"] in ("received", "answering") for r in inbound):
            return False
        ids = {f"turn:{r['id']}" for r in inbound}
        if any(r["run_id"] in ids and r["status"] in ACTIVE_RUN for r in self.run_rows()):
            return False
        return not any(r["state"] in ("open", "committed") for r in self.reply_rows(platform, chat))

    def wait_idle(
        self, chats: Sequence[tuple[str, str]], what: str = "", timeout: float = 120.0
    ) -> None:
        """Wait until every ``(platform, chat)`` is idle (H4); fail saying what was pending."""

        def all_idle() -> bool:
            self._assert_alive()
            return all(self.idle(platform, chat) for platform, chat in chats)

        wait_for(all_idle, timeout=timeout, what=f"{what or chats} to be idle\n{self.dump(chats)}")

    def wait_until(self, predicate: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
        def check() -> bool:
            self._assert_alive()
            return predicate()

        wait_for(check, timeout=timeout, what=what)

    def _assert_alive(self) -> None:
        if self.gateway is not None and not self.gateway.alive:
            raise AssertionError(f"the gateway died\n{self.gateway.log_text()[-3000:]}")

    def dump(self, chats: Sequence[tuple[str, str]]) -> str:
        """What each chat shows, the store's rows for it and the faults fired (for messages)."""
        view = self.view()
        lines = []
        for platform, chat in chats:
            lines.append(f"--- visible in {platform}:{chat}")
            for m in view.visible(platform, chat):
                where = f" thread={m.thread}" if m.thread else ""
                lines.append(f"  [{m.message_id}{where} edits={m.edits}] {m.text[:160]!r}")
            for r in self.inbound_rows(platform, chat):
                lines.append(f"  inbound {r['id']} {r['status']} attempts={r['attempts']}")
            for r in self.reply_rows(platform, chat):
                lines.append(f"  reply {r['id']} {r['state']} {str(r['final_text'])[:80]!r}")
            fired = [(f["op"], f["kind"]) for f in view.faults if f["chat"] == chat]
            lines.append(f"  faults fired {fired}")
        return "\n".join(lines)
