#!/usr/bin/env python3
"""The gateway end to end, as real processes, every figure against a baseline of the same run.

    .venv/bin/python benchmarks/gateway_bench.py [--quick] [--rounds N] [--json FILE] [--dir DIR]

``oncewire gateway run`` runs as its own process against the fake Telegram Bot API and the fake
OpenAI-compatible server (``python -m oncewire.fakes.telegram_api`` and ``...openai_api``, each a
process too), on a SQLite file in WAL mode with ``synchronous=FULL``. The model answers at once
with a short text; the platform does not stream (one send per reply). Three measurements:

* ``commits_per_reply`` and ``fsyncs_per_reply``: messages sent one after the other, each waited
  for until the store says it was delivered. Counted, not estimated: the gateway runs with
  SQLite's statement trace on every connection it opens (this script wraps ``sqlite3.connect``
  in the gateway's process before the command line starts, and logs every ``COMMIT`` with the
  tables its transaction wrote), and under ``strace -f -y -e trace=fsync,fdatasync``, which
  names the file of every flush. Compared with the design's five commits (T1 admission, T2 the
  turn's start, T5 the answer, and two for the send: in flight, then acknowledged).
* ``turns_per_second``: N messages across M chats, injected before the gateway starts, from its
  ``ready`` line until the store says every one was delivered; against the raw SQLite floor (one
  ``INSERT`` and ``COMMIT`` per row, same pragmas, same directory) measured just before and just
  after, and their mean. The bound is 1 / the design's five commits.
* ``recovery_first`` and ``recovery_last``: K messages in K chats whose sends the fake parks; once
  all K are parked (their answers committed, their sends in flight) the gateway is SIGKILLed,
  the fake lets the parked calls go (nothing was applied), and a new gateway is started. From
  just before it is spawned until the first and the last of the K answers is in the fake's
  journal (the time the fake stamped on it). The baseline, ``cold_start``, is a start on the
  same store with nothing left to do, to its ``ready`` line.

Progress goes to stderr, the table to stdout. Timings on shared machines are noisy: read the
ratios, and compare rows of one run rather than runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
TOKEN = "123456:bench-SECRET-token"
PLATFORM = "fk_tg"
ANSWER = "A short answer from the model."
DESIGN_COMMITS = 5  # T1, T2, T5 and the send's two operation commits
TRACED = "_traced_gateway"  # argv[1] of this script when it runs a traced gateway


# -- the traced gateway (a child process) ------------------------------------------------------
def traced_gateway(trace_path: str, argv: list[str]) -> int:
    """Run ``oncewire gateway run ARGV`` with every ``COMMIT`` of every SQLite connection logged
    to ``trace_path`` (one line: the thread, then the tables the transaction wrote)."""
    fd = os.open(trace_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    original = sqlite3.connect
    writes = re.compile(r"(?:INSERT(?:\s+OR\s+\w+)?\s+INTO|UPDATE|DELETE\s+FROM)\s+\"?(\w+)")

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = original(*args, **kwargs)
        written: set[str] = set()
        changes_at_begin = [0]

        def trace(sql: str) -> None:
            statement = sql.lstrip().upper()
            if statement.startswith("BEGIN"):
                written.clear()
                changes_at_begin[0] = conn.total_changes
            elif statement.startswith("COMMIT"):
                name = threading.current_thread().name
                tables = ",".join(sorted(t.removeprefix("oncewire_") for t in written))
                rows = conn.total_changes - changes_at_begin[0]
                # No fsync: the log must not add flushes to the ones being counted.
                os.write(fd, f"{name}\t{tables}\t{rows}\n".encode())
                written.clear()
            else:
                found = writes.match(statement)
                if found:
                    written.add(found.group(1).lower())

        conn.set_trace_callback(trace)
        return conn

    sqlite3.connect = connect  # type: ignore[assignment]
    from oncewire.cli import main

    return main(["gateway", "run", *argv])


# -- processes -----------------------------------------------------------------------------------
def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
    env["PYTHONUNBUFFERED"] = "1"
    src = str(HERE.parent.parent / "src")
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
            "oncewire.fakes.telegram_api",
            *("--journal", str(self.journal), "--token", TOKEN, "--name", PLATFORM),
            what="the fake Bot API",
        )
        self.api_base = f"http://127.0.0.1:{port}"
        self.model, port = _started(
            "oncewire.fakes.openai_api",
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


# -- 1: commits and fsyncs per reply ---------------------------------------------------------------
def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _fsyncs(path: Path) -> list[str]:
    return [line for line in _lines(path) if re.search(r"\b(fsync|fdatasync)\(", line)]


def _fsync_file(line: str) -> str:
    found = re.search(r"\(\d+<([^>]*)>", line)
    name = found.group(1) if found else "?"
    if name.endswith("-wal"):
        return "wal"
    if name.endswith(".db"):
        return "db"
    return "other"


def _settled(count: Callable[[], int], quiet_seconds: float = 0.3) -> int:
    """``count()`` once it has not changed for ``quiet_seconds``: the trace lines of the last
    commit and flush reach their files after the store shows the message delivered."""
    last, since = count(), time.monotonic()
    while time.monotonic() - since < quiet_seconds:
        time.sleep(0.02)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
    return last


def usable_strace() -> str | None:
    """strace, when it is installed and may trace here (a container can forbid ptrace)."""
    strace = shutil.which("strace")
    if strace is None:
        return None
    probe = [strace, "-f", "-qq", "-e", "trace=fsync", "-o", os.devnull, sys.executable, "-c", ""]
    done = subprocess.run(probe, capture_output=True, timeout=60, check=False)
    return strace if done.returncode == 0 else None


def per_reply(folder: Path, messages: int) -> dict[str, Any]:
    strace = usable_strace()
    fakes = Fakes(folder)
    try:
        config, db = write_config(folder, fakes, max_concurrent=1)
        commits_log, fsyncs_log = folder / "commits.log", folder / "fsyncs.log"
        prefix = [sys.executable, str(HERE), TRACED, str(commits_log)]
        if strace is not None:
            prefix = [strace, "-f", "-qq", "-y", "-e", "trace=fsync,fdatasync"]
            prefix += ["-e", "signal=none", "-o", str(fsyncs_log)]
            prefix += [sys.executable, str(HERE), TRACED, str(commits_log)]
        gateway = Gateway(config, folder / "gateway.log", prefix)
        try:
            replies: list[dict[str, Any]] = []
            for n in range(messages):
                commits_before = _settled(lambda: len(_lines(commits_log)))
                fsyncs_before = _settled(lambda: len(_fsyncs(fsyncs_log)))
                fakes.inject(4242, f"question {n}")
                wait_for(delivered(db, n + 1), f"message {n + 1} to be delivered")
                _settled(lambda: len(_lines(commits_log)))
                _settled(lambda: len(_fsyncs(fsyncs_log)))
                commits = _lines(commits_log)[commits_before:]
                fsyncs = _fsyncs(fsyncs_log)[fsyncs_before:]
                by_file = {k: 0 for k in ("wal", "db", "other")}
                for line in fsyncs:
                    by_file[_fsync_file(line)] += 1
                replies.append(
                    {
                        "commits": len(commits),
                        "commits_writing_rows": sum(int(c.split("\t")[2]) > 0 for c in commits),
                        "transactions": [
                            dict(zip(("thread", "tables", "rows"), c.split("\t"), strict=True))
                            for c in commits
                        ],
                        "fsyncs": len(fsyncs) if strace else None,
                        "fsyncs_by_file": by_file if strace else None,
                    }
                )
        finally:
            gateway.kill()
        duplicates = sum(n - 1 for n in sends_per_message(fakes).values())
    finally:
        fakes.stop()
    return {"messages": messages, "strace": strace, "replies": replies, "duplicates": duplicates}


# -- 2: turns per second -----------------------------------------------------------------------
def throughput(folder: Path, messages: int, chats: int, floor_rows: int) -> dict[str, Any]:
    before = floor(folder, floor_rows)
    fakes = Fakes(folder)
    try:
        config, db = write_config(folder, fakes, max_concurrent=chats)
        for n in range(messages):
            fakes.inject(5000 + n % chats, f"question {n}")
        gateway = Gateway(config, folder / "gateway.log")
        try:
            wait_for(delivered(db, messages), f"{messages} messages to be delivered", 600)
            seconds = time.time() - gateway.ready
        finally:
            gateway.kill()
        sends = sends_per_message(fakes)
        if len(sends) != messages:
            raise SystemExit(f"gateway bench: {len(sends)} of {messages} messages were answered")
    finally:
        fakes.stop()
    after = floor(folder, floor_rows)
    rate = messages / seconds
    floor_rate = (before + after) / 2
    return {
        "value": rate,
        "floor": floor_rate,
        "floors": [before, after],
        "seconds": seconds,
        "duplicates": sum(n - 1 for n in sends.values()),
    }


def sends_per_message(fakes: Fakes) -> dict[tuple[str, str], int]:
    """(chat, the user message answered) -> the bot messages sent in answer, from the journal."""
    sends: dict[tuple[str, str], int] = {}
    for entry in fakes.journal_entries():
        if entry.get("event") == "send":
            key = (str(entry["chat"]), str(entry["reply_to"]))
            sends[key] = sends.get(key, 0) + 1
    return sends


# -- 3: restart to the first recovered delivery --------------------------------------------------
def recovery(folder: Path, parked: int) -> dict[str, Any]:
    fakes = Fakes(folder)
    log = folder / "gateway.log"
    try:
        config, db = write_config(folder, fakes, max_concurrent=parked)
        chats = [6000 + n for n in range(parked)]
        fakes.control("fault", kind="hold", op="send", times=parked, hold_seconds=600)
        first = Gateway(config, log)
        for chat in chats:
            fakes.inject(chat, f"question for {chat}")

        def all_parked() -> bool:
            fired = [e for e in fakes.journal_entries() if e.get("event") == "fault"]
            return len(fired) == parked

        wait_for(all_parked, f"{parked} sends to be parked")
        first.kill()
        counts = inbound_counts(db)
        if counts.get("answered", 0) != parked:
            raise SystemExit(f"gateway bench: expected {parked} answered, undelivered: {counts}")
        fakes.control("release")  # the parked calls end unapplied; their clients are gone
        second = Gateway(config, log)
        spawn = second.started

        def recovered() -> list[float]:
            """When each chat first showed its answer (the fake's own time stamp)."""
            first_shown: dict[int, float] = {}
            for entry in fakes.journal_entries():
                if entry.get("event") == "send" and int(entry["chat"]) in chats:
                    first_shown.setdefault(int(entry["chat"]), float(entry["ts"]))
            return sorted(first_shown.values())

        wait_for(lambda: len(recovered()) == parked, f"{parked} recovered deliveries")
        wait_for(delivered(db, parked), "the store to show every recovered reply delivered")
        times = recovered()
        duplicates = sum(n - 1 for n in sends_per_message(fakes).values())
        recovering_ready = second.ready - spawn
        second.terminate()
        third = Gateway(config, log)  # the baseline: the same store, nothing left to do
        cold = third.ready - third.started
        third.terminate()
    finally:
        fakes.stop()
    return {
        "cold_start": cold,
        "first": times[0] - spawn,
        "last": times[-1] - spawn,
        "recovering_ready": recovering_ready,
        "duplicates": duplicates,
    }


# -- the run -----------------------------------------------------------------------------------
def _median(values: list[float]) -> float:
    return statistics.median(values)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(f"gateway bench: stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == TRACED:
        return traced_gateway(argv[1], argv[2:])
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Counting fsyncs needs strace (without it, or where ptrace is not allowed, "
        "fsyncs_per_reply is left out).",
    )
    parser.add_argument("--quick", action="store_true", help="fewer messages (a smoke run)")
    parser.add_argument("--rounds", type=int, help="rounds of figures 2 and 3 (3; 1 with --quick)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument(
        "--dir",
        type=Path,
        help="keep the files, in a new folder under DIR (default: a temporary one, deleted)",
    )
    args = parser.parse_args(argv)
    # SIGTERM unwinds like an error, so every gateway and fake this run started is stopped.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    sequential, messages, chats, parked, floor_rows = (
        (3, 24, 4, 3, 300) if args.quick else (10, 200, 8, 8, 2000)
    )
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        base = Path(tempfile.mkdtemp(prefix="oncewire-gateway-bench-", dir=args.dir))
    else:
        base = Path(tempfile.mkdtemp(prefix="oncewire-gateway-bench-"))
    try:
        print("commits and fsyncs per reply ...", file=sys.stderr, flush=True)
        (base / "per-reply").mkdir()
        counted = per_reply(base / "per-reply", sequential)
        flows: list[dict[str, Any]] = []
        recoveries: list[dict[str, Any]] = []
        for n in range(rounds):
            print(f"round {n + 1}: turns per second ...", file=sys.stderr, flush=True)
            folder = base / f"round{n}-throughput"
            folder.mkdir()
            flows.append(throughput(folder, messages, chats, floor_rows))
            print(f"round {n + 1}: restart after SIGKILL ...", file=sys.stderr, flush=True)
            folder = base / f"round{n}-recovery"
            folder.mkdir()
            recoveries.append(recovery(folder, parked))
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    figures = _figures(counted, flows, recoveries, messages, chats, parked)
    _print(figures, args.quick, rounds)
    if args.json:
        from oncewire import __version__

        document = {
            "version": __version__,
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "quick": args.quick,
            "rounds": rounds,
            "params": {
                "sequential_messages": sequential,
                "messages": messages,
                "chats": chats,
                "parked": parked,
                "floor_rows": floor_rows,
                "pragmas": {"journal_mode": "wal", "synchronous": "FULL"},
            },
            "fsyncs_counted_with": counted["strace"],
            "figures": figures,
            "per_reply": counted["replies"],
        }
        args.json.write_text(json.dumps(document, indent=2), encoding="utf-8")
    return 0


def _figures(
    counted: dict[str, Any],
    flows: list[dict[str, Any]],
    recoveries: list[dict[str, Any]],
    messages: int,
    chats: int,
    parked: int,
) -> dict[str, dict[str, Any]]:
    replies = counted["replies"]
    commits = [r["commits"] for r in replies]
    figures: dict[str, dict[str, Any]] = {
        "commits_per_reply": {
            "value": int(_median(commits)),
            "unit": "commits",
            "baseline": "design",
            "baseline_value": DESIGN_COMMITS,
            "ratio": _median(commits) / DESIGN_COMMITS,
            "rounds": commits,
            "what": (
                f"every COMMIT the gateway's SQLite connections ran (statement trace), "
                f"admission to delivered, {len(replies)} messages one at a time; median"
            ),
        }
    }
    if counted["strace"] is not None:
        fsyncs = [r["fsyncs"] for r in replies]
        figures["fsyncs_per_reply"] = {
            "value": int(_median(fsyncs)),
            "unit": "fsyncs",
            "baseline": "design",
            "baseline_value": DESIGN_COMMITS,
            "ratio": _median(fsyncs) / DESIGN_COMMITS,
            "rounds": fsyncs,
            "what": "fsync + fdatasync calls of the gateway process (strace -f), same messages",
        }
    floors = [f["floor"] for f in flows]
    figures["floor"] = {
        "value": _median(floors),
        "unit": "commits/s",
        "baseline": None,
        "baseline_value": None,
        "ratio": None,
        "rounds": floors,
        "what": "raw sqlite3, BEGIN IMMEDIATE; INSERT; COMMIT per row, before and after, mean",
    }
    rates = [f["value"] for f in flows]
    figures["turns_per_second"] = {
        "value": _median(rates),
        "unit": "turns/s",
        "baseline": "floor",
        "baseline_value": _median(floors),
        "ratio": _median([f["value"] / f["floor"] for f in flows]),
        "bound": 1 / DESIGN_COMMITS,
        "rounds": rates,
        "what": (
            f"{messages} messages across {chats} chats, max_concurrent={chats}, instant model, "
            "from ready until the store shows all delivered"
        ),
    }
    colds = [r["cold_start"] for r in recoveries]
    figures["cold_start"] = {
        "value": _median(colds),
        "unit": "s",
        "baseline": None,
        "baseline_value": None,
        "ratio": None,
        "rounds": colds,
        "what": "spawn to ready, same store, nothing pending (after the recovery)",
    }
    ready = [r["recovering_ready"] for r in recoveries]
    figures["ready_after_kill"] = {
        "value": _median(ready),
        "unit": "s",
        "baseline": "cold_start",
        "baseline_value": _median(colds),
        "ratio": _median([r["recovering_ready"] / r["cold_start"] for r in recoveries]),
        "rounds": ready,
        "what": f"spawn to ready after the SIGKILL ({parked} replies to recover: boot delivers)",
    }
    for name, key in (("recovery_first", "first"), ("recovery_last", "last")):
        values = [r[key] for r in recoveries]
        figures[name] = {
            "value": _median(values),
            "unit": "s",
            "baseline": "cold_start",
            "baseline_value": _median(colds),
            "ratio": _median([r[key] / r["cold_start"] for r in recoveries]),
            "rounds": values,
            "what": (
                f"spawn to the {key} of {parked} committed, undelivered replies in the fake's "
                "journal, after SIGKILL"
            ),
        }
    duplicates = [
        counted["duplicates"],
        *(f["duplicates"] for f in flows),
        *(r["duplicates"] for r in recoveries),
    ]
    figures["duplicate_sends"] = {
        "value": sum(duplicates),
        "unit": "messages",
        "baseline": None,
        "baseline_value": None,
        "ratio": None,
        "rounds": duplicates,
        "what": (
            "bot messages beyond one per user message in the fake's journals, over every run "
            "(per reply, then each round's turns/s and restart; should be 0)"
        ),
    }
    return figures


def _print(figures: dict[str, dict[str, Any]], quick: bool, rounds: int) -> None:
    from oncewire import __version__

    print(
        f"oncewire {__version__} gateway benchmark, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}, WAL + synchronous=FULL"
        f"{' (quick)' if quick else ''}, {rounds} round(s)"
    )
    header = f"{'figure':18} {'value':>9} {'unit':10} {'vs':11} {'ratio':>7} {'bound':>6}  what"
    print(header)
    print("-" * len(header))
    for name, f in figures.items():
        value = f["value"]
        shown = f"{value:d}" if isinstance(value, int) else f"{value:.3f}"
        vs = "(itself)" if f["baseline"] is None else f"{f['baseline']}"
        if f["baseline"] == "design":
            vs = f"design {f['baseline_value']}"
        ratio = "" if f["ratio"] is None else f"{f['ratio']:.3f}"
        bound = f"{f['bound']:.2f}" if "bound" in f else ""
        print(f"{name:18} {shown:>9} {f['unit']:10} {vs:11} {ratio:>7} {bound:>6}  {f['what']}")
    print(
        "value: the median over the rounds (counts: over the messages). ratio: value / baseline "
        "(for turns/s, the median of per-round ratios to the bracketing floor; higher is better; "
        "for times, lower is better). bound: 1 / the design's commits per turn."
    )


if __name__ == "__main__":
    sys.exit(main())
