"""Suite ``mcp``: ``oncewire mcp proxy`` and its server SIGKILLed under an SDK client's calls.

Each scenario runs the client of :mod:`oncewire.lab.children.mcp_client` (the official SDK's
``ClientSession`` over ``stdio_client``) on stores of its own: the client starts the proxy as a
real child process (``--db`` the scenario's caller store, on the lab's backend), which starts
one of the lab's servers (:mod:`oncewire.lab.children.mcp_servers`) as its own child, and calls
``create_ticket`` a few times, each call with its key in
``params._meta["io.oncewire/idempotency-key"]``, retrying it with that key through a new proxy
until it is answered. Three servers:

* ``tickets``: oncewire-aware (``oncewire.mcp.once`` over ``Receipts`` on the downstream
  store, declaring ``io.oncewire/deduplicates``): the proxy redelivers a call whose outcome it
  does not know, flagged, and the client repeats a call until it succeeds;
* ``log``: plain (one fsynced JSON line per execution): the proxy never runs a call again, and
  answers "outcome unknown" where it cannot know; that answer is final for the client;
* ``log+redeliver``: the plain server behind ``--redeliver create_ticket``: the proxy runs a
  call again where it does not know, and the server sees the flag.

The scenarios:

* ``proxy[POINT][SERVER]``: every registered crash point of the proxy (``mcp.proxy.*``, from
  the registry: a new one joins the matrix) armed in the first proxy, fired once, on the first
  call (``log+redeliver`` only at ``mcp.proxy.after_forward``, the one window where the call
  ran and nobody knows: the default matrix is kept small);
* ``server[POINT][tickets]``: the tickets server killed by its receipts' crash points, before
  the body's writes and receipt commit and between that commit and its answer;
* ``random[SERVER]``: one call's answer dropped between the proxy and the client (the client
  gives up on it and retries), then ``--kills`` SIGKILLs (3 by default) of the proxy, the
  server or both, each while a call is in flight, a seeded random fraction of a clean call's
  latency after it was sent.

The invariants, read from the stores and the server's log (not from what the proxy says):
one effect per key, every one ended; on ``tickets`` every call performed exactly once (one
ticket row and one receipt under its key, every later run of the body flagged) and answered
with its one result (every success the client got carries that row's id); on the plain
server every execution after a call's first flagged (none at all without ``--redeliver``), no
success answered for a call that did not run (each success names the pid of a logged
execution of that call, and every ``done`` effect has one), an error answer only for a call
whose effect did not end ``done``, and no execution of a call nobody made. Without the
``mcp`` extra the suite is one scenario reported not applicable.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

from oncewire.core import crash, extras
from oncewire.core.errors import MissingExtra
from oncewire.lab.fixtures import StorePair, rows
from oncewire.lab.framework import LabContext, ProcessRecord, ScenarioResult, Suite

__all__ = [
    "CLIENT",
    "MODES",
    "SUITE",
    "default_cells",
    "missing_mcp_extra",
    "proxy_points",
    "run_cells",
    "run_mcp",
]

CLIENT = "oncewire.lab.children.mcp_client"
SERVER_NAMES = {"tickets": "oncewire-lab-tickets", "log": "oncewire-lab-log"}
SERVER_POINTS = ("receipts.after_work_before_commit", "receipts.after_commit_before_reply")
REDELIVER_POINTS = ("mcp.proxy.after_forward",)
RANDOM_KILLS = 3
POINT_CALLS = 2  # the first call meets the crash point; the second goes through the new proxy
CLIENT_DEADLINE_SECONDS = 600.0
VICTIMS = ("proxy", "server", "both")
MODES = ("tickets", "log", "log+redeliver")


def proxy_points() -> list[str]:
    """The proxy's registered crash points."""
    import oncewire.mcp.proxy_calls  # noqa: F401  (importing registers them)

    return [name for name in crash.registry() if name.startswith("mcp.proxy.")]


def _server(mode: str) -> str:
    return mode.partition("+")[0]


