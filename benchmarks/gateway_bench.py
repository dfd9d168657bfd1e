#!/usr/bin/env python3
"""The gateway end to end, as real processes, every figure against a baseline of the same run.

    .venv/bin/python benchmarks/gateway_bench.py [--quick] [--rounds N] [--json FILE] [--dir DIR]
        [--src OTHER/src]

``--src`` runs the gateway and the fakes from another oncewire tree (a checkout of an earlier
version, for a before/after on one machine: compare the ratios, which are to the same floor).

``oncewire gateway run`` runs as its own process against the fake Telegram Bot API and the fake
OpenAI-compatible server (``python -m oncewire.testing.telegram_api`` and ``...openai_api``, each a
process too), on a SQLite file in WAL mode with ``synchronous=FULL``. The model answers at once
with a short text; the platform does not stream (one send per reply). The measurements:

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
* ``turns_per_s_backlog`` and ``backlog_vs_empty``: the same workload on a store that already
  holds 10,000 handled messages (delivered, with their delivered replies, in chats of their
  own), against the floor, and against the empty store of the same round: 1.0 says the
  scheduler and the reply thread read only what they may start, whatever the history.
* ``turn_latency_p50``, ``_p90``, ``_p99``: a turn's added latency at low load, messages sent
  one at a time (each in a chat of its own, waited for until delivered), from T1's commit (the
  admission's ``created_at``) to the first send reaching the fake (the time it stamped), with
  an instant model; against one raw commit of the same round.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from gateway_rig import (  # noqa: E402
    Fakes,
    Gateway,
    admitted_and_first_sent,
    delivered,
    floor,
    inbound_counts,
    prefill,
    sends_per_message,
    use_source,
    wait_for,
    write_config,
)

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
def throughput(
    folder: Path, messages: int, chats: int, floor_rows: int, backlog: int = 0
) -> dict[str, Any]:
    before = floor(folder, floor_rows)
    fakes = Fakes(folder)
    try:
        config, db = write_config(folder, fakes, max_concurrent=chats)
        if backlog:
            prefill(db, backlog)
        for n in range(messages):
            fakes.inject(5000 + n % chats, f"question {n}")
        gateway = Gateway(config, folder / "gateway.log")
        try:
            wait_for(delivered(db, messages + backlog), f"{messages} messages to be delivered", 600)
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


# -- 2b: a turn's added latency at low load ------------------------------------------------
def latency(folder: Path, messages: int, floor_rows: int) -> dict[str, Any]:
    """``messages`` messages one at a time, each in a chat of its own, each waited for until
    the store shows it delivered: admission (T1's commit) to the first send reaching the
    fake, with an instant model. Against one raw commit, measured before and after."""
    before = floor(folder, floor_rows)
    fakes = Fakes(folder)
    try:
        config, db = write_config(folder, fakes, max_concurrent=4)
        gateway = Gateway(config, folder / "gateway.log")
        try:
            for n in range(messages):
                fakes.inject(7000 + n, f"question {n}")
                wait_for(delivered(db, n + 1), f"message {n + 1} to be delivered", every=0.002)
        finally:
            gateway.kill()
        pairs = admitted_and_first_sent(db, fakes)
        if len(pairs) != messages:
            raise SystemExit(f"gateway bench: {len(pairs)} of {messages} messages were answered")
    finally:
        fakes.stop()
    after = floor(folder, floor_rows)
    seconds = sorted(sent - admitted for admitted, sent in pairs)
    return {"seconds": seconds, "floor": (before + after) / 2}


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


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
        "--src",
        type=Path,
        help="run the gateway and the fakes from the oncewire in this src directory (another "
        "version's, for a before/after; default: this checkout's)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        help="keep the files, in a new folder under DIR (default: a temporary one, deleted)",
    )
    args = parser.parse_args(argv)
    # SIGTERM unwinds like an error, so every gateway and fake this run started is stopped.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.src is not None:
        use_source(args.src)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    sequential, messages, chats, parked, floor_rows, single, backlog = (
        (3, 24, 4, 3, 300, 20, 2000) if args.quick else (10, 200, 8, 8, 2000, 100, 10_000)
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
        backlogged: list[dict[str, Any]] = []
        latencies: list[dict[str, Any]] = []
        recoveries: list[dict[str, Any]] = []
        for n in range(rounds):
            print(f"round {n + 1}: turns per second ...", file=sys.stderr, flush=True)
            folder = base / f"round{n}-throughput"
            folder.mkdir()
            flows.append(throughput(folder, messages, chats, floor_rows))
            print(
                f"round {n + 1}: turns per second over {backlog} handled messages ...",
                file=sys.stderr,
                flush=True,
            )
            folder = base / f"round{n}-backlog"
            folder.mkdir()
            backlogged.append(throughput(folder, messages, chats, floor_rows, backlog))
            print(f"round {n + 1}: a turn's latency at low load ...", file=sys.stderr, flush=True)
            folder = base / f"round{n}-latency"
            folder.mkdir()
            latencies.append(latency(folder, single, floor_rows))
            print(f"round {n + 1}: restart after SIGKILL ...", file=sys.stderr, flush=True)
            folder = base / f"round{n}-recovery"
            folder.mkdir()
            recoveries.append(recovery(folder, parked))
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    figures = _figures(counted, flows, recoveries, messages, chats, parked)
    figures.update(_more_figures(flows, backlogged, latencies, messages, chats, single, backlog))
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
                "latency_messages": single,
                "backlog": backlog,
                "source": str(args.src) if args.src else "this checkout",
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


def _more_figures(
    flows: list[dict[str, Any]],
    backlogged: list[dict[str, Any]],
    latencies: list[dict[str, Any]],
    messages: int,
    chats: int,
    single: int,
    backlog: int,
) -> dict[str, dict[str, Any]]:
    """The backlog's turns/s (against the floor, and against the empty store of the same round)
    and a turn's added latency (against one raw commit of the same round)."""
    rates = [f["value"] for f in backlogged]
    pairs = list(zip(backlogged, flows, strict=True))
    figures: dict[str, dict[str, Any]] = {
        "turns_per_s_backlog": {
            "value": _median(rates),
            "unit": "turns/s",
            "baseline": "floor",
            "baseline_value": _median([f["floor"] for f in backlogged]),
            "ratio": _median([f["value"] / f["floor"] for f in backlogged]),
            "rounds": rates,
            "what": (
                f"as turns_per_second, over {backlog} handled (delivered) messages and replies "
                "in other chats"
            ),
        },
        "backlog_vs_empty": {
            "value": _median([b["value"] / f["value"] for b, f in pairs]),
            "unit": "x",
            "baseline": "turns/s",
            "baseline_value": None,
            "ratio": _median(
                [(b["value"] / b["floor"]) / (f["value"] / f["floor"]) for b, f in pairs]
            ),
            "rounds": [b["value"] / f["value"] for b, f in pairs],
            "what": (
                f"turns_per_s_backlog / turns_per_second, same round ({messages} messages, "
                f"{chats} chats); ratio: of their floor ratios; 1.0 is backlog-independent"
            ),
        },
    }
    for name, share in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        values = [_percentile(item["seconds"], share) for item in latencies]
        commit = _median([1.0 / item["floor"] for item in latencies])
        figures[f"turn_latency_{name}"] = {
            "value": _median(values),
            "unit": "s",
            "baseline": "one commit",
            "baseline_value": commit,
            "ratio": _median([_percentile(i["seconds"], share) * i["floor"] for i in latencies]),
            "rounds": values,
            "what": (
                f"admission (T1 committed) to the first send in the fake, {single} messages one "
                f"at a time, instant model; {name}; ratio in raw commits of the same round"
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
    header = f"{'figure':20} {'value':>9} {'unit':10} {'vs':11} {'ratio':>7} {'bound':>6}  what"
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
        print(f"{name:20} {shown:>9} {f['unit']:10} {vs:11} {ratio:>7} {bound:>6}  {f['what']}")
    print(
        "value: the median over the rounds (counts: over the messages). ratio: value / baseline "
        "(for turns/s, the median of per-round ratios to the bracketing floor; higher is better; "
        "for times, lower is better). bound: 1 / the design's commits per turn."
    )


if __name__ == "__main__":
    sys.exit(main())
