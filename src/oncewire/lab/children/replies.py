"""The replies suite's application process: ``python -m oncewire.lab.children.replies ...``.

It plays a chat application around the reply engine, on the rig in ``--directory``: boot
recovery (deliver what is committed, list what is unanswered), admit the inbound message (a
re-delivery after a restart is recognised and not processed twice), then answer every
unanswered message with the scripted text of its answer id (streamed or not). The lab kills it
with SIGKILL (at an armed crash point, or while the fake platform parks an operation) and
starts it again on the same directory. It prints one JSON object.

``many --seed S --count N`` does the same for N inbound messages of a seeded run (platforms,
streaming modes, sizes and a few wire faults drawn from the seed), for random kills.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from oncewire.core import crash
from oncewire.core.clock import SystemClock
from oncewire.lab.suites.replies_rig import LONG_BODY, PROFILES, Rig, footer, reply_text
from oncewire.testing.fake_platform import Fault

BODIES = {"short": "the answer, computed before the crash.", "long": LONG_BODY}


def answer(
    folder: Path,
    *,
    db: str | None = None,
    platform: str,
    chat: str,
    message_id: str,
    aid: str,
    size: str,
    mode: str,
    faults: list[Fault],
) -> dict[str, Any]:
    with Rig(folder, clock=SystemClock(), faults=faults, inline_wait_max_seconds=2.0, db=db) as rig:
        rig.engine.backoff_base_seconds = 0.01
        report = rig.engine.recover()
        admission = rig.admit(platform, chat, message_id)
        answered = []
        for inbound_id in sorted(set(report.unanswered) | {admission.inbound.id}):
            inbound = rig.ledger.inbound.get(inbound_id)
            if inbound.status.value not in ("received", "answering"):
                continue
            if rig.ledger.inbound.start(inbound_id) is None:
                continue  # quarantined: it kept killing the process that answered it
            result = rig.answer(inbound_id, reply_text(aid, BODIES[size]), mode)
            answered.append({"inbound": inbound_id, "status": result.status})
        rig.settle()
        return {
            "new": admission.new,
            "deliveries": admission.inbound.deliveries,
            "recovery": report.as_dict(),
            "answered": answered,
        }


def spec(seed: int, index: int) -> dict[str, str]:
    """What the application answers to inbound ``index`` of a seeded run: where and how."""
    rng = random.Random(f"replies/{seed}/{index}")
    platform = rng.choice(sorted(PROFILES))
    return {
        "platform": platform,
        "chat": f"t-{index}",
        "message_id": f"in-{index}",
        "aid": f"A-{index}",
        "mode": rng.choice(["off", "one", "two", "many"]),
        "size": "long" if rng.random() < 0.25 else "short",
    }


def seeded_faults(seed: int, count: int) -> list[Fault]:
    """A few wire faults among the seeded run's replies (named, so each fires once in all)."""
    faults = []
    for index in range(count):
        kind = random.Random(f"replies-fault/{seed}/{index}").choice(
            [None, None, "timeout", "ack_lost", "rate_limit", "conn_error"]
        )
        if kind is not None:
            faults.append(
                Fault(kind, contains=footer(f"A-{index}"), retry_after=0.05, name=f"f{index}")
            )
    return faults


def many(folder: Path, *, seed: int, count: int, db: str | None = None) -> dict[str, Any]:
    faults = seeded_faults(seed, count)
    with Rig(folder, clock=SystemClock(), faults=faults, inline_wait_max_seconds=2.0, db=db) as rig:
        rig.engine.backoff_base_seconds = 0.01
        report = rig.engine.recover()
        answered = 0
        for index in range(count):
            item = spec(seed, index)
            admission = rig.admit(item["platform"], item["chat"], item["message_id"])
            if admission.inbound.status.value not in ("received", "answering"):
                continue
            # The lab's kills are not caused by the messages: do not quarantine them for it.
            if rig.ledger.inbound.start(admission.inbound.id, max_starts=1_000) is None:
                continue
            text = reply_text(item["aid"], BODIES[item["size"]])
            rig.answer(admission.inbound.id, text, item["mode"])
            answered += 1
        rig.settle()
        return {"recovery": report.as_dict(), "answered": answered}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oncewire.lab.children.replies")
    parser.add_argument("role", choices=["answer", "many"])
    parser.add_argument("--directory", type=Path, required=True)
    parser.add_argument("--db", help="the application's store (default: DIRECTORY/app.db)")
    parser.add_argument("--platform")
    parser.add_argument("--chat")
    parser.add_argument("--message-id")
    parser.add_argument("--aid")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--size", choices=sorted(BODIES), default="short")
    parser.add_argument("--mode", choices=["off", "one", "two", "many"], default="off")
    parser.add_argument("--fault", action="append", default=[], help="JSON object of a Fault")
    args = parser.parse_args(argv)
    import oncewire.replies  # noqa: F401  (registers the replies crash points)

    crash.check_armed()
    if args.role == "many":
        result = many(args.directory, seed=args.seed, count=args.count, db=args.db)
        print(json.dumps(result, sort_keys=True))
        return 0
    if None in (args.platform, args.chat, args.message_id, args.aid):
        parser.error("answer needs --platform, --chat, --message-id and --aid")
    faults = [Fault(**json.loads(item)) for item in args.fault]
    result = answer(
        args.directory,
        db=args.db,
        platform=args.platform,
        chat=args.chat,
        message_id=args.message_id,
        aid=args.aid,
        size=args.size,
        mode=args.mode,
        faults=faults,
    )
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