class _Scenario:
    """One scenario's stores, its client's run, and what the stores hold afterwards."""

    def __init__(self, ctx: LabContext, result: ScenarioResult, folder: str, mode: str) -> None:
        self.ctx = ctx
        self.result = result
        self.mode = mode
        self.server = _server(mode)
        self.pair: StorePair = ctx.stores("mcp", folder)
        self.folder = ctx.root / "mcp" / folder
        self.token = self.folder / "crash.token"
        self.response: dict[str, Any] = {}

    def run(self, prefix: str, calls: int, *extra: str) -> ProcessRecord:
        args = [
            "--folder", str(self.folder), "--caller", self.pair.caller,
            "--downstream", self.pair.downstream, "--server", self.server,
            "--calls", str(calls), "--prefix", prefix, "--token", str(self.token), *extra,
        ]  # fmt: skip
        if self.mode.endswith("+redeliver"):
            args.append("--redeliver")
        record = self.ctx.child(
            "run", args, module=CLIENT, deadline_seconds=CLIENT_DEADLINE_SECONDS
        )
        self.result.processes.append(record)
        ok = record.exit_code == 0 and isinstance(record.response, dict)
        self.result.require(ok, f"the client failed ({record.exit_code}): {record.stderr[-600:]}")
        self.response = record.response if ok else {}
        return record

    def fired(self) -> str | None:
        """The point that fired, as its token says (None if none did)."""
        if not self.token.exists():
            return None
        return self.token.read_text(encoding="utf-8").split()[0]

    # -- what the stores hold --------------------------------------------------------------
    def effects(self) -> list[dict[str, Any]]:
        return rows(
            self.pair.dialect,
            self.pair.caller,
            "SELECT key, kind, state, attempts, maybe_sent, result, last_error "
            "FROM oncewire_effects ORDER BY key",
        )

    def downstream(self, sql: str) -> list[dict[str, Any]]:
        return rows(self.pair.dialect, self.pair.downstream, sql)

    def lines(self, name: str) -> list[dict[str, Any]]:
        path = self.folder / name
        if not path.exists():
            return []
        text = path.read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def _answers(call: dict[str, Any]) -> list[dict[str, Any]]:
    return [a["answer"] for a in call["attempts"] if a.get("answer") is not None]


def _check(scenario: _Scenario) -> dict[str, Any]:
    """Check the invariants of the scenario's server; its summary."""
    result = scenario.result
    calls: list[dict[str, Any]] = scenario.response.get("calls", [])
    keys = [c["key"] for c in calls]
    effects = {e["key"]: e for e in scenario.effects()}
    kind = f"mcp.{SERVER_NAMES[scenario.server]}.create_ticket"
    result.require(sorted(effects) == sorted(keys), f"effects {sorted(effects)} for calls {keys}")
    result.require(
        all(e["kind"] == kind for e in effects.values()), f"an effect not of kind {kind}"
    )
    unended = sorted(k for k, e in effects.items() if e["state"] not in TERMINAL)
    result.require(not unended, f"effects not ended: {unended}")
    for call in calls:
        result.require(call["final"] is not None, f"{call['key']} never answered")
    summary: dict[str, Any] = {
        "backend": scenario.pair.dialect,
        "server": scenario.mode,
        "calls": len(calls),
        "proxy_starts": scenario.response.get("proxy_starts", 0),
        "dropped": sum(
            1 for c in calls for a in c["attempts"] if a.get("what") == "answer dropped"
        ),
    }
    if scenario.server == "tickets":
        summary.update(_check_tickets(scenario, calls, effects))
    else:
        summary.update(_check_log(scenario, calls, effects))
    result.after = {
        "effects": list(effects.values()),
        "client": scenario.response,
    }
    return summary


TERMINAL = ("done", "rejected", "dead", "cancelled")


