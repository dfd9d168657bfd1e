#!/usr/bin/env python3
"""OpenAI Agents SDK benchmark: a scripted 10-step run, plain and durable, in one run.

    .venv/bin/python benchmarks/agents_bench.py [--quick | --smoke] [--rounds N] [--json FILE]
    .venv/bin/python benchmarks/agents_bench.py --pg postgresql://127.0.0.1:5432/test

The run: an agent whose model is the SDK's own ``agents.testing.ScriptedModel``, asking for a
no-op function tool at each of 10 steps, then answering (11 model responses, 10 tool calls).
It runs with the SDK's own ``Runner.run_sync`` and with ``oncewire.agents.run_sync`` (each run
under a new ``run_key`` on one ledger), and with ``Runner.run`` / ``oncewire.agents.run`` as
the async mode. The two alternate, a few runs at a time, so that a busy machine slows both
alike. Per mode and backend the table shows:

* steps/s of each (10 steps a run, over the median milliseconds per run) and their ratio
  (durable / plain: 1.0x would cost nothing);
* the added milliseconds per step (each step one model response recorded and one tool call
  performed through the ledger) and how many floor commits that is: the floor is
  ``runs_bench``'s, one raw INSERT + COMMIT per transaction on the same disk (WAL,
  ``synchronous=FULL``) or the same PostgreSQL server, measured in the same round.

Progress goes to stderr, the table to stdout. Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
try:
    import oncewire
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(HERE.parent / "src"))
    import oncewire

from agents import Agent, Runner, function_tool, set_tracing_disabled  # noqa: E402
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call  # noqa: E402

from oncewire import agents as durable  # noqa: E402
from oncewire.ledger import Ledger  # noqa: E402

sys.path.insert(0, str(HERE))
from runs_bench import Target, measure_floor  # noqa: E402

set_tracing_disabled(True)

STEPS = 10  # model steps asking for the tool, then one answer
RUNS = 30  # runs of each, per mode and round
CHUNK = 5  # runs of one before the other's, in turn
FLOOR_CHUNK = 50  # floor commits per measurement
MODES = ("sync", "async")


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@function_tool
def noop(n: int) -> int:
    """Do nothing, and say so."""
    return n


def _agent() -> Agent[Any]:
    def answer(call: Any) -> Any:
        items = call.input if isinstance(call.input, list) else []
        done = sum(
            1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
        )
        if done < STEPS:
            return [function_call("noop", {"n": done}, call_id=f"call-{done}")]
        return [assistant_message(f"{done} steps")]

    model = ScriptedModel([ModelStep.respond(answer) for _ in range(STEPS + 1)])
    return Agent(name="bench", instructions="Step.", model=model, tools=[noop])


def _plain(mode: str, ledger: Ledger) -> Any:
    if mode == "sync":
        return Runner.run_sync(_agent(), "go", max_turns=STEPS + 2).final_output
    return asyncio.run(Runner.run(_agent(), "go", max_turns=STEPS + 2)).final_output


def _durable(mode: str, ledger: Ledger) -> Any:
    key = uuid.uuid4().hex
    if mode == "sync":
        return durable.run_sync(
            _agent(), "go", ledger=ledger, run_key=key, max_turns=STEPS + 2
        ).final_output
    return asyncio.run(
        durable.run(_agent(), "go", ledger=ledger, run_key=key, max_turns=STEPS + 2)
    ).final_output


def _timed(run: Callable[[str, Ledger], Any], mode: str, ledger: Ledger) -> float:
    started = time.perf_counter()
    output = run(mode, ledger)
    took = (time.perf_counter() - started) * 1000
    if output != f"{STEPS} steps":
        raise RuntimeError(f"the run answered {output!r}")
    return took


def one_round(where: Path | str, mode: str, runs: int) -> dict[str, float]:
    """One round of one mode: plain and durable runs in turn, then the floor beside them."""
    floor = measure_floor(
        where if isinstance(where, str) else where.parent / "floor.db", FLOOR_CHUNK
    )
    floor_s: list[float] = []
    got: dict[str, list[float]] = {"plain": [], "durable": []}
    with Ledger(str(where)) as ledger:
        for _ in range(2):  # warm up: the SDK's first run, the dispatcher's first start
            _timed(_plain, mode, ledger), _timed(_durable, mode, ledger)
        done = 0
        while done < runs:
            floor_s.append(next(floor) / FLOOR_CHUNK)
            for _ in range(min(CHUNK, runs - done)):
                got["plain"].append(_timed(_plain, mode, ledger))
            for _ in range(min(CHUNK, runs - done)):
                got["durable"].append(_timed(_durable, mode, ledger))
            done += CHUNK
        floor_s.append(next(floor) / FLOOR_CHUNK)
    floor.close()
    plain_ms, durable_ms = statistics.median(got["plain"]), statistics.median(got["durable"])
    floor_ms = statistics.median(floor_s) * 1000
    added = (durable_ms - plain_ms) / STEPS
    return {
        "plain_ms": plain_ms,
        "durable_ms": durable_ms,
        "plain_steps_per_s": STEPS * 1000 / plain_ms,
        "durable_steps_per_s": STEPS * 1000 / durable_ms,
        "ratio": durable_ms / plain_ms,
        "added_ms_per_step": added,
        "floor_commit_ms": floor_ms,
        "added_floor_commits_per_step": added / floor_ms,
    }


def measure(target: Target, rounds: int, runs: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for mode in MODES:
        per: list[dict[str, float]] = []
        for r in range(rounds):
            where = target(f"agents-{mode}-{r}")
            figure = one_round(where, mode, runs)
            per.append(figure)
            progress(
                f"[{target.backend} {mode} round {r + 1}/{rounds}] plain "
                f"{figure['plain_steps_per_s']:,.0f} steps/s, durable "
                f"{figure['durable_steps_per_s']:,.0f} steps/s ({figure['ratio']:.2f}x), "
                f"+{figure['added_ms_per_step']:.2f} ms a step, floor commit "
                f"{figure['floor_commit_ms']:.2f} ms"
            )
        figures[mode] = {name: statistics.median(f[name] for f in per) for name in per[0]}
        figures[mode]["ratios"] = [f["ratio"] for f in per]
    return {"backend": target.backend, "runs_per_round": runs, "figures": figures}


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"{'backend':<11} {'mode':<6} {'plain steps/s':>13} {'durable steps/s':>15} "
        f"{'slowdown':>9} {'+ms/step':>9} {'floor ms':>9} {'floor commits':>14}"
    ]
    for result in results:
        for mode, f in result["figures"].items():
            lines.append(
                f"{result['backend']:<11} {mode:<6} {f['plain_steps_per_s']:>13,.0f} "
                f"{f['durable_steps_per_s']:>15,.0f} {f['ratio']:>8.2f}x "
                f"{f['added_ms_per_step']:>9.2f} {f['floor_commit_ms']:>9.2f} "
                f"{f['added_floor_commits_per_step']:>14.1f}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help=f"{RUNS // 3} runs a round")
    parser.add_argument("--smoke", action="store_true", help="one round of 2 runs: seconds")
    parser.add_argument("--pg", metavar="URL", help="also PostgreSQL, on this server")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON here too")
    parser.add_argument("--dir", help="where the SQLite files go (default: a temporary folder)")
    args = parser.parse_args(argv)
    runs = 2 if args.smoke else RUNS // 3 if args.quick else RUNS
    rounds = 1 if args.smoke else args.rounds
    results = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        results.append(measure(Target(Path(tmp), None), rounds, runs))
        if args.pg:
            target = Target(Path(tmp), args.pg)
            try:
                results.append(measure(target, rounds, runs))
            finally:
                target.drop()
    print("\n".join(table(results)))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "benchmark": "agents",
                    "when": datetime.datetime.now(datetime.UTC).isoformat(),
                    "oncewire": oncewire.__version__,
                    "python": platform.python_version(),
                    "steps_per_run": STEPS,
                    "rounds": rounds,
                    "results": results,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