def _check_tickets(
    scenario: _Scenario, calls: list[dict[str, Any]], effects: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    result = scenario.result
    tickets = scenario.downstream("SELECT id, operation_id, redelivery FROM tickets ORDER BY id")
    receipts = scenario.downstream("SELECT key, result FROM oncewire_receipts ORDER BY key")
    bodies = scenario.lines("bodies.jsonl")
    keys = [c["key"] for c in calls]
    per_key: dict[str, list[dict[str, Any]]] = {}
    for row in tickets:
        per_key.setdefault(row["operation_id"], []).append(row)
    result.require(sorted(per_key) == sorted(keys), f"tickets for {sorted(per_key)}, not {keys}")
    result.require(
        sorted(r["key"] for r in receipts) == sorted(keys),
        f"receipts {[r['key'] for r in receipts]}, not one per call",
    )
    runs: dict[str, list[bool]] = {}
    for line in bodies:
        runs.setdefault(line["key"], []).append(bool(line["redelivery"]))
    for call in calls:
        key = call["key"]
        rows_for = per_key.get(key, [])
        result.require(len(rows_for) == 1, f"{key}: {len(rows_for)} tickets, not one")
        result.require(effects.get(key, {}).get("state") == "done", f"{key}: effect not done")
        flags = runs.get(key, [])
        result.require(bool(flags), f"{key}: the body never ran")
        result.require(all(flags[1:]), f"{key}: the body ran again unflagged: {flags}")
        if len(rows_for) != 1:
            continue
        ticket = rows_for[0]["id"]
        final = call["final"] or {}
        named = (final.get("structured") or {}).get("ticket_id")
        result.require(
            not final.get("is_error") and named == ticket,
            f"{key}: answered {final}, not its ticket {ticket}",
        )
        for answer in _answers(call):
            if not answer["is_error"]:
                got = (answer.get("structured") or {}).get("ticket_id")
                result.require(got == ticket, f"{key}: a success naming ticket {got}, not {ticket}")
    return {
        "tickets": len(tickets),
        "receipts": len(receipts),
        "duplicates": len(tickets) - len(per_key),
        "body_runs": len(bodies),
        "flagged": sum(1 for line in bodies if line["redelivery"]),
    }


def _check_log(
    scenario: _Scenario, calls: list[dict[str, Any]], effects: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    result = scenario.result
    redeliver = scenario.mode.endswith("+redeliver")
    lines = scenario.lines("calls.jsonl")
    keys = {c["key"] for c in calls}
    ran: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        ran.setdefault(line["key"], []).append(line)
    invented = sorted(set(ran) - keys)
    result.require(not invented, f"executions of calls nobody made: {invented}")
    unknown = 0
    for call in calls:
        key = call["key"]
        executions = ran.get(key, [])
        flags = [line["redelivery"] for line in executions]
        result.require(all(flags[1:]), f"{key}: an extra execution unflagged: {flags}")
        if not redeliver:
            result.require(len(executions) <= 1, f"{key}: run {len(executions)} times")
            result.require(not any(flags), f"{key}: flagged with nothing redelivered")
        pids = {line["pid"] for line in executions}
        state = effects.get(key, {}).get("state")
        if state == "done":
            result.require(bool(executions), f"{key}: recorded done and never ran")
        for answer in _answers(call):
            if answer["is_error"]:
                # Without --redeliver an error answer is final: the call must not be done.
                # With it, "outcome unknown" while the call stays recorded is provisional: a
                # later proxy redelivers it (flagged), and the client asks again.
                result.require(
                    redeliver or state != "done", f"{key}: an error answer for a done call"
                )
                continue
            named = answer["text"].rpartition(" ")[2]
            result.require(
                named.isdigit() and int(named) in pids,
                f"{key}: answered {answer['text']!r} with no such execution (pids {pids})",
            )
        final = call["final"] or {}
        unknown += bool(final.get("is_error"))
    return {
        "executions": len(lines),
        "duplicates": len(lines) - len(ran),
        "flagged": sum(1 for line in lines if line["redelivery"]),
        "unknown": unknown,
    }


def _timed(result: ScenarioResult, started: float) -> ScenarioResult:
    result.duration_seconds = time.monotonic() - started
    return result


def _armed(ctx: LabContext, side: str, point: str, mode: str) -> ScenarioResult:
    started = time.monotonic()
    result = ScenarioResult(f"{side}[{point}][{mode}]")
    scenario = _Scenario(ctx, result, f"{side}-{point}-{mode}", mode)
    flag = "--proxy-arm" if side == "proxy" else "--server-arm"
    scenario.run(f"{side}/{point}", POINT_CALLS, flag, point)
    fired = scenario.fired()
    result.require(fired == point, f"{point} did not fire (token: {fired})")
    summary = _check(scenario)
    result.summary = {"point": point, **summary}
    return _timed(result, started)


def _random(ctx: LabContext, mode: str) -> ScenarioResult:
    started = time.monotonic()
    result = ScenarioResult(f"random[{mode}]")
    scenario = _Scenario(ctx, result, f"random-{mode}", mode)
    rng = random.Random(f"mcp/{ctx.seed}/{mode}")
    kills = RANDOM_KILLS if ctx.options.get("kills") is None else int(ctx.options["kills"])
    # Calls 0 and 1 are clean (the second's latency times the kills), call 2's answer is
    # dropped, then a kill a call, and one clean call last through the proxy that answered.
    extra = ["--drop", "2"]
    plan = []
    for number in range(3, 3 + kills):
        victim = rng.choice(VICTIMS)
        fraction = round(rng.uniform(0.0, 1.5), 3)
        plan.append({"call": number, "victim": victim, "fraction": fraction})
        extra += ["--kill", f"{number}:{victim}:{fraction}"]
    scenario.run("random", 4 + kills, *extra)
    result.details = {"plan": plan}
    summary = _check(scenario)
    done_kills = scenario.response.get("kills", [])
    result.require(len(done_kills) == kills, f"{len(done_kills)} kills made, not {kills}")
    summary["kills"] = sum(1 for k in done_kills if any(k["killed"]))
    summary["kills_in_flight"] = sum(1 for k in done_kills if k["in_flight"])
    summary["victims"] = ",".join(k["victim"] for k in done_kills)
    result.require(summary["dropped"] == 1, f"{summary['dropped']} answers dropped, not one")
    result.summary = summary
    return _timed(result, started)


def missing_mcp_extra(feature: str) -> MissingExtra | None:
    """What ``feature`` would raise for the ``mcp`` extra's missing modules; None if none."""
    missing = extras.missing("mcp")
    return MissingExtra(feature, "mcp", missing) if missing else None


def default_cells() -> list[tuple[str, str, str]]:
    """The armed scenarios of a default run: (side, point, server)."""
    cells: list[tuple[str, str, str]] = []
    for mode in ("tickets", "log"):
        cells += [("proxy", point, mode) for point in proxy_points()]
    cells += [("server", point, "tickets") for point in SERVER_POINTS]
    cells += [("proxy", point, "log+redeliver") for point in REDELIVER_POINTS]
    return cells


def run_cells(
    ctx: LabContext, cells: Sequence[tuple[str, str, str]], random_modes: Sequence[str]
) -> Iterator[ScenarioResult]:
    """The armed scenarios ``cells``, then a random scenario per server in ``random_modes``."""
    for side, point, mode in cells:
        ctx.progress.update(f"mcp: {side} {point} {mode}")
        yield _armed(ctx, side, point, mode)
    for mode in random_modes:
        ctx.progress.update(f"mcp: random kills {mode}")
        yield _random(ctx, mode)


def run_mcp(ctx: LabContext) -> Iterator[ScenarioResult]:
    missing = missing_mcp_extra("the mcp suite")
    if missing is not None:
        result = ScenarioResult("mcp")
        result.skipped = str(missing)
        yield result
        return
    yield from run_cells(ctx, default_cells(), MODES)


SUITE = Suite(
    "mcp",
    "an SDK client's calls through oncewire mcp proxy, the proxy and its server SIGKILLed at "
    "each of the proxy's crash points, the server's, and at random, answers dropped",
    run_mcp,
    key_numbers=(
        "backend",
        "point",
        "server",
        "calls",
        "proxy_starts",
        "kills",
        "kills_in_flight",
        "dropped",
        "tickets",
        "executions",
        "duplicates",
        "flagged",
        "unknown",
    ),
)
